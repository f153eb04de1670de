"""Split first syncs (issue 43, item 3): the parts of one big source's first sync, so several workers index it.

A source's first sync that has several units (a folder's top-level folders, and its top-level files as one more)
is cut into parts, one row each here: `part` is the unit (the external-id prefix it covers), `done_at` is set once
every document of it is committed. Each part is leased separately (db.leases, `sync_part:SOURCE:PART`), so two
workers take different parts, and a dead worker's part is taken over when its lease expires. The rows go when the
source's index is published as a whole (knowledge.storage.parts.publish); a removed source takes its rows along.

Revision ID: 0020_sync_parts
Revises: 0018_cjk_lexemes
"""

from alembic import op

revision = "0020_sync_parts"
down_revision = "0019_chunk_partitions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS sync_parts (
            source_id integer NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
            part text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            done_at timestamptz,
            PRIMARY KEY (source_id, part)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS sync_parts")
