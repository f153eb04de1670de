"""Admins steer the bot and see what it misses (issue 34): channel settings, answer outcomes, retention indexes.

- `bot_channel_settings`: one row per channel an admin configured ("slack:T1:C2", "discord:G1:C2"): `sources`
  (NULL: every source the audience may see; else only these source names), `auto` (answer top-level questions in
  a help channel without a mention, only when the outcome is an answer), `mode` (public | private; private
  delivery arrives with the permissions issue).
- `bot_answers` gains `outcome` (answer | uncertain | decline, for the gaps report), `channel_key` (where it was
  asked; NULL in a DM), `private` (a DM or assistant thread: its questions are shown without the asker) and `posted`
  (false for a help-channel auto-answer the bot kept to itself because it was not an answer: still a gap, but
  never a conversation the bot is "in").
- Indexes on `created_at` for the retention job (RETENTION_DAYS) and the insights' time window, and on `asker` for
  `ragbot forget-user`.

New columns have defaults or are nullable: safe on an existing database (old rows read as posted answers, their
outcome derived from `abstained`).

Revision ID: 0012_admin
Revises: 0011_groups
"""

from alembic import op

revision = "0012_admin"
down_revision = "0011_groups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS bot_channel_settings (
            channel_key text PRIMARY KEY,
            sources text[],
            auto boolean NOT NULL DEFAULT false,
            mode text NOT NULL DEFAULT 'public' CHECK (mode IN ('public', 'private')),
            updated_by text,
            updated_at timestamptz NOT NULL DEFAULT now()
        );

        ALTER TABLE bot_answers
            ADD COLUMN IF NOT EXISTS outcome text,
            ADD COLUMN IF NOT EXISTS channel_key text,
            ADD COLUMN IF NOT EXISTS private boolean NOT NULL DEFAULT false,
            ADD COLUMN IF NOT EXISTS posted boolean NOT NULL DEFAULT true;
        UPDATE bot_answers SET outcome = CASE WHEN abstained THEN 'decline' ELSE 'answer' END WHERE outcome IS NULL;
        CREATE INDEX IF NOT EXISTS bot_answers_created_at ON bot_answers (created_at);
        CREATE INDEX IF NOT EXISTS bot_answers_asker ON bot_answers (asker);
        CREATE INDEX IF NOT EXISTS conversation_turns_created_at ON conversation_turns (created_at);
        CREATE INDEX IF NOT EXISTS conversation_turns_asker ON conversation_turns (asker);
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX IF EXISTS conversation_turns_asker;
        DROP INDEX IF EXISTS conversation_turns_created_at;
        DROP INDEX IF EXISTS bot_answers_asker;
        DROP INDEX IF EXISTS bot_answers_created_at;
        ALTER TABLE bot_answers
            DROP COLUMN IF EXISTS posted, DROP COLUMN IF EXISTS private,
            DROP COLUMN IF EXISTS channel_key, DROP COLUMN IF EXISTS outcome;
        DROP TABLE IF EXISTS bot_channel_settings;
        """
    )
