"""Test fixtures: one embedded Postgres for the whole run, a fresh database per test that needs one.

Every test runs against real PostgreSQL 18 + pgvector and the real embedding model. A migrated template database
is built once for the whole run (shared by the pytest-xdist workers); `fresh_kb` clones it (CREATE DATABASE ...
TEMPLATE, a fraction of a second) so tests never see each other's documents or BM25 statistics. The handbook is
ingested once for the run into a database each worker clones, and that clone is shared by the worker's tests that
only read it. Sentence-transformers' vectors are cached on disk across tests and runs (tests/embedding_cache.py).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

# Before anything reads settings: no developer .env, no real keys, no external database, an isolated home.
_HOME = Path(tempfile.mkdtemp(prefix="ragbot-tests-"))
# One embedded Postgres for the whole run, shared by the pytest-xdist workers (each has its own databases, named
# with its worker id): one server instead of one per worker saves its start, its memory and its background work.
# It lives apart from each worker's own RAGBOT_HOME, in a folder named after the run (xdist gives every worker the
# same PYTEST_XDIST_TESTRUNUID); without xdist it is this process's own.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
_SERVER_HOME = Path(tempfile.gettempdir()) / f"ragbot-tests-server-{_RUN[:16]}" if _RUN else _HOME / "server"
# Enough for every worker's engines and CLI subprocesses at once (Postgres' default is 100).
SERVER_MAX_CONNECTIONS = 400
# The shared test server's throwaway data needs no crash safety against a power cut, and its tiny test corpora no
# parallel index builds: with max_parallel_maintenance_workers at its default (2), every sync's HNSW build (twice per
# first sync) started workers and sized shared memory for ragbot's 512 MB build budget, about a second each on 2
# loaded cores; serial, under 30 ms (the same graph). fsync and full-page writes off spare the disk flushes of every
# commit and CREATE/DROP DATABASE. A crash of Postgres itself (not of the machine) still loses nothing committed.
# Applied with a reload (each is a reload-time or per-session setting), on the first worker's start.
TEST_SERVER_SETTINGS = {"max_parallel_maintenance_workers": "0", "fsync": "off", "full_page_writes": "off"}
os.environ["RAGBOT_HOME"] = str(_HOME)
os.environ["DATABASE_URL"] = ""
os.environ["ANTHROPIC_API_KEY"] = ""
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # ONNX Runtime sends usage reports unless told not to (tests import it)
# One thread each for torch and NumPy's BLAS in the test processes and their children (set before either is imported):
# the suite's parallelism is its workers, three on two cores, and a thread pool per worker on a loaded machine spins
# waiting for its threads. tests/test_retrieval.py + test_insights_clustering.py at load 5: 62 CPU-s with the
# default pools, 20 with one thread (`-p tests.cpu_report`, docs/development.md). Set any of them to override.
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
# Questions are embedded by the NumPy encoder, whose vectors equal sentence-transformers' (the answer floors were
# measured with them), so no test depends on whether an earlier one built an ONNX file; the ONNX encoders (the
# default, fp32, gives the same vectors) are tested, and built once, in tests/test_query_encoder.py.
os.environ["QUERY_ENCODER"] = "numpy"
for _name in ("SLACK_BOT_TOKEN", "DISCORD_BOT_TOKEN", "DISCORD_TOKEN", "ANTHROPIC_BASE_URL", "FUSION", "EMBEDDING_MODEL"):
    os.environ.pop(_name, None)

import psycopg
import pytest
import pytest_asyncio
from embedding_cache import install as install_embedding_cache
from sqlalchemy.engine import make_url

from db.embedded import _pgserver, embedded_database_url, stop_embedded
from db.engine import create_engine
from db.migrate import upgrade_to_head
from db.settings import DatabaseSettings
from knowledge.kb import KnowledgeBase
from knowledge.settings import KnowledgeSettings
from knowledge.sources.folder import FolderSource

if TYPE_CHECKING:
    from fakes.discord_api import FakeDiscordAPI

# Texts the suite embedded before (this run or an earlier one) cost no model time: tests/embedding_cache.py.
EMBEDDING_CACHE = install_embedding_cache()

REPO = Path(__file__).resolve().parent.parent
HANDBOOK = REPO / "examples" / "handbook"
TEMPLATE_DB = "ragbot_template"  # shared by the workers (build_shared_database)
HANDBOOK_TEMPLATE_DB = "ragbot_handbook"  # the handbook, ingested once for the run; each worker clones it


def scoped(name: str) -> str:
    """A database name of this worker's own on the shared server ("handbook" → "handbook_gw1")."""
    return f"{name}_{_WORKER}" if _WORKER and not name.endswith(f"_{_WORKER}") else name


def database_url_for(server_url: str, name: str) -> str:
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def _admin(server_url: str) -> psycopg.Connection:
    url = make_url(server_url).set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)


def create_database(server_url: str, name: str, template: str | None = None) -> str:
    name = scoped(name)
    with _admin(server_url) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return database_url_for(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    name = scoped(name)
    with _admin(server_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# Knowledge bases opened in the tests' own process parse in a thread (PARSE_WORKERS=0, a documented setting): a
# worker subprocess per sync costs an interpreter start and the parsers' imports, 2-3 s of a 3.5 s sync of two
# files on loaded cores, in every test that builds a corpus. The workers themselves (deadline, memory limit, exit
# with their parent) are tested where that is the point, with parse_workers given (tests/test_resource_limits.py);
# `ragbot` subprocesses keep the default.
TEST_PARSE_WORKERS = 0
# The same for `ragbot` commands run in the tests' own process (CliRunner(env=IN_PROCESS_CLI_ENV)): each command
# reads its settings from the environment, so without this every in-process `ragbot ingest` or `sync` started its
# own parsing workers (tests/test_cli.py: 44 CPU seconds, 28 with it). `ragbot` subprocesses keep the default.
IN_PROCESS_CLI_ENV = {"PARSE_WORKERS": str(TEST_PARSE_WORKERS)}


def test_settings(**overrides: object) -> KnowledgeSettings:
    return KnowledgeSettings(_env_file=None, **{"parse_workers": TEST_PARSE_WORKERS, **overrides})  # type: ignore[arg-type]


test_settings.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test, wherever it is imported


@pytest.fixture(scope="session")
def ragbot_home() -> Path:
    return _HOME


# `make test-fast` runs the tests not marked `slow`: those that need none of these fixtures (no Postgres) and are not
# in a module that starts servers or subprocesses of its own. A test may also be marked @pytest.mark.slow by hand.
SERVER_FIXTURES = {"server_url"}  # every database fixture (fresh_kb, kb_factory, handbook_kb...) depends on it
SLOW_MODULES = {"test_startup_errors", "test_headless_run", "test_first_run", "test_fail_closed_small",
                "test_log_format", "test_resource_limits", "test_ingest_hardening", "test_query_encoder",
                "test_memory", "test_admin_page",
                "test_replicas"}  # starts Postgres clusters of its own (tests/pg_cluster.py), not through server_url


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or (
            module is not None and module.__name__ in SLOW_MODULES
        ):
            item.add_marker(pytest.mark.slow)


@contextmanager
def _server_lock() -> Iterator[None]:
    """Held while a worker starts, configures, joins or leaves the shared server."""
    _SERVER_HOME.mkdir(parents=True, exist_ok=True)
    with open(_SERVER_HOME / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _users(change: int) -> int:
    """The number of workers using the shared server, after `change` (under the lock)."""
    path = _SERVER_HOME / "users"
    count = (int(path.read_text() or 0) if path.exists() else 0) + change
    path.write_text(str(count))
    return count


def start_shared_server() -> str:
    """The shared server's URL: the first worker starts it (with room for every worker's connections), the others
    wait for it under the lock and join."""
    with _server_lock():
        url = embedded_database_url(_SERVER_HOME, keep_running=True)
        if _users(+1) == 1:
            with _admin(url) as conn:
                for name, value in TEST_SERVER_SETTINGS.items():
                    conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                conn.execute("SELECT pg_reload_conf()")
                current = int(conn.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]
                if current < SERVER_MAX_CONNECTIONS:
                    conn.execute(f"ALTER SYSTEM SET max_connections = {SERVER_MAX_CONNECTIONS}")
            if current < SERVER_MAX_CONNECTIONS:  # a restart applies it (as db.embedded restarts for its settings)
                server = _pgserver().get_server(_SERVER_HOME / "pgdata", cleanup_mode=None)
                with server._lock:
                    server._stop()
                    server.ensure_postgres_running()
        return url


def leave_shared_server() -> None:
    """The last worker out stops the server and deletes its data, under the lock: a worker that reaches the server
    later (its first database test came after the other worker's last) starts a new one. The folder itself, with
    the lock file every worker opens, stays (a few bytes in the temporary folder)."""
    with _server_lock():
        if _users(-1) <= 0:
            stop_embedded(_SERVER_HOME)
            shutil.rmtree(_SERVER_HOME / "pgdata", ignore_errors=True)


@pytest.fixture(scope="session")
def server_url() -> str:
    url = start_shared_server()
    yield url
    leave_shared_server()
    shutil.rmtree(_HOME, ignore_errors=True)


@contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """Held while one worker builds a database every worker clones (the others wait, then find it built)."""
    _SERVER_HOME.mkdir(parents=True, exist_ok=True)
    with open(_SERVER_HOME / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _database_exists(server_url: str, name: str) -> bool:
    with _admin(server_url) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


async def build_shared_database(server_url: str, name: str, build: Callable[[str], Awaitable[None]],
                                template: str | None = None) -> str:
    """A database built once for the whole run and cloned by every worker (CREATE DATABASE ... TEMPLATE `name`):
    the first worker to ask builds it under a lock, under a temporary name renamed when done (a worker that died
    half-way leaves no half-built database behind the final name). `build` gets its URL and must close every
    connection it opened: Postgres refuses to clone a database someone is connected to. Returns the name."""
    with _build_lock(name):
        if not _database_exists(server_url, name):
            building = f"{name}_building"
            with _admin(server_url) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{building}"' + (f' TEMPLATE "{template}"' if template else ""))
            await build(database_url_for(server_url, building))
            with _admin(server_url) as conn:
                conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
    return name


async def _migrate(url: str) -> None:
    engine = create_engine(url)
    await upgrade_to_head(engine)
    await engine.dispose()


@pytest_asyncio.fixture(scope="session")
async def template_db(server_url: str) -> str:
    """The migrated template every fresh database clones; one for the run, shared by the workers (migrating took
    each worker a few CPU seconds)."""
    return await build_shared_database(server_url, TEMPLATE_DB, _migrate)


@pytest.fixture
def fresh_database(server_url: str, template_db: str) -> Callable[[], str]:
    """Make empty, migrated databases; all are dropped after the test."""
    made: list[str] = []

    def make() -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        made.append(name)
        return create_database(server_url, name, template_db)

    yield make
    for name in made:
        drop_database(server_url, name)


@pytest_asyncio.fixture
async def kb_factory(fresh_database: Callable[[], str]):  # type: ignore[no-untyped-def]
    """Open KnowledgeBase objects (on a given database URL, or a fresh one) with setting overrides."""
    opened: list[KnowledgeBase] = []

    async def open_kb(url: str | None = None, **overrides: object) -> KnowledgeBase:
        kb = await KnowledgeBase.open(
            test_settings(**overrides), DatabaseSettings(_env_file=None, database_url=url or fresh_database())  # type: ignore[call-arg]
        )
        opened.append(kb)
        return kb

    yield open_kb
    for kb in opened:
        await kb.close()


@pytest_asyncio.fixture
async def fresh_kb(fresh_database: Callable[[], str]) -> AsyncIterator[KnowledgeBase]:
    kb = await KnowledgeBase.open(
        test_settings(), DatabaseSettings(_env_file=None, database_url=fresh_database())  # type: ignore[call-arg]
    )
    yield kb
    await kb.close()


async def _ingest_handbook(url: str) -> None:
    kb = await KnowledgeBase.open(test_settings(), DatabaseSettings(_env_file=None, database_url=url))  # type: ignore[call-arg]
    try:
        report = await kb.sync(FolderSource(HANDBOOK, "handbook"))
        assert not report.failed, report.failed
    finally:
        await kb.close()


@pytest_asyncio.fixture(scope="session")
async def handbook_url(server_url: str, template_db: str) -> str:
    """A database of this worker's own holding the example handbook, ingested as source `handbook`. The ingest is
    done once for the run (HANDBOOK_TEMPLATE_DB, by the first worker that needs it) and cloned per worker: each
    worker's own ingest cost it the embedding model's load and the handbook's embeddings (tens of CPU seconds on
    2 cores), and a clone gives the same rows."""
    await build_shared_database(server_url, HANDBOOK_TEMPLATE_DB, _ingest_handbook, template=template_db)
    return create_database(server_url, "handbook", HANDBOOK_TEMPLATE_DB)


@pytest_asyncio.fixture(scope="session")
async def handbook_kb(handbook_url: str) -> AsyncIterator[KnowledgeBase]:
    kb = await KnowledgeBase.open(test_settings(), DatabaseSettings(_env_file=None, database_url=handbook_url))  # type: ignore[call-arg]
    yield kb
    await kb.close()


def corpus_opener(kb_factory: Callable[..., Awaitable[KnowledgeBase]], tmp_path: Path,
                  corpus: dict[str, str]) -> Callable[..., Awaitable[KnowledgeBase]]:
    """What a test module's `corpus_kb` fixture returns: `await open_kb(**settings_overrides)` opens a fresh
    knowledge base with `corpus` (relative path -> file content) written under tmp_path/docs and synced as source
    `handbook` (a test can open a second one, with other settings, over the same files)."""

    async def open_kb(**overrides: object) -> KnowledgeBase:
        docs = tmp_path / "docs"
        for relative, content in corpus.items():
            write(docs, relative, content)
        kb = await kb_factory(**overrides)
        report = await kb.sync(FolderSource(docs, "handbook"))
        assert not report.failed, report.failed
        return kb

    return open_kb


@pytest_asyncio.fixture
async def discord_api() -> AsyncIterator[FakeDiscordAPI]:
    """The fake Discord REST API (tests/fakes/discord_api.py), running for one test; discord.py's API base URL, which
    the bot's `configure_api_url` points at it, is put back afterwards. discord.py is imported here, not at the top,
    so that a run of tests that need no Discord does not import it (nor show its audioop deprecation warning)."""
    import discord
    from fakes.discord_api import FakeDiscordAPI

    previous = discord.http.Route.BASE
    async with FakeDiscordAPI() as fake:
        yield fake
    discord.http.Route.BASE = previous


def write(root: Path, relative: str, content: str | bytes) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path
