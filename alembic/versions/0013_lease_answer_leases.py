"""Exactly-once claims become leases (issue 30, "a crash mid-answer loses the question").

A claimed question records who holds it (`holder`) and until when (`lease_until`), what was asked and where to answer
(`platform`, `question`, `conversation_id`, `asker`, `target`: the adapter's own JSON), the placeholder message
posted for it (`placeholder`: a Slack ts, a Discord message id) and whether the answer was delivered
(`delivered_at`). An undelivered claim whose lease ran out is taken over — by the platform's retry of the event, or
by a sweeper of `ragbot run` — and answered in the same placeholder. `attempts` bounds how often a question that
keeps failing is taken over.

Existing rows stay valid as they are: their `lease_until` is NULL, which means "a plain claim, never taken over"
(the same meaning the table had before). Only new nullable columns (and a constant default): no table rewrite.

Revision ID: 0013_lease
Revises: 0012_admin
"""

from alembic import op

revision = "0013_lease"
down_revision = "0012_admin"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE bot_events
            ADD COLUMN IF NOT EXISTS holder text,
            ADD COLUMN IF NOT EXISTS lease_until timestamptz,
            ADD COLUMN IF NOT EXISTS delivered_at timestamptz,
            ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0,
            ADD COLUMN IF NOT EXISTS platform text,
            ADD COLUMN IF NOT EXISTS question text,
            ADD COLUMN IF NOT EXISTS conversation_id text,
            ADD COLUMN IF NOT EXISTS asker text,
            ADD COLUMN IF NOT EXISTS target jsonb,
            ADD COLUMN IF NOT EXISTS placeholder text;
        CREATE INDEX IF NOT EXISTS bot_events_open_leases ON bot_events (platform, lease_until)
            WHERE delivered_at IS NULL AND question IS NOT NULL;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX IF EXISTS bot_events_open_leases;
        ALTER TABLE bot_events
            DROP COLUMN IF EXISTS holder, DROP COLUMN IF EXISTS lease_until, DROP COLUMN IF EXISTS delivered_at,
            DROP COLUMN IF EXISTS attempts, DROP COLUMN IF EXISTS platform, DROP COLUMN IF EXISTS question,
            DROP COLUMN IF EXISTS conversation_id, DROP COLUMN IF EXISTS asker, DROP COLUMN IF EXISTS target,
            DROP COLUMN IF EXISTS placeholder;
        """
    )
