"""Reads from a real streaming standby (DATABASE_REPLICA_URLS): a primary made by initdb and a hot standby cloned from
it by `pg_basebackup -R`, both started from the embedded server's binaries (tests/pg_cluster.py).

A user sees: the same answers whichever server reads, a synced document searchable on the standby within the lag
limit, a standby that falls behind or goes away skipped (the primary answers) and shown in /healthz and /metrics,
and no question lost when the standby stops in the middle of a run.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from conftest import HANDBOOK, test_settings, write
from pg_cluster import Cluster, Server, wait_for_replay
from prometheus_client.parser import text_string_to_metric_families

from bot.server import BotMetrics, build_web_app, check_health
from db.engine import create_engine
from db.migrate import upgrade_to_head
from db.settings import DatabaseSettings
from knowledge import KnowledgeBase, SearchFilters
from knowledge.sources.folder import FolderSource

EVERYONE = ["everyone"]
QUESTIONS = [json.loads(line)["question"] for line in (HANDBOOK / "eval.jsonl").read_text().splitlines()
             if all(path.startswith("policies/") for path in json.loads(line)["relevant"])][:6]


def settings_for(primary: str, replica: str | None = None, max_lag: float = 30.0) -> DatabaseSettings:
    return DatabaseSettings(_env_file=None, database_url=primary,  # type: ignore[call-arg]
                            database_replica_urls=replica or "", replica_max_lag_seconds=max_lag)


@pytest_asyncio.fixture(scope="module")
async def cluster() -> AsyncIterator[tuple[Server, Server]]:
    """A primary holding the handbook's policies (migrated, synced), and a standby streaming from it."""
    with Cluster() as made:
        primary = made.primary()
        primary.execute("CREATE DATABASE ragbot")
        engine = create_engine(primary.url_for("ragbot"))
        await upgrade_to_head(engine)
        await engine.dispose()
        kb = await KnowledgeBase.open(test_settings(), settings_for(primary.url_for("ragbot")))
        report = await kb.sync(FolderSource(HANDBOOK / "policies", "policies"))
        assert report.added and not report.failed
        await kb.close()
        standby = made.standby(primary)
        wait_for_replay(primary, standby, "ragbot")
        yield primary, standby


async def open_pair(primary: Server, standby: Server, max_lag: float = 30.0) -> tuple[KnowledgeBase, KnowledgeBase]:
    on_primary = await KnowledgeBase.open(test_settings(), settings_for(primary.url_for("ragbot")))
    with_standby = await KnowledgeBase.open(
        test_settings(), settings_for(primary.url_for("ragbot"), standby.url_for("ragbot"), max_lag))
    assert with_standby.replicas is not None
    await with_standby.replicas.check_now()
    return on_primary, with_standby


def served(kb: KnowledgeBase) -> tuple[int, int]:
    """(read connections opened on the standby, on the primary) by the knowledge base's read engine."""
    assert kb.replicas is not None
    return kb.replicas.replicas[0].reads, kb.replicas.primary_reads


async def test_answers_through_the_standby_equal_answers_through_the_primary(cluster):
    primary, standby = cluster
    on_primary, with_standby = await open_pair(primary, standby)
    try:
        assert with_standby.replicas is not None and with_standby.replicas.usable_replicas()
        for n, question in enumerate(QUESTIONS):
            expected = await on_primary.answer(question, EVERYONE, f"p{n}")
            # The answer's conversation turn is written too: on the primary, or this would fail on a read-only standby.
            got = await with_standby.answer(question, EVERYONE, f"s{n}")
            assert got.text == expected.text
            assert [c.title for c in got.citations] == [c.title for c in expected.citations]
            hits = await with_standby.search(question, SearchFilters())
            assert [h.chunk_id for h in hits.hits] == [
                h.chunk_id for h in (await on_primary.search(question, SearchFilters())).hits]
        assert served(with_standby)[0] > 0 and served(with_standby)[1] == 0, "every read went to the standby"
        assert (await with_standby.status()).documents == (await on_primary.status()).documents
    finally:
        await on_primary.close()
        await with_standby.close()


async def test_a_synced_document_is_searchable_on_the_standby_within_the_lag_limit(cluster, tmp_path: Path):
    primary, standby = cluster
    max_lag = 10.0
    on_primary, with_standby = await open_pair(primary, standby, max_lag)
    try:
        write(tmp_path, "parking.md", "# Parking\n\nThe bicycle cage code is 4471; ask facilities for the badge.")
        report = await on_primary.sync(FolderSource(tmp_path, "facilities-new"))
        assert report.added
        synced = time.monotonic()
        found = False
        while not found and time.monotonic() - synced < max_lag:
            hits = await with_standby.search("bicycle cage code", SearchFilters(), k=3)
            found = any("4471" in h.text for h in hits.hits)
            if not found:
                await asyncio.sleep(0.1)
        assert found, f"the new document was not searchable on the standby within {max_lag} s"
        assert served(with_standby)[1] == 0, "the search was served by the standby, not the primary"
    finally:
        await on_primary.close()
        await with_standby.close()


async def test_a_lagging_standby_is_skipped_and_shown_in_healthz_and_metrics(cluster, tmp_path: Path):
    primary, standby = cluster
    on_primary, with_standby = await open_pair(primary, standby, max_lag=1.0)
    metrics = BotMetrics()
    build_web_app(with_standby, metrics)
    assert with_standby.replicas is not None
    name = with_standby.replicas.replicas[0].name
    standby.execute("SELECT pg_wal_replay_pause()")
    try:
        write(tmp_path, "lockers.md", "# Lockers\n\nLocker keys are returned to reception on Fridays before noon.")
        await on_primary.sync(FolderSource(tmp_path, "lockers"))
        for _ in range(100):  # until the watcher sees the standby more than a second behind
            await with_standby.replicas.check_now()
            if not with_standby.replicas.usable_replicas():
                break
            await asyncio.sleep(0.1)
        health = await check_health(with_standby)
        assert health.checks[f"replica {name}"].startswith("skipped: lag")
        scraped = {family.name: family for family in text_string_to_metric_families(metrics.render().decode())}
        lag = next(s.value for s in scraped["ragbot_replica_lag_seconds"].samples if s.labels["replica"] == name)
        assert lag > 1.0
        assert next(s.value for s in scraped["ragbot_replica_serving"].samples if s.labels["replica"] == name) == 0
        # The primary answers in the meantime, so the new document is already found.
        hits = await with_standby.search("when are locker keys returned", SearchFilters(), k=3)
        assert any("Fridays" in h.text for h in hits.hits)
        assert served(with_standby)[1] > 0
    finally:
        standby.execute("SELECT pg_wal_replay_resume()")
    wait_for_replay(primary, standby, "ragbot")
    await with_standby.replicas.check_now()
    assert with_standby.replicas.usable_replicas(), "a standby that caught up serves again"
    assert (await check_health(with_standby)).checks[f"replica {name}"].startswith("ok")
    await on_primary.close()
    await with_standby.close()


async def test_stopping_the_standby_mid_run_loses_no_question(cluster):
    """Last in this module: it stops the standby."""
    primary, standby = cluster
    on_primary, with_standby = await open_pair(primary, standby)
    try:
        expected = [(await on_primary.answer(q, EVERYONE, f"e{n}")).text for n, q in enumerate(QUESTIONS)]
        answered: list[str] = []

        async def ask_all() -> None:
            for round_ in range(3):
                for n, question in enumerate(QUESTIONS):
                    answered.append((await with_standby.answer(question, EVERYONE, f"r{round_}-{n}")).text)

        asking = asyncio.create_task(ask_all())
        while len(answered) < len(QUESTIONS) and not asking.done():
            await asyncio.sleep(0.05)
        await asyncio.to_thread(standby.stop, "fast")  # connections to it are cut mid-run
        await asking  # no question raised
        assert answered == expected * 3
        assert with_standby.replicas is not None
        await with_standby.replicas.check_now()
        health = await check_health(with_standby)
        assert health.checks["database"] == "ok" and health.checks[f"replica {with_standby.replicas.replicas[0].name}"].startswith(
            "skipped: unreachable")
        assert math.isnan(with_standby.replicas.replicas[0].lag_seconds or math.nan)
    finally:
        await on_primary.close()
        await with_standby.close()


def test_a_malformed_replica_url_gets_one_line_naming_the_setting():
    from db.engine import database_url
    from db.errors import DatabaseUnavailable

    for bad, expected in (("mysql://u:secret@h/db", "DATABASE_REPLICA_URLS uses 'mysql'"),
                          ("standby:5432", "DATABASE_REPLICA_URLS is not a URL")):
        try:
            database_url(settings_for("postgresql://u@h/db", bad), bad)
        except DatabaseUnavailable as error:
            assert str(error).startswith(expected) and "secret" not in str(error) and "\n" not in str(error)
        else:
            raise AssertionError(f"{bad!r} was accepted")
