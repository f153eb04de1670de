"""Every Postgres advisory-lock key ragbot uses, in one place, so no two features ever pick the same number.

`db` is the lowest layer, so both the migration runner (here) and the knowledge store can import these.
"""

MIGRATIONS = 727274001  # one process at a time runs the Alembic migrations
EMBEDDING_SPACE = 727274002  # checking or switching the embedding model (re-embedding every chunk)
# Writers of chunks (store.write_documents) hold it shared and may run side by side; whatever rewrites chunks or
# statistics wholesale (deletions, metadata updates, re-weighting, a bulk load's start) holds it exclusive.
INDEX_WRITERS = 727274003
BULK_LOAD = 727274004  # held (per session) while a sync loads an empty index without its vector index
# Two-key locks (class, object id): one sync at a time per source, held for the whole run.
SOURCE_SYNC_CLASS = 727274100
# (class, hash of source id and external id): one writer at a time per document, so two concurrent writes of one
# document (two syncs of a folder) cannot both insert its chunks.
DOCUMENT_WRITE_CLASS = 727274101
# (class, source id): one writer at a time of a source's group directory (knowledge.storage.directory).
DIRECTORY_REFRESH_CLASS = 727274102
