"""Leases instead of session advisory locks (issue 43): a sync of a source, and a bulk load, are held by a row.

A session advisory lock lives on one server connection; behind a pooler in transaction mode (PgBouncer) a session
is not a server connection, so the lock would stay on whichever connection took it and its unlock run on another.
A lease is a row: `name` (what is held: `source:ID`, `bulk_load`), `holder` (the process and attempt holding it) and
`expires_at`; the holder renews it while it works, and a holder that dies hands it over when it expires. Rows are
replicated, so a standby shows which syncs are running too.

Revision ID: 0017_leases
Revises: 0016_audit_log
"""

from alembic import op

revision = "0017_leases"
down_revision = "0016_audit_log"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS leases (
            name text PRIMARY KEY,
            holder text NOT NULL,
            taken_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS leases")
