"""Moving a test database to a given Alembic revision inside a transaction of the test's own, so that a test can
write rows as an older version of the schema held them and then watch what the later migrations (and
`db.migrate.upgrade_to_head`, as the app runs it) make of them."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection


async def migrate_to(conn: AsyncConnection, revision: str, *, down: bool = True) -> None:
    """Downgrade (or, with `down=False`, upgrade) the database `conn` is on to `revision`, in `conn`'s transaction."""
    from alembic import command
    from db.migrate import alembic_config

    def run(sync_connection: object) -> None:
        config = alembic_config()
        config.attributes["connection"] = sync_connection
        (command.downgrade if down else command.upgrade)(config, revision)

    await conn.run_sync(run)
