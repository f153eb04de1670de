"""Run the Alembic migrations programmatically (`ragbot db upgrade`, and at every start)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine

from db import locks

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def alembic_config() -> Config:
    config = Config(str(PROJECT_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(PROJECT_ROOT / "alembic"))
    return config


async def upgrade_to_head(engine: AsyncEngine) -> None:
    """Bring the schema to the newest revision. Safe to call on every start: a current schema is a no-op.

    A transaction-level advisory lock keeps two processes starting at once from racing each other.
    """
    from sqlalchemy import text

    def _upgrade(sync_connection) -> None:  # type: ignore[no-untyped-def]
        sync_connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": locks.MIGRATIONS})
        config = alembic_config()
        config.attributes["connection"] = sync_connection
        command.upgrade(config, "head")

    from sqlalchemy.exc import DBAPIError, OperationalError

    from db.errors import DatabaseUnavailable
    from db.settings import redact_url

    try:
        async with engine.begin() as connection:
            await connection.run_sync(_upgrade)
    except OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to {redact_url(engine.url.render_as_string(hide_password=False))}: "
            f"{str(exc.orig).strip().splitlines()[0]}. "
            "Check DATABASE_URL, or unset it to use the embedded database."
        ) from exc
    except DBAPIError as exc:
        if "vector" in str(exc.orig):
            raise DatabaseUnavailable(
                "this Postgres has no pgvector extension (ragbot needs pgvector >= 0.8): install it, "
                "or unset DATABASE_URL to use the embedded database"
            ) from exc
        raise


async def current_revision(engine: AsyncEngine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    async with engine.connect() as connection:
        return await connection.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())
