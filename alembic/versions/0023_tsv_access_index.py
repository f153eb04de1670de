"""The lexical index also holds each chunk's access list: GIN over (tsv, access) replaces GIN over tsv (issue 43).

Why: at a million chunks, a reader who may see a tenth of them spent most of a slow BM25 search fetching table rows
only to find they were someone else's. A common question term's posting list (17,704 chunks) cost 40-80 ms of row
fetches to keep 1,794; each pair of terms intersected for candidates fetched about ten rows for every one kept. With
both columns in one GIN index, a search for such a reader puts its access condition into the index scan: GIN walks
the term's posting list and skips through the principals' lists in the same scan, so only the reader's own rows are
fetched (on a third of the million chunks: a common term 31 -> 8 ms, a pair 14 -> 6 ms; the index scan itself took
no longer). The access index alone cannot do this: building the bitmap of a tenth of a million chunks from it takes
19 ms before any term is read. A search for a reader who may see most chunks keeps checking access row by row
(knowledge.storage.search, `narrow`): for them the principals' lists are nearly the whole table.

A query on `tsv` alone uses the two-column index as it used the old one (GIN keeps each column's keys apart), so
the old index is dropped rather than kept beside it. The build takes SHARE on `chunks`: searches go on, a sync's
writes wait for it (minutes at a million chunks). On a partitioned `chunks` (0019) the index is built on every
partition.

Revision ID: 0023_tsv_access_index
Revises: 0022_teams
"""

from __future__ import annotations

from sqlalchemy import text

from alembic import op

revision = "0023_tsv_access_index"
down_revision = "0022_teams"
branch_labels = None
depends_on = None


def _build_memory() -> None:
    # as knowledge.storage.documents.index_build_memory (a migration does not import the storage module)
    chunks = int(op.get_bind().execute(text("SELECT count(*) FROM chunks")).scalar_one())
    op.execute(f"SET LOCAL maintenance_work_mem = '{min(max(512, chunks * 1536 // 2**20), 2048)}MB'")


def upgrade() -> None:
    _build_memory()
    op.execute("CREATE INDEX IF NOT EXISTS chunks_tsv_access ON chunks USING gin (tsv, access)")
    op.execute("DROP INDEX IF EXISTS chunks_tsv")


def downgrade() -> None:
    _build_memory()
    op.execute("CREATE INDEX IF NOT EXISTS chunks_tsv ON chunks USING gin (tsv)")
    op.execute("DROP INDEX IF EXISTS chunks_tsv_access")
