"""The chunk INSERT of `store.write_documents` counts document frequencies itself; the trigger stops repeating it.

Before: the INSERT created new lexemes with df 0 and looked the others up, and then the statement trigger upserted
every lexeme of the batch again to add its document frequency: two passes over ~15,000 lexeme rows per 400 chunks,
more than half of the store path's time. After: the INSERT upserts each lexeme once with the batch's count and sets
`ragbot.df_counted_by_statement` for its transaction; the trigger skips the lexemes when it is on and still keeps
N and the total length exact. Any other insert into chunks (the setting off) is counted by the trigger as before.

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_FUNCTION = """
CREATE OR REPLACE FUNCTION bm25_chunks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    s corpus_stats%ROWTYPE;
BEGIN
    IF coalesce(current_setting('ragbot.df_counted_by_statement', true), '') <> 'on' THEN
        INSERT INTO lexemes (lexeme, df)
        SELECT t.lexeme, count(*) FROM new_chunks n, unnest(n.tsv) t GROUP BY t.lexeme ORDER BY t.lexeme
        ON CONFLICT (lexeme) DO UPDATE SET df = lexemes.df + EXCLUDED.df;
    END IF;

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
"""


def upgrade() -> None:
    op.execute(_FUNCTION)


def downgrade() -> None:
    op.execute(
        _FUNCTION.replace(
            "IF coalesce(current_setting('ragbot.df_counted_by_statement', true), '') <> 'on' THEN", "IF true THEN"
        )
    )
