"""Conversation memory: each turn keeps what was searched, what was cited and who asked; a rolling summary per
conversation.

Safe on an existing database: the new columns are nullable or have defaults, so turns stored before this
revision keep working (their standalone query reads as the question itself, and they cite nothing).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE conversation_turns
            ADD COLUMN IF NOT EXISTS standalone_query text,
            ADD COLUMN IF NOT EXISTS asker text,
            ADD COLUMN IF NOT EXISTS cited_chunk_ids bigint[] NOT NULL DEFAULT '{}';
        -- History is always read in order within one conversation.
        CREATE INDEX IF NOT EXISTS conversation_turns_conversation_order ON conversation_turns (conversation_id, id);
        DROP INDEX IF EXISTS conversation_turns_conversation_id;

        -- Older turns folded into one summary; turns with id <= through_turn_id are covered by it.
        CREATE TABLE IF NOT EXISTS conversation_summaries (
            conversation_id text PRIMARY KEY,
            summary text NOT NULL,
            through_turn_id bigint NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now()
        );
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE IF EXISTS conversation_summaries;
        CREATE INDEX IF NOT EXISTS conversation_turns_conversation_id ON conversation_turns (conversation_id);
        DROP INDEX IF EXISTS conversation_turns_conversation_order;
        ALTER TABLE conversation_turns
            DROP COLUMN IF EXISTS cited_chunk_ids,
            DROP COLUMN IF EXISTS asker,
            DROP COLUMN IF EXISTS standalone_query;
        """
    )
