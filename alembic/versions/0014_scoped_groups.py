"""Group principals scoped to the directory that defines them (issue 38, "group names collide across sources").

A group name is only unique within its own system: a Confluence group called `eng@acme.example` is not the Google
group of that address. Sources that define groups (Confluence, Google Drive) now write them as
`group:<source name>/<name>` on their documents and in their directory (knowledge.access), and the resolver expands a
directory only inside its own scope. This migration rewrites what is already indexed the same way, so no re-sync is
needed and nothing is granted across sources from the moment it runs:

- `documents.access` and `chunks.access` of Confluence and Google Drive sources: every `group:X` becomes
  `group:<source>/X` (order kept: every group of a source gets the same prefix, so sorted lists stay sorted);
- `directory_members` of every directory (only those two kinds have one): groups, and nested groups as members;
- admin mappings (`bot_identities`) and channel grants (`bot_channel_grants`) naming an unscoped `group:X` keep it
  (it still matches folder `.access` files) and gain `group:<source>/X` for every source whose documents or
  directory hold that group: what the admin granted keeps granting exactly what it did;
- `directory_members.refreshed_at` (new, NULL = "listed by the directory's last refresh"): when a group the last
  refresh could not list was last listed, so that only that group expires;
  `directory_state.skipped` (new): the groups the last refresh could not list, and why.
- every directory's generation moves, so running resolvers re-read it.

Folder sources are untouched: an unscoped `group:X` in an `.access` file is a local group no directory defines.
Only new nullable columns and in-place array rewrites of the rows that hold a group: no table rewrite.

Revision ID: 0014_scoped_groups
Revises: 0013_lease
"""

from alembic import op

revision = "0014_scoped_groups"
down_revision = "0013_lease"
branch_labels = None
depends_on = None

# The sources whose groups are theirs (knowledge.ingest.groups.has_directory's kinds).
_KINDS = "('confluence', 'gdrive')"
# SQL over a row `p` (a principal) and a source row `s`: its scope prefix, whether `p` is in that scope, the group
# name after it. (No LIKE on the source name: `_` and `%` are legal in names.)
_PREFIX = "('group:' || s.name || '/')"
_IN_SCOPE = f"(left({{p}}, length({_PREFIX})) = {_PREFIX})"
_NAME = f"substr({{p}}, length({_PREFIX}) + 1)"


def _scope(p: str) -> str:
    """`p` with its unscoped group prefixed by the source's scope (other principals as they are)."""
    return f"CASE WHEN left({p}, 6) = 'group:' THEN {_PREFIX} || substr({p}, 7) ELSE {p} END"


def _unscope(p: str) -> str:
    return f"CASE WHEN {_IN_SCOPE.format(p=p)} THEN 'group:' || {_NAME.format(p=p)} ELSE {p} END"


def _rewrite(table: str, to_scoped: bool) -> str:
    """Rewrite `table.access` of group-defining sources, keeping the order of each list."""
    entry = _scope("p") if to_scoped else _unscope("p")
    holds = "left(q, 6) = 'group:'" if to_scoped else _IN_SCOPE.format(p="q")
    return f"""
        UPDATE {table} t SET access = ARRAY(
            SELECT {entry} FROM unnest(t.access) WITH ORDINALITY AS u(p, i) ORDER BY i)
        FROM sources s
        WHERE s.id = t.source_id AND s.kind IN {_KINDS}
          AND EXISTS (SELECT 1 FROM unnest(t.access) AS x(q) WHERE {holds});
    """


# (source, group name) of every group a group-defining source's directory or documents hold, once scoped.
_SCOPED_GROUPS = f"""
    SELECT DISTINCT s.name AS source, {_NAME.format(p="g.p")} AS name
    FROM sources s
    JOIN LATERAL (
        SELECT m.group_principal AS p FROM directory_members m WHERE m.source_id = s.id
        UNION SELECT a.p FROM documents d, unnest(d.access) AS a(p) WHERE d.source_id = s.id
    ) g ON {_IN_SCOPE.format(p="g.p")}
    WHERE s.kind IN {_KINDS}
"""


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE directory_members ADD COLUMN IF NOT EXISTS refreshed_at timestamptz;
        ALTER TABLE directory_state ADD COLUMN IF NOT EXISTS skipped text[] NOT NULL DEFAULT '{}';
        """
    )
    op.execute(_rewrite("documents", True))
    op.execute(_rewrite("chunks", True))
    op.execute(
        f"""
        UPDATE directory_members m SET group_principal = {_scope("m.group_principal")}, member = {_scope("m.member")}
        FROM sources s WHERE s.id = m.source_id AND s.kind IN {_KINDS};

        UPDATE directory_state SET generation = generation + 1;

        INSERT INTO bot_identities (identity, principal, mapped_by)
            SELECT i.identity, 'group:' || g.source || '/' || g.name, i.mapped_by
            FROM bot_identities i JOIN ({_SCOPED_GROUPS}) g ON i.principal = 'group:' || g.name
            ON CONFLICT DO NOTHING;

        INSERT INTO bot_channel_grants (channel_key, principal, granted_by)
            SELECT c.channel_key, 'group:' || g.source || '/' || g.name, c.granted_by
            FROM bot_channel_grants c JOIN ({_SCOPED_GROUPS}) g ON c.principal = 'group:' || g.name
            ON CONFLICT DO NOTHING;
        """
    )


def downgrade() -> None:
    """Back to unscoped names (groups the last refresh could not list are dropped: the old code cannot expire them
    on their own). Scoped mappings and grants become their unscoped name."""
    op.execute(_rewrite("documents", False))
    op.execute(_rewrite("chunks", False))
    in_scope_i = _IN_SCOPE.format(p="i.principal")
    in_scope_c = _IN_SCOPE.format(p="c.principal")
    op.execute(
        f"""
        DELETE FROM directory_members WHERE refreshed_at IS NOT NULL;
        UPDATE directory_members m SET group_principal = {_unscope("m.group_principal")},
                                       member = {_unscope("m.member")}
        FROM sources s WHERE s.id = m.source_id AND s.kind IN {_KINDS};
        UPDATE directory_state SET generation = generation + 1;

        INSERT INTO bot_identities (identity, principal, mapped_by)
            SELECT i.identity, 'group:' || {_NAME.format(p="i.principal")}, i.mapped_by
            FROM bot_identities i JOIN sources s ON s.kind IN {_KINDS} AND {in_scope_i}
            ON CONFLICT DO NOTHING;
        DELETE FROM bot_identities i USING sources s WHERE s.kind IN {_KINDS} AND {in_scope_i};
        INSERT INTO bot_channel_grants (channel_key, principal, granted_by)
            SELECT c.channel_key, 'group:' || {_NAME.format(p="c.principal")}, c.granted_by
            FROM bot_channel_grants c JOIN sources s ON s.kind IN {_KINDS} AND {in_scope_c}
            ON CONFLICT DO NOTHING;
        DELETE FROM bot_channel_grants c USING sources s WHERE s.kind IN {_KINDS} AND {in_scope_c};

        ALTER TABLE directory_state DROP COLUMN IF EXISTS skipped;
        ALTER TABLE directory_members DROP COLUMN IF EXISTS refreshed_at;
        """
    )
