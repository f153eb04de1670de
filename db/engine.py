"""The async SQLAlchemy engine, configured for pgvector.

Every connection turns on pgvector's iterative index scan, so a vector search filtered by an access list or a
source still returns k rows instead of whatever survived the first pass over the index, and registers
pgvector-python's psycopg adapters, so embeddings travel as binary float32 (a NumPy array is a `vector`
parameter) instead of text that both sides format and parse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from functools import cache
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import TextClause, event
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from db.embedded import embedded_database_url
from db.errors import DatabaseUnavailable
from db.settings import DatabaseSettings

# The HNSW search list every connection starts with; the retriever raises it for large corpora
# (knowledge.search.retrieval.ef_search_for, where the measurements are). With the iterative scan on, a longer candidate
# list is still returned (the scan goes on).
HNSW_EF_SEARCH = 200
# How many index tuples an iterative HNSW scan may visit before giving up (pgvector's default). A scan can stop
# short when the rows it meets are filtered out (other people's chunks) or dead (a large delete not yet vacuumed);
# the retriever then falls back to an exact search, and syncs VACUUM after large deletes.
HNSW_MAX_SCAN_TUPLES = 20_000


def database_url(settings: DatabaseSettings | None = None, url: str | None = None) -> str:
    """DATABASE_URL if set (normalised to the psycopg 3 driver), else the embedded server's URL. Given `url` (one
    of DATABASE_REPLICA_URLS), that one, checked and normalised the same way."""
    settings = settings or DatabaseSettings()
    if url is None and not settings.database_url:
        return embedded_database_url(settings.home)
    setting = "DATABASE_URL" if url is None else "DATABASE_REPLICA_URLS"
    url = (url or settings.database_url or "").strip()
    check_database_url(url, setting)
    authority = url.partition("://")[2].partition("/")[0]
    if authority.count("@") > 1:
        raise DatabaseUnavailable(
            f"{setting} has more than one '@' before the host: URL-encode special characters in the password "
            "('@' is %40, '#' is %23, '/' is %2F)"
        )
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://", "postgresql+asyncpg://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


_POSTGRES_SCHEMES = ("postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg2", "postgresql+asyncpg")
_URL_EXAMPLE = "postgresql://USER:PASSWORD@HOST:5432/DATABASE"


def check_database_url(url: str, setting: str = "DATABASE_URL") -> None:
    """A malformed DATABASE_URL gets one line naming the fix (never a traceback, never the password)."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        raise DatabaseUnavailable(
            f"{setting} is not a URL (no '://' after the scheme): it should look like {_URL_EXAMPLE}"
        )
    if scheme.lower() not in _POSTGRES_SCHEMES:
        raise DatabaseUnavailable(
            f"{setting} uses {scheme[:30]!r}, but ragbot needs PostgreSQL with pgvector: use a URL like "
            f"{_URL_EXAMPLE}, or unset {setting}" + (" for the embedded database" if setting == "DATABASE_URL" else "")
        )
    try:
        make_url(url)
    except (ArgumentError, ValueError):
        raise DatabaseUnavailable(f"{setting} could not be parsed: it should look like {_URL_EXAMPLE}") from None


CUSTOM_PLANS = "force_custom_plan"


async def read_rows(
    conn: AsyncConnection,
    statement: TextClause,
    params: Mapping[str, Any],
    *,
    generic_plan: bool = False,
    settings: Mapping[str, str] | None = None,
) -> list[Any]:
    """The rows of a read-only `statement` (as named tuples: `row.id`), run by psycopg itself on `conn`'s driver
    connection. Why: SQLAlchemy's execute path (its greenlet hops, execution context and result wrapping) costs
    about 0.6 ms of Python a statement, and a search's two statements run on an event loop that shares two cores
    with the question's embedding and Postgres: going round it, a hybrid search at 100k chunks took about 1 ms less
    CPU and returned the same hits (README, "Speed"). Only for text() statements whose parameters psycopg adapts
    itself (strings, numbers, lists, NumPy vectors, None), as SQLAlchemy would pass them through.

    `generic_plan` plans the statement with Postgres' generic plans (once per connection after psycopg prepares it,
    on its fifth run) instead of at every run as every connection's CUSTOM_PLANS has it: only for a statement whose
    plan barely depends on its parameters' values. Planning BM25's statement took about 2 ms of its 5.7 at 100k
    chunks, and with a generic plan it returned the same rows 2-2.7 ms sooner at 10k, 100k and 1M.

    `settings` are session settings the statement needs (such as `hnsw.ef_search`), each SET only where the pooled
    connection's value differs from it, as remembered in the connection's `info` (where create_engine's connect
    hook records the defaults): a round trip only when it changes.

    A connection whose statement failed or was cancelled is closed rather than pooled, since it may still be busy
    with it or keep the generic setting."""
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None, "a pooled connection that is checked out has its driver connection"
    if conn.info.get(TRANSACTION_POOLER):
        return await _read_rows_pooled(conn, driver, statement, params, settings)
    try:
        async with driver.cursor(row_factory=namedtuple_row) as cursor:
            for name, value in (settings or {}).items():
                if conn.info.get(name) != value:
                    await cursor.execute("SELECT set_config(%s, %s, false)", (name, value))
                    conn.info[name] = value
            if generic_plan:
                await cursor.execute("SET plan_cache_mode = force_generic_plan")
            await cursor.execute(_driver_sql(statement, conn.dialect), params)
            rows = await cursor.fetchall()
            if generic_plan:
                await cursor.execute(f"SET plan_cache_mode = {CUSTOM_PLANS}")
        return rows
    except psycopg.Error as exc:
        raise await _driver_failure(conn, statement, exc) from exc
    except BaseException:
        await conn.invalidate()
        raise


async def _driver_failure(conn: AsyncConnection, statement: TextClause, exc: psycopg.Error) -> StatementError:
    """The connection a driver-level read failed on is dropped, and the error is the one SQLAlchemy's own execute
    would raise (callers catch DBAPIError), without the parameters (a question and its 384 floats) in its message."""
    await conn.invalidate()
    return DBAPIError.instance(
        str(statement), None, exc, psycopg.Error, hide_parameters=True, connection_invalidated=True,
        dialect=conn.dialect,
    )


async def _read_rows_pooled(
    conn: AsyncConnection, driver: Any, statement: TextClause, params: Mapping[str, Any],
    settings: Mapping[str, str] | None,
) -> list[Any]:
    """read_rows behind a pooler in transaction mode (DATABASE_POOLER=transaction): each statement may run on
    another server connection, so nothing is left on one. The settings a search needs (the connection defaults of
    create_engine and `settings`) are set for one transaction (set_config's is_local), with the statement; nothing
    is prepared (prepare_threshold=None), so generic plans are not used.

    Not in pipeline mode: there psycopg follows each Sync with a Flush, also after COMMIT's. PgBouncer (1.18, as
    Debian ships it) releases the server connection at COMMIT's ReadyForQuery; a Flush that reaches it after that
    is sent to a server connection as a request of its own, which Postgres never answers (a Flush has nothing to
    flush), so that server connection stays assigned to a client that is idle in ragbot's pool, until that client
    disconnects. Each such race lost a server connection; with a pool of two, every client then waited for one until
    query_wait_timeout (tests/test_pooler.py). Four round trips through a pooler on the same network cost well
    under a millisecond more than the pipeline's three."""
    wanted = {**SESSION_SETTINGS, **(settings or {})}
    try:
        async with driver.transaction(), driver.cursor(row_factory=namedtuple_row) as cursor:
            await cursor.execute(
                "SELECT " + ", ".join(f"set_config(%s, %s, true) AS s{n}" for n in range(len(wanted))),
                [item for pair in wanted.items() for item in pair],
            )
            await cursor.execute(_driver_sql(statement, conn.dialect), params)
            rows = await cursor.fetchall()
        return rows
    except psycopg.Error as exc:
        raise await _driver_failure(conn, statement, exc) from exc
    except BaseException:
        await conn.invalidate()
        raise


def connection_lost(error: DBAPIError) -> bool:
    """Whether a statement failed because its connection went away (the server stopped, failed over or restarted,
    a pooler restarted), so that running it again on a new connection can succeed; a cancelled statement (a timeout)
    is not."""
    return isinstance(error.orig, psycopg.OperationalError) and not isinstance(error.orig, psycopg.errors.QueryCanceled)


@cache
def _driver_sql(statement: TextClause, dialect: Dialect) -> str:
    """`statement` as psycopg takes it (`:name` → `%(name)s`, a literal % doubled), compiled once."""
    return str(statement.compile(dialect=dialect))


# What create_engine's connect hook sets on each connection (below, where each is explained); behind a pooler in
# transaction mode they are set per transaction instead (_read_rows_pooled).
SESSION_SETTINGS = {
    "hnsw.iterative_scan": "relaxed_order",
    "hnsw.ef_search": str(HNSW_EF_SEARCH),
    "hnsw.max_scan_tuples": str(int(HNSW_MAX_SCAN_TUPLES)),
    "plan_cache_mode": CUSTOM_PLANS,
    "jit": "off",
}
# The key, in a pooled connection's `info`, saying a transaction-mode pooler is in front (read_rows reads it).
TRANSACTION_POOLER = "ragbot.transaction_pooler"


def create_engine(url: str, *, autocommit: bool = False, transaction_pooler: bool | None = None,
                  async_creator: Callable[[], Awaitable[Any]] | None = None, pool_size: int = 5,
                  max_overflow: int = 5) -> AsyncEngine:
    """The engine for `url`, every connection set up for pgvector (below). `autocommit` makes a pool for read-only
    statements only, such as the searches': its connections never hold a transaction, and so never roll one back.
    That matters because psycopg's rollback drops every statement the connection had prepared (and with it a
    generic plan, see read_rows): on a pool shared with the bot's read-only transactions (conversation memory,
    channel grants, identities), a search would seldom find its statements prepared. `pool_size` and
    `max_overflow` size the pool (5 + 5; a small pool of its own serves the leases' renewals, see
    `KnowledgeBase.lease_engine`)."""
    if transaction_pooler is None:
        transaction_pooler = DatabaseSettings().transaction_pooler
    options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
    if transaction_pooler:
        # A transaction-mode pooler hands each transaction to any server connection: a statement psycopg prepared
        # on one is unknown on the next (error 26000), so nothing is prepared.
        options["connect_args"] = {"prepare_threshold": None}
    if async_creator is not None:
        options["async_creator"] = async_creator
    engine = create_async_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=max_overflow,
                                 **options)

    @event.listens_for(engine.sync_engine, "connect")
    def _configure_pgvector(dbapi_connection, connection_record) -> None:
        dbapi_connection.run_async(_register_vector_type)
        if transaction_pooler:
            # No session settings: they would stay on whichever server connection ran them. read_rows sets what a
            # search needs in the search's own transaction.
            connection_record.info[TRANSACTION_POOLER] = True
            dbapi_connection.commit()
            return
        cursor = dbapi_connection.cursor()
        cursor.execute("SET hnsw.iterative_scan = relaxed_order")
        cursor.execute(f"SET hnsw.ef_search = {HNSW_EF_SEARCH}")
        connection_record.info["hnsw.ef_search"] = str(HNSW_EF_SEARCH)  # what read_rows' `settings` compare with
        cursor.execute(f"SET hnsw.max_scan_tuples = {int(HNSW_MAX_SCAN_TUPLES)}")
        # psycopg prepares a statement run five times on one pooled connection, and Postgres may then switch to a
        # generic plan made without the parameters' values. For the search statement that plan skips the HNSW
        # index (it cannot see the query vector) and scores every chunk: 1.5 s instead of 15 ms at 100k chunks
        # (bench/search.py). Each execution is planned for its own values; the plan costs about a millisecond.
        cursor.execute(f"SET plan_cache_mode = {CUSTOM_PLANS}")
        # JIT compilation pays off for long analytical queries, not for a search of a few milliseconds whose cost
        # estimate can still cross jit_above_cost at scale (compiling then takes tens of milliseconds).
        cursor.execute("SET jit = off")
        cursor.close()
        # Commit: the SETs ran in the driver's implicit transaction, and a read-only first use of the connection
        # ends in a rollback, which would silently undo them.
        dbapi_connection.commit()

    return engine


class BinaryArray(list):
    """A list parameter sent as a binary array: each element length-prefixed, nothing to quote on our side or to
    parse on Postgres'. psycopg sends a plain list as a text array, and for embeddings (NumPy arrays)
    pgvector-python then formats every float of every vector in Python. For a batch of 2,000 chunks: the
    embeddings in about 40 ms instead of 1.3 s, their texts in about 12 ms instead of 100."""


async def _register_vector_type(connection) -> None:
    """pgvector-python's adapters for `vector` on this connection: a NumPy array is sent as a binary vector, a
    BinaryArray of them as a binary vector[] (2,000 chunk embeddings in about 40 ms, against about 400 ms as text
    literals), and a vector column is read as a `pgvector.Vector`. A database without the extension yet (before
    its first migration) has no type to register; `db.migrate.upgrade_to_head` drops the connections it made once
    it has created it."""
    from pgvector.psycopg.vector import register_vector_info
    from psycopg.types import TypeInfo
    from psycopg.types.array import ListBinaryDumper

    connection.adapters.register_dumper(BinaryArray, ListBinaryDumper)
    info = await TypeInfo.fetch(connection, "vector")
    if info is not None:
        register_vector_info(connection, info)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
