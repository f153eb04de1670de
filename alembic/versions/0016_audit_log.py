"""An audit log of who changed access (issue 38, item 4).

`audit_log` keeps one row per change of the identity map (`users map` / `unmap`) and of a channel's grants
(`channel-access add` / `remove`), from the CLI and from chat, and per refused attempt: when, who (`actor`: a chat
identity, or "cli"), as what (`actor_role`: "operator" for the CLI and ADMIN_USER_IDS, "platform-admin" for a
workspace admin or a Manage Server member), the action, its subject (the identity or channel key), the principal
and the outcome ("done", "unchanged", "refused"). `ragbot audit` and the admin page show it.

Revision ID: 0016_audit_log
Revises: 0015_turn_context (the lead re-chains; briefed as 0013_lease)
"""

from alembic import op

revision = "0016_audit_log"
down_revision = "0015_turn_context"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS audit_log (
            id bigserial PRIMARY KEY,
            at timestamptz NOT NULL DEFAULT now(),
            actor text NOT NULL,
            actor_role text NOT NULL,
            action text NOT NULL,
            subject text NOT NULL,
            principal text,
            outcome text NOT NULL,
            detail text
        );
        CREATE INDEX IF NOT EXISTS audit_log_at ON audit_log (at);
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS audit_log")
