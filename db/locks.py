"""Every Postgres advisory-lock key ragbot uses, in one place, so no two features ever pick the same number.

`db` is the lowest layer, so both the migration runner (here) and the knowledge store can import these.
"""

MIGRATIONS = 727274001  # one process at a time runs the Alembic migrations
EMBEDDING_SPACE = 727274002  # checking or switching the embedding model (re-embedding every chunk)
INDEX_WRITERS = 727274003  # writers of chunks serialised: the BM25 triggers could otherwise deadlock
BULK_LOAD = 727274004  # held (per session) while a sync loads an empty index without its vector index
# Two-key locks (class, object id): one sync at a time per source, held for the whole run.
SOURCE_SYNC_CLASS = 727274100
