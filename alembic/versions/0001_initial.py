"""Initial schema: sources, documents, chunks, embedding cache, BM25 vocabulary and statistics.

BM25 lives entirely in Postgres with nothing beyond pgvector, so it runs on managed Postgres too:
- `chunks.tsv` holds the chunk's lexemes (Postgres text search tokenises and stems); a GIN index finds candidates.
- `lexemes` is the vocabulary with each term's document frequency; `corpus_stats` holds N and the total length.
  Statement-level triggers on `chunks` keep both exact as chunks are inserted and deleted (also by cascades).
- `chunks.bm25` is a sparsevec of document-side weights tf·(k1+1) / (tf + k1·(1 − b + b·len/avgdl)), one dimension
  per lexeme id. A query sends a sparsevec of idf weights, so the inner product `<#>` is exactly the BM25 score,
  computed in C. Weights depend on avgdl; they are recomputed when avgdl drifts more than 10% from the value
  they were computed with (idf is only ever in the query, so it is always current).

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SPARSE_DIM = 1_000_000_000


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.execute(
        """
        CREATE TABLE sources (
            id serial PRIMARY KEY,
            name text NOT NULL UNIQUE,
            kind text NOT NULL,
            location text,
            created_at timestamptz NOT NULL DEFAULT now(),
            last_synced_at timestamptz
        );
        CREATE TABLE documents (
            id bigserial PRIMARY KEY,
            source_id integer NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
            external_id text NOT NULL,
            title text NOT NULL,
            url text,
            path text,
            author text,
            updated_at timestamptz,
            content_hash varchar(64) NOT NULL,
            access text[] NOT NULL,
            indexed_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (source_id, external_id)
        );
        CREATE TABLE chunks (
            id bigserial PRIMARY KEY,
            document_id bigint NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            ordinal integer NOT NULL,
            text text NOT NULL,
            heading text NOT NULL DEFAULT '',
            token_count integer NOT NULL,
            content_hash varchar(64) NOT NULL,
            embedding vector,
            tsv tsvector NOT NULL,
            lexical_len integer NOT NULL,
            bm25 sparsevec(%(dim)s),
            access text[] NOT NULL,
            source_id integer NOT NULL,
            doc_updated_at timestamptz
        );
        CREATE INDEX chunks_document_id ON chunks (document_id);
        CREATE INDEX chunks_tsv ON chunks USING gin (tsv);
        CREATE INDEX chunks_access ON chunks USING gin (access);
        CREATE INDEX chunks_source_id ON chunks (source_id);
        CREATE TABLE embedding_cache (
            model text NOT NULL,
            content_hash varchar(64) NOT NULL,
            embedding vector NOT NULL,
            PRIMARY KEY (model, content_hash)
        );
        CREATE TABLE lexemes (
            id serial PRIMARY KEY,
            lexeme text NOT NULL UNIQUE,
            df integer NOT NULL
        );
        CREATE TABLE corpus_stats (
            id integer PRIMARY KEY CHECK (id = 1),
            n_chunks bigint NOT NULL,
            total_len bigint NOT NULL,
            weights_avgdl double precision NOT NULL,
            k1 double precision NOT NULL,
            b double precision NOT NULL
        );
        INSERT INTO corpus_stats VALUES (1, 0, 0, 0, 0.9, 0.4);
        CREATE TABLE kb_meta (
            key text PRIMARY KEY,
            value text NOT NULL
        );
        CREATE TABLE conversation_turns (
            id bigserial PRIMARY KEY,
            conversation_id text NOT NULL,
            question text NOT NULL,
            answer text NOT NULL,
            principals text[] NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX conversation_turns_conversation_id ON conversation_turns (conversation_id);
        """
        % {"dim": SPARSE_DIM}
    )
    op.execute(
        """
        -- Number of lexeme occurrences in a tsvector: the BM25 document length.
        CREATE FUNCTION tsvector_length_in_tokens(doc tsvector) RETURNS integer
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
            SELECT coalesce(sum(coalesce(array_length(t.positions, 1), 1)), 0)::integer FROM unnest(doc) t
        $$;

        -- Document-side BM25 weights of one chunk, as a sparse vector indexed by lexeme id.
        CREATE FUNCTION bm25_document_vector(doc tsvector, doc_len integer, avgdl double precision,
                                             k1 double precision, b double precision) RETURNS sparsevec
        LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT ('{' || coalesce(string_agg(l.id || ':' ||
                        (d.tf * (k1 + 1) / (d.tf + k1 * (1 - b + b * doc_len / greatest(avgdl, 1.0)))),
                        ',' ORDER BY l.id), '') || '}/%(dim)s')::sparsevec
            FROM (SELECT t.lexeme, coalesce(array_length(t.positions, 1), 1)::double precision AS tf
                  FROM unnest(doc) t) d
            JOIN lexemes l ON l.lexeme = d.lexeme
        $$;

        -- Recompute every chunk's weights when avgdl has drifted more than 10%% from what they were built with.
        CREATE FUNCTION bm25_reweight_if_drifted() RETURNS void LANGUAGE plpgsql AS $$
        DECLARE
            s corpus_stats%%ROWTYPE;
            avgdl double precision;
        BEGIN
            SELECT * INTO s FROM corpus_stats WHERE id = 1;
            IF s.n_chunks = 0 THEN
                RETURN;
            END IF;
            avgdl := s.total_len::double precision / s.n_chunks;
            IF s.weights_avgdl > 0 AND abs(avgdl - s.weights_avgdl) / s.weights_avgdl <= 0.10 THEN
                RETURN;
            END IF;
            UPDATE chunks SET bm25 = bm25_document_vector(tsv, lexical_len, avgdl, s.k1, s.b);
            UPDATE corpus_stats SET weights_avgdl = avgdl WHERE id = 1;
        END $$;

        CREATE FUNCTION bm25_chunks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            s corpus_stats%%ROWTYPE;
        BEGIN
            INSERT INTO lexemes (lexeme, df)
            SELECT t.lexeme, count(*) FROM new_chunks n, unnest(n.tsv) t GROUP BY t.lexeme ORDER BY t.lexeme
            ON CONFLICT (lexeme) DO UPDATE SET df = lexemes.df + EXCLUDED.df;

            UPDATE corpus_stats
               SET n_chunks = n_chunks + (SELECT count(*) FROM new_chunks),
                   total_len = total_len + (SELECT coalesce(sum(lexical_len), 0) FROM new_chunks)
             WHERE id = 1
            RETURNING * INTO s;

            -- New chunks are weighted with the avgdl the rest of the index uses, so scores stay comparable.
            UPDATE chunks c
               SET bm25 = bm25_document_vector(c.tsv, c.lexical_len,
                          CASE WHEN s.weights_avgdl > 0 THEN s.weights_avgdl
                               ELSE s.total_len::double precision / greatest(s.n_chunks, 1) END,
                          s.k1, s.b)
             WHERE c.id IN (SELECT id FROM new_chunks);

            PERFORM bm25_reweight_if_drifted();
            RETURN NULL;
        END $$;

        CREATE FUNCTION bm25_chunks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE lexemes l SET df = l.df - d.n
              FROM (SELECT t.lexeme, count(*) AS n FROM old_chunks o, unnest(o.tsv) t
                    GROUP BY t.lexeme ORDER BY t.lexeme) d
             WHERE l.lexeme = d.lexeme;

            UPDATE corpus_stats
               SET n_chunks = n_chunks - (SELECT count(*) FROM old_chunks),
                   total_len = total_len - (SELECT coalesce(sum(lexical_len), 0) FROM old_chunks)
             WHERE id = 1;

            PERFORM bm25_reweight_if_drifted();
            RETURN NULL;
        END $$;

        -- Chunks are replaced, never edited in place: text, tsv and length cannot change after insert.
        CREATE FUNCTION chunks_text_is_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'chunks are immutable: delete and re-insert instead of updating text or tsv';
        END $$;

        CREATE TRIGGER chunks_bm25_insert AFTER INSERT ON chunks
            REFERENCING NEW TABLE AS new_chunks FOR EACH STATEMENT EXECUTE FUNCTION bm25_chunks_inserted();
        CREATE TRIGGER chunks_bm25_delete AFTER DELETE ON chunks
            REFERENCING OLD TABLE AS old_chunks FOR EACH STATEMENT EXECUTE FUNCTION bm25_chunks_deleted();
        CREATE TRIGGER chunks_immutable BEFORE UPDATE OF text, tsv, lexical_len ON chunks
            FOR EACH ROW EXECUTE FUNCTION chunks_text_is_immutable();
        """
        % {"dim": SPARSE_DIM}
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE IF EXISTS conversation_turns, kb_meta, corpus_stats, lexemes, embedding_cache, chunks,
            documents, sources CASCADE;
        DROP FUNCTION IF EXISTS bm25_chunks_inserted, bm25_chunks_deleted, bm25_reweight_if_drifted,
            bm25_document_vector, tsvector_length_in_tokens, chunks_text_is_immutable;
        """
    )
