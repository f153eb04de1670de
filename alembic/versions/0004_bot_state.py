"""Bot-side state shared by the chat adapters (Slack, Discord): processed events, channel grants, identity map,
delivered answers and feedback.

- `bot_events`: one row per platform event key ("slack:event:Ev123", "slack:msg:C1:1700.1"). Claiming an event is an
  INSERT … ON CONFLICT DO NOTHING, so a retried or duplicated delivery, or a second replica, never answers twice.
- `bot_channel_grants`: principals an admin has granted a shared channel ("slack:T1:C2", "discord:G1:C2") on top of
  `everyone`.
- `bot_identities`: a platform user ("slack:U1", "discord:42") → principals ("user:a@example.com", "group:eng").
- `bot_answers`: each answer a bot posted, with what a feedback row needs (question, standalone query, chunk ids).
- `bot_feedback`: one rating per answer and user (a second click replaces the first).

Only new tables: safe on an existing database.

Revision ID: 0004
Revises: 0003 (0001 in its own branch; chained at merge)
Create Date: 2026-11-22
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS bot_events (
            key text PRIMARY KEY,
            claimed_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX IF NOT EXISTS bot_events_claimed_at ON bot_events (claimed_at);

        CREATE TABLE IF NOT EXISTS bot_channel_grants (
            channel_key text NOT NULL,
            principal text NOT NULL,
            granted_by text,
            granted_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (channel_key, principal)
        );

        CREATE TABLE IF NOT EXISTS bot_identities (
            identity text NOT NULL,
            principal text NOT NULL,
            mapped_by text,
            mapped_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (identity, principal)
        );

        CREATE TABLE IF NOT EXISTS bot_answers (
            id bigserial PRIMARY KEY,
            platform text NOT NULL,
            conversation_id text NOT NULL,
            asker text NOT NULL,
            turn_id bigint,
            question text NOT NULL,
            standalone_query text NOT NULL,
            chunk_ids bigint[] NOT NULL DEFAULT '{}',
            mode text NOT NULL,
            abstained boolean NOT NULL DEFAULT false,
            created_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX IF NOT EXISTS bot_answers_conversation_id ON bot_answers (conversation_id);

        CREATE TABLE IF NOT EXISTS bot_feedback (
            id bigserial PRIMARY KEY,
            answer_id bigint NOT NULL REFERENCES bot_answers(id) ON DELETE CASCADE,
            platform_user text NOT NULL,
            rating text NOT NULL CHECK (rating IN ('up', 'down')),
            created_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (answer_id, platform_user)
        );
        CREATE INDEX IF NOT EXISTS bot_feedback_created_at ON bot_feedback (created_at);
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS bot_feedback, bot_answers, bot_identities, bot_channel_grants, bot_events")
