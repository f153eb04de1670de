"""BM25 weights computed as chunks are inserted; re-weighting after avgdl drift leaves the writing transaction.

Before: an AFTER INSERT trigger updated every new chunk's `bm25` a second time (a second heap tuple and a second
entry in every index, the HNSW graph included), and when avgdl drifted more than 10% it rewrote every chunk's
weights inside the transaction that inserted the drifting batch (minutes at a million chunks, with the writers'
lock held).

After:
- `store.write_documents` computes the weights in the INSERT itself (the vocabulary rows are created first in the
  same statement), so each chunk is written once. The trigger still keeps df, N and the total length exact, and
  still weights any chunk inserted without weights (another writer), so nothing is ever left unscored.
- `chunks.bm25_avgdl` records the avgdl each chunk's weights were computed with. When avgdl drifts past 10%,
  `store.reweight_bm25` (called after a sync's writes, outside them) moves `corpus_stats.weights_avgdl` to the new
  value and re-weights the stale chunks in batches of a few thousand, each in its own short transaction: a
  concurrent sync waits for one batch at most, and searches meanwhile see weights within the bounded drift.

Revision ID: 0006
Revises: 0004
"""

from alembic import op

revision = "0006"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        -- NULL (every chunk already indexed): weighted with the current corpus_stats.weights_avgdl, so no rewrite
        -- of the table at upgrade; such chunks are re-weighted at the next drift like any other.
        ALTER TABLE chunks ADD COLUMN IF NOT EXISTS bm25_avgdl double precision;

        CREATE OR REPLACE FUNCTION bm25_chunks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            s corpus_stats%ROWTYPE;
        BEGIN
            INSERT INTO lexemes (lexeme, df)
            SELECT t.lexeme, count(*) FROM new_chunks n, unnest(n.tsv) t GROUP BY t.lexeme ORDER BY t.lexeme
            ON CONFLICT (lexeme) DO UPDATE SET df = lexemes.df + EXCLUDED.df;

            UPDATE corpus_stats
               SET n_chunks = n_chunks + (SELECT count(*) FROM new_chunks),
                   total_len = total_len + (SELECT coalesce(sum(lexical_len), 0) FROM new_chunks)
             WHERE id = 1
            RETURNING * INTO s;

            -- The first chunks of an empty index fix the avgdl that weights are computed with.
            IF s.weights_avgdl = 0 AND s.n_chunks > 0 THEN
                UPDATE corpus_stats SET weights_avgdl = s.total_len::double precision / s.n_chunks WHERE id = 1
                RETURNING * INTO s;
            END IF;

            -- Chunks inserted without weights (not through store.write_documents) are weighted here.
            IF EXISTS (SELECT 1 FROM new_chunks WHERE bm25 IS NULL) THEN
                UPDATE chunks c
                   SET bm25 = bm25_document_vector(c.tsv, c.lexical_len, s.weights_avgdl, s.k1, s.b),
                       bm25_avgdl = s.weights_avgdl
                 WHERE c.id IN (SELECT id FROM new_chunks WHERE bm25 IS NULL);
            END IF;
            RETURN NULL;
        END $$;

        CREATE OR REPLACE FUNCTION bm25_chunks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE lexemes l SET df = l.df - d.n
              FROM (SELECT t.lexeme, count(*) AS n FROM old_chunks o, unnest(o.tsv) t
                    GROUP BY t.lexeme ORDER BY t.lexeme) d
             WHERE l.lexeme = d.lexeme;

            UPDATE corpus_stats
               SET n_chunks = n_chunks - (SELECT count(*) FROM old_chunks),
                   total_len = total_len - (SELECT coalesce(sum(lexical_len), 0) FROM old_chunks)
             WHERE id = 1;
            -- An emptied index forgets its avgdl: the next first chunks set it afresh.
            UPDATE corpus_stats SET weights_avgdl = 0 WHERE id = 1 AND n_chunks = 0;
            RETURN NULL;
        END $$;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        CREATE OR REPLACE FUNCTION bm25_chunks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            s corpus_stats%ROWTYPE;
        BEGIN
            INSERT INTO lexemes (lexeme, df)
            SELECT t.lexeme, count(*) FROM new_chunks n, unnest(n.tsv) t GROUP BY t.lexeme ORDER BY t.lexeme
            ON CONFLICT (lexeme) DO UPDATE SET df = lexemes.df + EXCLUDED.df;
            UPDATE corpus_stats
               SET n_chunks = n_chunks + (SELECT count(*) FROM new_chunks),
                   total_len = total_len + (SELECT coalesce(sum(lexical_len), 0) FROM new_chunks)
             WHERE id = 1
            RETURNING * INTO s;
            UPDATE chunks c
               SET bm25 = bm25_document_vector(c.tsv, c.lexical_len,
                          CASE WHEN s.weights_avgdl > 0 THEN s.weights_avgdl
                               ELSE s.total_len::double precision / greatest(s.n_chunks, 1) END,
                          s.k1, s.b)
             WHERE c.id IN (SELECT id FROM new_chunks);
            PERFORM bm25_reweight_if_drifted();
            RETURN NULL;
        END $$;

        CREATE OR REPLACE FUNCTION bm25_chunks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
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

        ALTER TABLE chunks DROP COLUMN IF EXISTS bm25_avgdl;
        """
    )
