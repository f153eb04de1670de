"""The database layer: every pooled connection is set up for filtered vector search, and URLs never leak."""

import asyncio

from sqlalchemy import text

from db.engine import HNSW_EF_SEARCH, create_engine
from db.settings import redact_url


async def test_every_pooled_connection_keeps_the_pgvector_settings(fresh_database):
    engine = create_engine(fresh_database())
    try:
        async def read_settings() -> tuple[str, str]:
            async with engine.connect() as conn:  # read-only use: ends in a rollback
                row = (await conn.execute(text("SELECT current_setting('hnsw.iterative_scan', true), "
                                               "current_setting('hnsw.ef_search', true)"))).one()
                await asyncio.sleep(0.05)  # hold the connection so the others need their own
                return tuple(row)

        first = await asyncio.gather(*(read_settings() for _ in range(4)))
        again = await asyncio.gather(*(read_settings() for _ in range(4)))  # the same connections, reused
        assert set(first) | set(again) == {("relaxed_order", str(HNSW_EF_SEARCH))}
    finally:
        await engine.dispose()


def test_database_urls_are_redacted_even_when_the_password_is_not_url_encoded():
    assert redact_url("postgresql://bob:p@ss#word@db.example.com:5432/kb") == "postgresql://bob:***@db.example.com:5432/kb"
    assert redact_url("postgresql+psycopg://postgres:@/postgres?host=/tmp/x") == "postgresql+psycopg://postgres:***@/postgres?host=/tmp/x"
    assert redact_url("postgresql://db.example.com/kb") == "postgresql://db.example.com/kb"
