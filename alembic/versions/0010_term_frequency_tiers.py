"""An index of the words each chunk repeats, by how often: where a question of common words finds its best matches.

Before: when every question term is in many chunks (at a million chunks, a term in 37% of them), BM25's candidates
were the first chunks in table order that hold the rarest term. Its best matches are the chunks that repeat it
most, anywhere in its posting list of hundreds of thousands: such a question found none of its exact top ten.

After: each chunk's `tf_tiers` holds one token per lexeme it holds at least twice, naming the lexeme and a tier of
its term frequency (`word#2` … `word#6`, then `#8`, `#11`, `#16`, `#23`, `#32` for at least that many). A GIN index
on it (`chunks_tf_tiers`) holds, for each word, short posting lists of the chunks with its highest term
frequencies: an impact-ordered index built from the GIN Postgres already has. A search reads the rarest common
term's tiers from the top down until it has enough candidates (knowledge.storage.search, SearchTuning.tf_tiers).

`store.write_documents` fills the column from the term frequencies its INSERT counts anyway. Chunks written before
keep it NULL, and the index reads theirs from `bm25_tf_tiers(tsv)` instead (`coalesce`, which calls the function only
for a NULL), so no row is rewritten: the migration reads every chunk once to build the index (24 s and 28 MB at a
million chunks). An index on the function alone would call it for every chunk written (about 35 µs): measured,
3–6% off the store path with the graph maintained and 13–17% off a first sync. A chunk holds about 10 such lexemes
against about 115 in its tsvector (synthetic text).

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# The tier of a term frequency: the largest of 2, 3, 4, 5, 6, 8, 11, 16, 23, 32 at most `tf`. A single CASE in SQL
# that the planner inlines, so store._INSERT_CHUNKS uses it at no cost. knowledge.storage.search.SearchTuning.tf_tiers lists the
# same tiers. (Not STRICT: a strict function is inlined only when its body is.)
_TIER = r"""
CREATE OR REPLACE FUNCTION bm25_tf_tier(tf integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN tf >= 32 THEN 32 WHEN tf >= 23 THEN 23 WHEN tf >= 16 THEN 16 WHEN tf >= 11 THEN 11
                WHEN tf >= 8 THEN 8 WHEN tf >= 6 THEN 6 ELSE tf END
$$
"""

# A chunk's tiers from its tsvector, for chunks written before this migration (IMMUTABLE: it depends only on its
# argument, as an index expression must). Its search_path is the migration's: Postgres runs index expressions with
# pg_catalog only when it builds or rebuilds an index, where bm25_tf_tier would not be found.
_FUNCTION = r"""
CREATE OR REPLACE FUNCTION bm25_tf_tiers(tsv tsvector) RETURNS tsvector
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path FROM CURRENT AS $$
    SELECT coalesce(array_to_tsvector(array_agg(t.lexeme || '#' || bm25_tf_tier(t.tf))), ''::tsvector)
    FROM (SELECT lexeme, coalesce(array_length(positions, 1), 1) AS tf FROM unnest(tsv)) t
    WHERE t.tf >= 2
$$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE chunks ADD COLUMN tf_tiers tsvector")
    op.execute(_TIER)
    op.execute(_FUNCTION)
    op.execute("CREATE INDEX chunks_tf_tiers ON chunks USING gin ((coalesce(tf_tiers, bm25_tf_tiers(tsv))))")
    op.execute("ANALYZE chunks")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS chunks_tf_tiers")
    op.execute("DROP FUNCTION IF EXISTS bm25_tf_tiers(tsvector)")
    op.execute("DROP FUNCTION IF EXISTS bm25_tf_tier(integer)")
    op.execute("ALTER TABLE chunks DROP COLUMN IF EXISTS tf_tiers")
