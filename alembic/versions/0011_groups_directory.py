"""Group membership synced from the systems that define it (issue 33): one directory per source.

- `directory_members`: (source, group principal, member) edges exactly as documents carry principals:
  `group:hr` (Confluence), `group:eng@acme.com` (Google); members are `user:<email>`, `user:confluence:<id>`,
  a nested `group:…`, or `customer:` (a Google group holding the whole Workspace customer). Replaced wholesale by
  each successful refresh, so a removal takes effect with the refresh that no longer lists it.
- `directory_state`: per source, when the membership was last refreshed successfully (the resolver stops trusting
  it one TTL later: fail closed), the last attempt and its error, counts, the Workspace domains, and a generation
  the resolver's cache compares to notice a refresh made by another process.

Only new tables: safe on an existing database.

Revision ID: 0011_groups
Revises: 0010
"""

from alembic import op

revision = "0011_groups"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS directory_state (
            source_id integer PRIMARY KEY REFERENCES sources(id) ON DELETE CASCADE,
            refreshed_at timestamptz,
            attempted_at timestamptz,
            error text,
            groups integer NOT NULL DEFAULT 0,
            memberships integer NOT NULL DEFAULT 0,
            api_calls integer NOT NULL DEFAULT 0,
            domains text[] NOT NULL DEFAULT '{}',
            generation bigint NOT NULL DEFAULT 0
        );

        CREATE TABLE IF NOT EXISTS directory_members (
            source_id integer NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
            group_principal text NOT NULL,
            member text NOT NULL,
            PRIMARY KEY (source_id, group_principal, member)
        );
        CREATE INDEX IF NOT EXISTS directory_members_member ON directory_members (member);
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS directory_members; DROP TABLE IF EXISTS directory_state;")
