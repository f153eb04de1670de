"""Test fixtures: one embedded Postgres for the whole run, a fresh database per test that needs one.

Every test runs against real PostgreSQL 18 + pgvector and the real embedding model. A migrated template database
is built once; `fresh_kb` clones it (CREATE DATABASE ... TEMPLATE, a fraction of a second) so tests never see
each other's documents or BM25 statistics. The handbook is ingested once into its own database and shared by the
tests that only read it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

# Before anything reads settings: no developer .env, no real keys, no external database, an isolated home.
_HOME = Path(tempfile.mkdtemp(prefix="ragbot-tests-"))
os.environ["RAGBOT_HOME"] = str(_HOME)
os.environ["DATABASE_URL"] = ""
os.environ["ANTHROPIC_API_KEY"] = ""
os.environ["HF_HUB_OFFLINE"] = "1"
# Questions are embedded by the NumPy encoder, whose vectors equal sentence-transformers' (the answer floors were
# measured with them), so no test depends on whether an earlier one built an ONNX file; the ONNX encoders (the
# default, fp32, gives the same vectors) are tested, and built once, in tests/test_query_encoder.py.
os.environ["QUERY_ENCODER"] = "numpy"
for _name in ("SLACK_BOT_TOKEN", "DISCORD_BOT_TOKEN", "DISCORD_TOKEN", "ANTHROPIC_BASE_URL", "FUSION", "EMBEDDING_MODEL"):
    os.environ.pop(_name, None)

import psycopg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from db.embedded import embedded_database_url, stop_embedded
from db.engine import create_engine
from db.migrate import upgrade_to_head
from db.settings import DatabaseSettings
from knowledge.kb import KnowledgeBase
from knowledge.settings import KnowledgeSettings
from knowledge.sources.folder import FolderSource

REPO = Path(__file__).resolve().parent.parent
HANDBOOK = REPO / "examples" / "handbook"
TEMPLATE_DB = "ragbot_template"


def database_url_for(server_url: str, name: str) -> str:
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def _admin(server_url: str) -> psycopg.Connection:
    url = make_url(server_url).set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)


def create_database(server_url: str, name: str, template: str | None = None) -> str:
    with _admin(server_url) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return database_url_for(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    with _admin(server_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_settings(**overrides: object) -> KnowledgeSettings:
    return KnowledgeSettings(_env_file=None, **overrides)  # type: ignore[call-arg]


test_settings.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test, wherever it is imported


@pytest.fixture(scope="session")
def ragbot_home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def server_url() -> str:
    url = embedded_database_url(_HOME, keep_running=True)
    yield url
    stop_embedded(_HOME)
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest_asyncio.fixture(scope="session")
async def template_db(server_url: str) -> str:
    url = create_database(server_url, TEMPLATE_DB)
    engine = create_engine(url)
    await upgrade_to_head(engine)
    await engine.dispose()
    return TEMPLATE_DB


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


@pytest_asyncio.fixture(scope="session")
async def handbook_url(server_url: str, template_db: str) -> str:
    """A database holding the example handbook, ingested once as source `handbook`."""
    url = create_database(server_url, "handbook", template_db)
    kb = await KnowledgeBase.open(test_settings(), DatabaseSettings(_env_file=None, database_url=url))  # type: ignore[call-arg]
    report = await kb.sync(FolderSource(HANDBOOK, "handbook"))
    assert not report.failed, report.failed
    await kb.close()
    return url


@pytest_asyncio.fixture(scope="session")
async def handbook_kb(handbook_url: str) -> AsyncIterator[KnowledgeBase]:
    kb = await KnowledgeBase.open(test_settings(), DatabaseSettings(_env_file=None, database_url=handbook_url))  # type: ignore[call-arg]
    yield kb
    await kb.close()


def write(root: Path, relative: str, content: str | bytes) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path
