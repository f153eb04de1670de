"""ragbot behind a real PgBouncer in transaction pooling mode (DATABASE_POOLER=transaction), in front of the embedded
server: each transaction may run on another server connection, so nothing may be prepared on one connection and
used on the next, no session setting is assumed, and the one-sync-per-source rule holds by leases, not session
advisory locks.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import HANDBOOK, test_settings
from fakes.confluence_api import FakeConfluence
from pg_cluster import Bouncer, _system_user, backend_of
from sqlalchemy import text
from sqlalchemy.engine import make_url

from db.engine import create_engine, read_rows
from db.settings import DatabaseSettings
from knowledge import KnowledgeBase, SearchFilters
from knowledge.errors import SourceBusy
from knowledge.ingest.schedule import start_scheduler
from knowledge.sources.folder import FolderSource

QUESTIONS = ["How many PTO days do I get in my first year?", "How many sick days do we get per year?",
             "Can I carry over unused vacation days?", "Who approves parental leave?"]
SESSIONS = 800  # each logs a login and a close: well past the 64 KiB a pipe holds


@pytest.fixture
def bouncer(server_url: str) -> Iterator[Callable[..., Bouncer]]:
    """Start pgbouncers (transaction mode, `pool_size` server connections) in front of the embedded server."""
    started: list[Bouncer] = []
    root = Path(tempfile.mkdtemp(prefix="ragbot-bouncer-"))  # readable by the user pgbouncer runs as
    root.chmod(0o777)

    def start(pool_size: int, server_lifetime: int = 3600) -> Bouncer:
        started.append(Bouncer(backend_of(server_url), root, _system_user(), pool_size=pool_size,
                               server_lifetime=server_lifetime))
        return started[-1]

    yield start
    for made in started:
        made.stop()
    shutil.rmtree(root, ignore_errors=True)


async def open_pooled(url: str) -> KnowledgeBase:
    return await KnowledgeBase.open(test_settings(), DatabaseSettings(  # type: ignore[call-arg]
        _env_file=None, database_url=url, database_pooler="transaction"))


async def test_answers_and_syncs_work_through_pgbouncer_in_transaction_mode(bouncer, fresh_database, kb_factory):
    name = make_url(fresh_database()).database
    direct = await kb_factory(fresh_database())
    # PgBouncer replaces its server connections after a second here (an hour by default): statements prepared on
    # the old ones are gone, which a client that prepared them would find out at its next run of them.
    pooled = await open_pooled(bouncer(2, server_lifetime=1).url_for(name))
    try:
        for kb in (direct, pooled):
            report = await kb.sync(FolderSource(HANDBOOK / "policies", "policies"))
            assert report.added and not report.failed
        # Many times the same statements, several at once: psycopg would prepare them on the fifth run, and the
        # next transaction, on another server connection, would not find them.
        expected = [[h.text for h in (await direct.search(q, SearchFilters(), k=5)).hits] for q in QUESTIONS * 2]
        for _ in range(3):
            # One after another (one pooled connection runs each statement often enough for psycopg to prepare
            # it), then several at once; between rounds the pooler's server connections are replaced.
            got = [await pooled.search(q, SearchFilters(), k=5) for q in QUESTIONS * 2]
            got += await asyncio.gather(*(pooled.search(q, SearchFilters(), k=5) for q in QUESTIONS * 2))
            assert [[h.text for h in r.hits] for r in got] == expected * 2
            await asyncio.sleep(2)  # past the server connections' lifetime
        for n, question in enumerate(QUESTIONS):
            assert (await pooled.answer(question, ["everyone"], f"c{n}")).text == (
                await direct.answer(question, ["everyone"], f"c{n}")).text
        assert (await pooled.status()).chunks == (await direct.status()).chunks
    finally:
        await pooled.close()


async def test_a_source_held_by_one_process_is_busy_for_another_behind_one_server_connection(
        bouncer, fresh_database, tmp_path):
    """One server connection behind the pooler: a session lock taken through it would be taken again, by the other
    process, on the same connection. The source's lease is a row: the second process finds the source busy."""
    name = make_url(fresh_database()).database
    url = bouncer(1).url_for(name)
    first, second = await open_pooled(url), await open_pooled(url)
    try:
        (tmp_path / "docs").mkdir()
        (tmp_path / "docs" / "a.md").write_text("# A\n\nAlpha.")
        await first.add_source("docs", "folder", {"path": str(tmp_path / "docs")})
        async with first.engine.connect() as conn:
            row_id = (await conn.execute(text("SELECT id FROM sources WHERE name = 'docs'"))).scalar_one()
        async with first.syncs.source_lock(row_id, "docs"):
            with pytest.raises(SourceBusy, match="being synced right now"):
                await second.sync_source("docs")
            assert (await second.list_sources())[0].running
        assert (await second.sync_source("docs")).added == ["a.md"]
    finally:
        await first.close()
        await second.close()


async def test_two_schedulers_behind_one_pooler_never_run_a_source_twice(bouncer, fresh_database, monkeypatch):
    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    name = make_url(fresh_database()).database
    url = bouncer(2).url_for(name)
    first, second = await open_pooled(url), await open_pooled(url)
    try:
        with FakeConfluence(edition="cloud") as wiki:
            wiki.add_space("ENG", "Engineering")
            for n in range(4):
                wiki.add_page("ENG", f"Page {n}", f"<p>Fact number {n}: the build takes {n + 3} minutes.</p>")
            wiki.search_delay = 0.25  # each run takes a while, so two schedulers firing together would overlap
            await first.add_source("wiki", "confluence", {"url": wiki.base_url, "spaces": ["ENG"],
                                                          "email": wiki.email, "visibility": "everyone"},
                                   schedule_seconds=1, prune_seconds=2)
            handles = [await start_scheduler(kb, refresh_seconds=0.5, jitter_fraction=0.0) for kb in (first, second)]
            try:
                for _ in range(150):
                    runs = await first.sync_runs("wiki", limit=100)
                    if sum(r.status == "ok" for r in runs) >= 3:
                        break
                    await asyncio.sleep(0.2)
            finally:
                for handle in handles:
                    await handle.stop()
            wiki.search_delay = 0
        runs = sorted(await first.sync_runs("wiki", limit=100), key=lambda r: r.started_at)
        assert len(runs) >= 3 and all(r.status == "ok" for r in runs), [(r.status, r.error) for r in runs]
        for earlier, later in zip(runs, runs[1:], strict=False):
            assert earlier.finished_at <= later.started_at, "two runs of one source overlapped"
        assert runs[0].added == 4 and all(r.added == 0 for r in runs[1:])
    finally:
        await first.close()
        await second.close()



async def test_the_pooler_keeps_answering_however_much_it_has_logged(bouncer, fresh_database):
    """PgBouncer logs every client login and every server connection it replaces (each second here, with
    server_lifetime=1), also to its stderr. The tests' pooler used to have its stderr piped and never read: once
    about 64 KiB were written, the pipe was full, pgbouncer blocked in write(2) and every client behind it waited
    for good (test_answers_and_syncs_work_through_pgbouncer_in_transaction_mode stalled mid-run, more often the
    slower the machine). Several hundred short sessions log far more than that; every one must still be answered."""
    name = make_url(fresh_database()).database
    pooler = bouncer(1, server_lifetime=1)
    conninfo = make_url(pooler.url_for(name)).set(drivername="postgresql").render_as_string(hide_password=False)

    async def session(n: int) -> int:
        async with await psycopg.AsyncConnection.connect(conninfo, prepare_threshold=None, autocommit=True) as conn:
            return int((await (await conn.execute("SELECT %s::int", [n])).fetchone())[0])  # type: ignore[index]

    async def sessions() -> list[int]:
        return [await session(n) for n in range(SESSIONS)]

    # Generous: the sessions take seconds; a pooler blocked on its log never answers again.
    assert await asyncio.wait_for(sessions(), timeout=240) == list(range(SESSIONS))
    assert (pooler.dir / "pgbouncer.log").stat().st_size > 64 * 1024  # it did log past a pipe's buffer


async def test_a_read_behind_the_pooler_leaves_nothing_for_it_to_route(bouncer, fresh_database, tmp_path):
    """A transaction-mode pooler hands the server connection back to its pool at the ReadyForQuery that ends a
    transaction. A search's read (db.engine.read_rows) must send nothing after that: a message that reached the
    pooler later went to a server connection of its own, and psycopg's pipeline sent a Flush after every Sync,
    which Postgres never answers; the server connection then stayed assigned to a client idle in ragbot's pool
    (test_answers_and_syncs_work_through_pgbouncer_in_transaction_mode stalled, 2 of 8 runs). Read from psycopg's
    own protocol trace of the connection: the read's last message is one the server answers with ReadyForQuery, and
that answer (idle) is the last thing on the wire."""
    name = make_url(fresh_database()).database
    engine = create_engine(bouncer(1).url_for(name), transaction_pooler=True)
    trace = tmp_path / "protocol.txt"
    try:
        async with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:  # as the searches'
            driver = (await conn.get_raw_connection()).driver_connection
            with trace.open("w") as out:
                driver.pgconn.trace(out.fileno())
                driver.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
                rows = await read_rows(conn, text("SELECT CAST(:v AS int) AS v"), {"v": 7},
                                       settings={"hnsw.ef_search": "64"})
                driver.pgconn.untrace()
    finally:
        await engine.dispose()
    assert [r.v for r in rows] == [7]
    messages = [line.split("\t") for line in trace.read_text().splitlines()]
    sent = [m[2] for m in messages if m[0] == "F"]
    assert sent[-1] in ("Sync", "Query"), sent  # each answered by a ReadyForQuery; a Flush is answered by nothing
    last = max(i for i, m in enumerate(messages) if m[0] == "F")
    assert [m[2].strip() + m[3] for m in messages[last + 1:]][-1:] == ["ReadyForQuery I"], messages[last:]
