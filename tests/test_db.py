"""The database layer: every pooled connection is set up for filtered vector search, and URLs never leak."""

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from db.engine import HNSW_EF_SEARCH, create_engine, read_rows
from db.settings import redact_url


async def test_every_pooled_connection_keeps_the_pgvector_settings(fresh_database):
    engine = create_engine(fresh_database())
    try:
        async def read_settings() -> tuple[str, ...]:
            async with engine.connect() as conn:  # read-only use: ends in a rollback
                row = (await conn.execute(text("SELECT current_setting('hnsw.iterative_scan', true), "
                                               "current_setting('hnsw.ef_search', true), "
                                               "current_setting('plan_cache_mode'), current_setting('jit')"))).one()
                await asyncio.sleep(0.05)  # hold the connection so the others need their own
                return tuple(row)

        first = await asyncio.gather(*(read_settings() for _ in range(4)))
        again = await asyncio.gather(*(read_settings() for _ in range(4)))  # the same connections, reused
        # Custom plans: a generic plan of the search statement (psycopg prepares it on its fifth run on a pooled
        # connection) cannot use the HNSW index and scores every chunk.
        assert set(first) | set(again) == {("relaxed_order", str(HNSW_EF_SEARCH), "force_custom_plan", "off")}
    finally:
        await engine.dispose()


async def test_generic_plans_last_for_their_statement_and_a_connection_whose_statement_failed_is_closed(
    fresh_database,
):
    """BM25's statement runs with generic plans (db.engine.read_rows, generic_plan=True); no pooled connection may
    keep them, or the HNSW statement would get a generic plan that scores every chunk."""
    engine = create_engine(fresh_database())
    reads = engine.execution_options(isolation_level="AUTOCOMMIT")  # as searches read: a SET outlives a statement
    mode_and_pid = text("SELECT current_setting('plan_cache_mode') AS mode, pg_backend_pid() AS pid")
    try:
        async with reads.connect() as conn:
            (inside,) = await read_rows(conn, mode_and_pid, {}, generic_plan=True)
            assert inside.mode == "force_generic_plan"
            assert (await conn.execute(mode_and_pid)).one()[0] == "force_custom_plan"
        async with reads.connect() as conn:
            failed_pid = (await conn.execute(mode_and_pid)).one()[1]
            with pytest.raises(DBAPIError, match="division by zero"):  # the error SQLAlchemy's execute raises
                await read_rows(conn, text("SELECT 1 / :zero"), {"zero": 0}, generic_plan=True)

        connections = await asyncio.gather(*(_pooled(reads, mode_and_pid) for _ in range(5)))
        assert {mode for mode, _ in connections} == {"force_custom_plan"}
        assert failed_pid not in {pid for _, pid in connections}
    finally:
        await engine.dispose()


async def test_a_read_cancelled_midway_leaves_no_connection_with_generic_plans_in_the_pool(fresh_database):
    """A search whose other half failed cancels BM25's statement midway, before its generic plans are set back;
    that connection must not be handed to the next search, whose HNSW statement would scan every chunk."""
    engine = create_engine(fresh_database())
    reads = engine.execution_options(isolation_level="AUTOCOMMIT")
    try:
        async def slow_read() -> None:
            async with reads.connect() as conn:
                await read_rows(conn, text("SELECT pg_sleep(:s)"), {"s": 30}, generic_plan=True)

        task = asyncio.create_task(slow_read())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        mode_and_plus = text("SELECT current_setting('plan_cache_mode') AS mode, CAST(:a AS int) + 1 AS plus")
        answers = await asyncio.wait_for(
            asyncio.gather(*(_read_once(reads, mode_and_plus, {"a": i}) for i in range(5))), timeout=10
        )
        assert [(row.mode, row.plus) for row in answers] == [("force_custom_plan", i + 1) for i in range(5)]
    finally:
        await engine.dispose()


async def _read_once(reads, statement, params):  # type: ignore[no-untyped-def]
    async with reads.connect() as conn:
        (row,) = await read_rows(conn, statement, params)
        await asyncio.sleep(0.05)  # hold the connection so the others need their own
        return row


async def _pooled(reads, mode_and_pid) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    async with reads.connect() as conn:
        row = (await conn.execute(mode_and_pid)).one()
        await asyncio.sleep(0.05)  # hold the connection so the others need their own
        return row[0], row[1]


def test_database_urls_are_redacted_even_when_the_password_is_not_url_encoded():
    assert redact_url("postgresql://bob:p@ss#word@db.example.com:5432/kb") == "postgresql://bob:***@db.example.com:5432/kb"
    assert redact_url("postgresql+psycopg://postgres:@/postgres?host=/tmp/x") == "postgresql+psycopg://postgres:***@/postgres?host=/tmp/x"
    assert redact_url("postgresql://db.example.com/kb") == "postgresql://db.example.com/kb"


async def test_upgrading_an_indexed_database_rebuilds_its_vector_index_in_half_precision(fresh_database):
    """Migration 0007: a database indexed before it (full-precision HNSW) gets the halfvec index that searches now
    order by, and loses the old one; the chunks and their full-precision vectors are untouched."""
    from migrating import migrate_to

    from db.migrate import upgrade_to_head

    url = fresh_database()
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await migrate_to(conn, "0006")
            await conn.execute(text("INSERT INTO kb_meta VALUES ('embedding_dimension', '3')"))
            await conn.execute(text("INSERT INTO sources (name, kind) VALUES ('s', 'folder')"))
            await conn.execute(text(
                "INSERT INTO documents (source_id, external_id, title, content_hash, access) "
                "SELECT id, 'a.md', 'A', 'h', '{everyone}' FROM sources"))
            await conn.execute(text(
                "INSERT INTO chunks (document_id, ordinal, text, token_count, content_hash, embedding, tsv, "
                "lexical_len, access, source_id) SELECT d.id, 0, 'x', 1, 'h', '[0.1,0.2,0.3]', 'x', 1, "
                "'{everyone}', d.source_id FROM documents d"))
            await conn.execute(text("CREATE INDEX chunks_embedding_hnsw_3 ON chunks "
                                    "USING hnsw ((embedding::vector(3)) vector_cosine_ops)"))
        await upgrade_to_head(engine)
        async with engine.connect() as conn:
            indexes = (await conn.execute(text(
                "SELECT indexname FROM pg_indexes WHERE indexname LIKE 'chunks_embedding_hnsw_%'"))).scalars().all()
            vector = (await conn.execute(text("SELECT embedding::text FROM chunks"))).scalar_one()
        assert indexes == ["chunks_embedding_hnsw_half_3"]
        assert vector == "[0.1,0.2,0.3]"
    finally:
        await engine.dispose()


async def test_the_embedded_server_is_configured_for_search(template_db, server_url):
    """The embedded Postgres is restarted once with shared_buffers = a quarter of RAM (at most 8 GB) instead of
    Postgres' 128 MB, in which a 100k-chunk index does not fit, and with reads done by the backend itself rather
    than handed to IO workers."""
    from db.embedded import shared_buffers_mb

    engine = create_engine(server_url)
    try:
        async with engine.connect() as conn:
            mb = (await conn.execute(text(
                "SELECT setting::bigint * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'"))).scalar_one()
            io_method = (await conn.execute(text("SELECT current_setting('io_method')"))).scalar_one()
        assert mb == shared_buffers_mb() >= 128
        assert io_method == "sync"
    finally:
        await engine.dispose()


def test_the_embedded_servers_cache_fits_the_containers_memory_limit(tmp_path):
    """In a container, RAM as the machine reports it is the host's: the cache is a quarter of the container's memory
    limit (cgroup v2 or v1, set on the process's group or a parent) when that is lower."""
    from db.embedded import SHARED_BUFFERS_CAP_MB, memory_mb_available, shared_buffers_mb

    ram_mb = memory_mb_available(tmp_path / "none", tmp_path / "none")  # nothing to read: the machine's RAM
    assert ram_mb is not None and ram_mb > 2048
    quarter_of_ram = max(128, min(SHARED_BUFFERS_CAP_MB, ram_mb // 4))

    def group(name: str, membership: str, limits: dict[str, str]):  # type: ignore[no-untyped-def]
        root = tmp_path / name
        for path, value in limits.items():
            (root / "cgroup" / path).parent.mkdir(parents=True, exist_ok=True)
            (root / "cgroup" / path).write_text(value + "\n")
        (root / "self-cgroup").write_text(membership + "\n")
        return root / "cgroup", root / "self-cgroup"

    # Docker with cgroup v2: the container's group is the root of its mount.
    assert shared_buffers_mb(*group("v2", "0::/", {"memory.max": str(2 * 1024**3)})) == 512
    # cgroup v2 without a limit.
    assert shared_buffers_mb(*group("v2-unlimited", "0::/", {"memory.max": "max"})) == quarter_of_ram
    # cgroup v1: the limit on a parent of the process's group, the group itself unlimited.
    v1 = group("v1", "9:pids:/\n4:memory:/jobs/bot\nnot a cgroup line\n0::/", {
        "memory/memory.limit_in_bytes": "9223372036854771712",
        "memory/jobs/memory.limit_in_bytes": str(1024**3),
        "memory/jobs/bot/memory.limit_in_bytes": "9223372036854771712",
    })
    assert shared_buffers_mb(*v1) == 256
    # A small limit still leaves Postgres its default.
    assert shared_buffers_mb(*group("small", "0::/", {"memory.max": str(256 * 1024**2)})) == 128
