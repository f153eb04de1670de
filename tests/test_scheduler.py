"""The scheduler: syncs on each source's interval, and two schedulers on one database never sync a source at once."""

from __future__ import annotations

import asyncio

import pytest
from fakes.confluence_api import FakeConfluence

from knowledge.ingest.schedule import SchedulerService, format_interval, parse_interval, start_scheduler


async def test_two_schedulers_sync_on_the_interval_and_never_overlap(kb_factory, fresh_database, monkeypatch):
    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    url = fresh_database()
    first, second = await kb_factory(url), await kb_factory(url)  # two replicas on one database
    with FakeConfluence(edition="cloud") as wiki:
        wiki.add_space("ENG", "Engineering")
        for n in range(4):
            wiki.add_page("ENG", f"Page {n}", f"<p>Fact number {n}: the build takes {n + 3} minutes.</p>")
        wiki.search_delay = 0.25  # each run takes a while, so two schedulers firing together would overlap
        await first.add_source("wiki", "confluence", {"url": wiki.base_url, "spaces": ["ENG"], "email": wiki.email,
                                                      "visibility": "everyone"}, schedule_seconds=1, prune_seconds=2)
        await first.add_source("manual", "folder", {"path": "/"}, check=False)  # no schedule: never run
        handles = [await start_scheduler(kb, refresh_seconds=0.5) for kb in (first, second)]
        assert handles[0].jobs() == ["prune:wiki", "sync:wiki"]
        try:
            for _ in range(100):
                runs = await first.sync_runs("wiki", limit=100)
                if sum(r.status == "ok" for r in runs) >= 3:
                    break
                await asyncio.sleep(0.2)
        finally:
            for handle in handles:
                await handle.stop()
        wiki.search_delay = 0

        runs = sorted(await first.sync_runs("wiki", limit=100), key=lambda r: r.started_at)
        assert len(runs) >= 3 and {r.trigger for r in runs} == {"schedule"}
        assert all(r.status == "ok" for r in runs), [(r.status, r.error) for r in runs]
        for earlier, later in zip(runs, runs[1:], strict=False):
            assert earlier.finished_at <= later.started_at, "two runs of one source overlapped"
        assert runs[0].added == 4 and all(r.added == 0 for r in runs[1:])  # later runs find nothing new
        assert any(r.pruned for r in runs)
        assert await first.sync_runs("manual") == []
        assert (await first.status()).documents == 4


async def test_the_scheduler_picks_up_sources_added_and_removed_while_it_runs(fresh_kb, tmp_path):
    service = SchedulerService(lambda: fresh_kb, refresh_seconds=3600)  # as `ragbot run` holds it
    await service.start()
    handle = service.handle
    assert handle is not None
    try:
        assert handle.jobs() == []
        (tmp_path / "a.md").write_text("# A\n\nAlpha.")
        await fresh_kb.add_source("docs", "folder", {"path": str(tmp_path)}, schedule_seconds=3600)
        await handle.refresh()
        assert handle.jobs() == ["prune:docs", "sync:docs"]
        await fresh_kb.remove_source("docs")
        await handle.refresh()
        assert handle.jobs() == []
    finally:
        await service.stop()
    assert service.handle is None


def test_intervals_are_read_and_shown():
    assert [parse_interval(v) for v in ("30s", "15m", "1h", "1h30m", "1d", "2w")] == [
        30, 900, 3600, 5400, 86400, 1209600]
    assert format_interval(5400) == "1h30m" and format_interval(None) == "on demand"
    for bad in ("", "1", "h", "1x", "-1h", "0m"):
        with pytest.raises(ValueError, match="interval"):
            parse_interval(bad)


async def test_ragbot_run_syncs_sources_on_their_schedule_unless_turned_off(kb_factory, tmp_path):
    """`ragbot run`'s composition root runs the scheduler beside the bots; RUN_SCHEDULER=false leaves it out."""
    from bot.app import build_app
    from bot.settings import BotSettings

    (tmp_path / "note.md").write_text("# Note\n\nThe build takes four minutes on the main branch.\n")
    kb = await kb_factory()
    await kb.add_source("notes", "folder", {"path": str(tmp_path)}, schedule_seconds=1)

    off = build_app(BotSettings(_env_file=None, slack_bot_token="xoxb-test", run_scheduler=False))
    assert off.services == []

    app = build_app(BotSettings(_env_file=None, slack_bot_token="xoxb-test", port=0))
    app.kb, app.adapters = kb, []  # no chat platform needed to see the scheduler work
    await app.start()
    try:
        for _ in range(100):
            if any(r.status == "ok" for r in await kb.sync_runs("notes", limit=10)):
                break
            await asyncio.sleep(0.2)
    finally:
        await app.stop()
    runs = await kb.sync_runs("notes", limit=10)
    assert runs and {r.trigger for r in runs} == {"schedule"} and runs[0].status == "ok"
    assert (await kb.status()).documents == 1


async def test_n_schedulers_on_one_database_run_each_source_once_per_interval(kb_factory, fresh_database, tmp_path):
    """Issue 30: the advisory lock kept two replicas from overlapping, but each still ran the source once an
    interval, one after the other. Now a scheduled run started within the interval (by the database's clock,
    checked under the lock) makes the others skip theirs."""
    url = fresh_database()
    replicas = [await kb_factory(url) for _ in range(3)]
    (tmp_path / "a.md").write_text("# A\n\nAlpha is the first letter.")
    every = 2
    await replicas[0].add_source("docs", "folder", {"path": str(tmp_path)}, schedule_seconds=every,
                                 prune_seconds=3600)
    await replicas[0].sync_source("docs")  # the first sync loads the model; scheduled runs then take milliseconds
    loop = asyncio.get_running_loop()
    started = loop.time()
    handles = []
    for kb in replicas:  # replicas started apart, as in production: their firings never coincide
        handles.append(await start_scheduler(kb, refresh_seconds=3600))
        await asyncio.sleep(every / len(replicas))
    try:
        await asyncio.sleep(every * 5 + 0.5)
    finally:
        for handle in handles:
            await handle.stop()
    elapsed = loop.time() - started
    runs = sorted((r for r in await replicas[0].sync_runs("docs", limit=100) if r.trigger == "schedule"),
                  key=lambda r: r.started_at)
    assert all(r.status == "ok" for r in runs), [(r.status, r.error) for r in runs]
    # Firings at every, 2×every, ... (each delayed by up to 10% jitter): at most one run per elapsed interval.
    assert 2 <= len(runs) <= int(elapsed // every), [r.started_at for r in runs]
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert (later.started_at - earlier.started_at).total_seconds() >= every * 0.8 - 0.05
