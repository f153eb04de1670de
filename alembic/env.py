"""Alembic environment: runs migrations over the async engine ragbot itself uses.

The URL comes from `config.attributes["url"]` when ragbot runs migrations (`ragbot db upgrade`, start-up), or from
DATABASE_URL / the embedded server when `alembic` is run by hand.
"""

import asyncio

from sqlalchemy.engine import Connection

from alembic import context
from db.engine import create_engine, database_url
from db.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = create_engine(url)
    async with engine.connect() as connection:
        await connection.run_sync(_run)
        await connection.commit()
    await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    asyncio.run(_run_async(config.attributes.get("url") or database_url()))


run_migrations_online()
