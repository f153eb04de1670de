"""Several sync workers on one database: each source is synced by one worker at a time (its lease, db.leases), and a
worker killed in the middle of a sync hands the source over once its lease expires; the run it left is shown as
interrupted and the next worker's run finishes the job from the last checkpoint."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from fakes.confluence_api import FakeConfluence

from knowledge.ingest.schedule import start_scheduler

PAGES = 12


async def test_a_worker_killed_mid_sync_hands_the_source_over_after_its_lease(kb_factory, fresh_database,
                                                                                monkeypatch, ragbot_home: Path):
    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    url = fresh_database()
    kb = await kb_factory(url)
    with FakeConfluence(edition="cloud") as wiki:
        wiki.add_space("ENG", "Engineering")
        for n in range(PAGES):
            wiki.add_page("ENG", f"Page {n}", f"<p>Fact number {n}: the build takes {n + 3} minutes.</p>")
        await kb.add_source("wiki", "confluence", {"url": wiki.base_url, "spaces": ["ENG"], "email": wiki.email,
                                                   "visibility": "everyone"}, schedule_seconds=1)
        wiki.search_delay = 1.0  # the first worker's run lasts long enough to be killed in the middle
        env = {**os.environ, "DATABASE_URL": url, "SYNC_LEASE_SECONDS": "3", "CONFLUENCE_API_TOKEN": "good-token",
               "RAGBOT_HOME": str(ragbot_home), "PYTHONPATH": str(REPO)}
        first_worker = subprocess.Popen([sys.executable, "-m", "bot.cli", "sync", "wiki"], env=env, cwd=REPO,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                if any(s.running for s in await kb.list_sources()):
                    break
                await asyncio.sleep(0.1)
            assert any(s.running for s in await kb.list_sources()), "the first worker never started its sync"
        finally:
            first_worker.send_signal(signal.SIGKILL)  # the host is gone: no clean-up, its lease is left to expire
            first_worker.wait()
        wiki.search_delay = 0
        assert (await kb.list_sources())[0].running, "the dead worker's lease holds until it expires"

        handle = await start_scheduler(kb, refresh_seconds=0.5, jitter_fraction=0.0)  # the second worker
        try:
            for _ in range(300):
                runs = await kb.sync_runs("wiki")
                if any(r.trigger == "schedule" and r.status == "ok" for r in runs):
                    break
                await asyncio.sleep(0.2)
        finally:
            await handle.stop()
    runs = sorted(await kb.sync_runs("wiki"), key=lambda r: r.started_at)
    assert runs[0].trigger == "cli" and runs[0].status == "interrupted"
    assert any(r.trigger == "schedule" and r.status == "ok" for r in runs[1:]), [(r.trigger, r.status) for r in runs]
    assert (await kb.status()).documents == PAGES
    assert not (await kb.list_sources())[0].running
