"""Teams answer messages: which posted message carries which answer, for the 👍/👎 feedback buttons.

Teams' feedback buttons (`channelData.feedbackLoopEnabled`) send a `message/submitAction` invoke naming only the
rated message (its `replyToId`), not a value the bot chose, so the answer id the feedback row needs is looked up
here by (conversation, message id). Rows go with their answer (ON DELETE CASCADE): the retention job deletes them.

Revision ID: 0022_teams
Revises: 0018_cjk_lexemes
"""

from alembic import op

revision = "0022_teams"
down_revision = "0020_sync_parts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS teams_answer_messages (
            conversation_id text NOT NULL,
            message_id text NOT NULL,
            answer_id bigint NOT NULL REFERENCES bot_answers(id) ON DELETE CASCADE,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (conversation_id, message_id)
        )
        """
    )
    op.execute("CREATE INDEX IF NOT EXISTS teams_answer_messages_answer ON teams_answer_messages (answer_id)")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS teams_answer_messages")
