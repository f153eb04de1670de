"""Every chunk a turn's prompt held, not only the ones its answer cited (issue 38, item 2).

`conversation_turns.context_chunk_ids` lists the chunks that were in the turn's answer prompt (the sources) and,
transitively, the context of the earlier turns and summary its history showed. A model may restate a passage it
was given without citing it, so a later asker in the same conversation sees the turn only if they may see every
one of these chunks (`knowledge.storage.conversations.turns_hidden_from`). Existing turns keep NULL: for them the
cited chunks stand in, and they are shown only to an audience holding every principal they were answered for.

Revision ID: 0015_turn_context
Revises: 0014_scoped_groups
"""

from alembic import op

revision = "0015_turn_context"
down_revision = "0014_scoped_groups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE conversation_turns ADD COLUMN IF NOT EXISTS context_chunk_ids bigint[]")


def downgrade() -> None:
    op.execute("ALTER TABLE conversation_turns DROP COLUMN IF EXISTS context_chunk_ids")
