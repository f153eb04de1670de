"""Run the Alembic migrations programmatically (`ragbot db upgrade`, and at every start).

Importing and running Alembic costs most of a second, so start-up first compares the revision stored in the
database with the head revision read straight from `alembic/versions/` (a few small files parsed with `ast`), and
only runs Alembic when the schema is behind.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.ext.asyncio import AsyncEngine

from db import locks

PROJECT_ROOT = Path(__file__).resolve().parent.parent
VERSIONS = PROJECT_ROOT / "alembic" / "versions"


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config(str(PROJECT_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(PROJECT_ROOT / "alembic"))
    return config


def _revision_ids(value: object) -> set[str]:
    if value is None:
        return set()
    if isinstance(value, str):
        return {value}
    if isinstance(value, (tuple, list)):
        return {str(v) for v in value}
    return set()


@lru_cache(maxsize=1)
def head_revisions() -> frozenset[str]:
    """The head revision ids, read from the migration files without importing Alembic or the migrations."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in VERSIONS.glob("*.py"):
        found: dict[str, object] = {}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in ("revision", "down_revision") and node.value:
                        try:
                            found[target.id] = ast.literal_eval(node.value)
                        except ValueError:
                            pass
        revisions |= _revision_ids(found.get("revision"))
        parents |= _revision_ids(found.get("down_revision"))
    return frozenset(revisions - parents)


async def stored_revisions(engine: AsyncEngine) -> frozenset[str]:
    """What `alembic_version` says the database is at (empty for a database never migrated)."""
    from sqlalchemy import text

    async with engine.connect() as connection:
        exists = (await connection.execute(text("SELECT to_regclass('alembic_version') IS NOT NULL"))).scalar()
        if not exists:
            return frozenset()
        return frozenset((await connection.execute(text("SELECT version_num FROM alembic_version"))).scalars())


async def ensure_schema(engine: AsyncEngine) -> bool:
    """Migrate only when the stored revision is not the head (one cheap query otherwise). Returns True if
    Alembic ran."""
    try:
        current = await stored_revisions(engine)
    except Exception as exc:  # connection problems get the same clear message as a failed upgrade
        from sqlalchemy.exc import OperationalError

        if isinstance(exc, OperationalError):
            raise _unavailable(engine, exc) from exc
        raise
    heads = head_revisions()
    if heads and current == heads:
        return False
    await upgrade_to_head(engine)
    return True


def _unavailable(engine: AsyncEngine, exc: Exception) -> Exception:
    from db.errors import DatabaseUnavailable
    from db.settings import redact_url

    return DatabaseUnavailable(
        f"cannot connect to {redact_url(engine.url.render_as_string(hide_password=False))}: "
        f"{str(getattr(exc, 'orig', exc)).strip().splitlines()[0]}. "
        "Check DATABASE_URL, or unset it to use the embedded database."
    )


async def upgrade_to_head(engine: AsyncEngine) -> None:
    """Bring the schema to the newest revision. Safe to call on every start: a current schema is a no-op.

    A transaction-level advisory lock keeps two processes starting at once from racing each other.
    """
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError, OperationalError

    from alembic import command
    from db.errors import DatabaseUnavailable

    def _upgrade(sync_connection) -> None:
        sync_connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": locks.MIGRATIONS})
        config = alembic_config()
        config.attributes["connection"] = sync_connection
        command.upgrade(config, "head")

    try:
        async with engine.begin() as connection:
            await connection.run_sync(_upgrade)
        # Connections opened before the pgvector extension existed lack its adapters (db.engine): open new ones.
        await engine.dispose()
    except OperationalError as exc:
        raise _unavailable(engine, exc) from exc
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
