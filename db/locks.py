"""Every Postgres advisory-lock key ragbot uses, in one place, so no two features ever pick the same number.

Only transaction-scoped locks: a session lock would not survive a pooler in transaction mode (db.leases instead).

`db` is the lowest layer, so both the migration runner (here) and the knowledge store can import these.
"""

MIGRATIONS = 727274001  # one process at a time runs the Alembic migrations
EMBEDDING_SPACE = 727274002  # checking or switching the embedding model (re-embedding every chunk)
# Writers of chunks (store.write_documents) hold it shared and may run side by side; whatever rewrites chunks or
# statistics wholesale (deletions, metadata updates, re-weighting, a bulk load's start) holds it exclusive.
INDEX_WRITERS = 727274003
# Retired keys (never reuse them): 727274004 was the bulk-load session lock and (727274100, source id) the per-source
# sync lock; both are leases now (db.leases), which also hold behind a transaction-mode pooler. Every lock left here
# is transaction-scoped (pg_advisory_xact_lock): it ends with its transaction, on the server connection that took it.
# (class, hash of source id and external id): one writer at a time per document, so two concurrent writes of one
# document (two syncs of a folder) cannot both insert its chunks.
DOCUMENT_WRITE_CLASS = 727274101
# (class, source id): one writer at a time of a source's group directory (knowledge.storage.directory).
DIRECTORY_REFRESH_CLASS = 727274102
