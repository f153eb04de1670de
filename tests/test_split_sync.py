"""A big source's first sync split across workers (issue 43, item 3): by the folder source's top-level folders, each
part leased on its own, so two workers index one source together; the source is searchable only once every part is
done, with its documents' own access lists; a dead worker's part is taken over after its lease; later syncs stay one
unit. Real `ragbot sync` processes against the embedded Postgres and the local-folder connector."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from sqlalchemy import text

from knowledge.errors import SourceBusy
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.folder import FolderSource
from knowledge.storage import parts as parts_store

DOCS_PER_PART = 3


def make_big_folder(root: Path, teams: tuple[str, ...]) -> int:
    """One top-level folder per team (a part each) and a file at the top (one more part); `delta` only for its
    group. Returns the number of documents."""
    for n, team in enumerate(teams):
        for d in range(DOCS_PER_PART):
            page = root / team / f"note{d}.md"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(f"# {team.title()} note {d}\n\nThe {team} team's build number {d} takes "
                            f"{n * 10 + d + 3} minutes to finish on the main branch.\n")
    if "delta" in teams:
        (root / "delta" / ".access").write_text("group:delta\n")
    (root / "readme.md").write_text("# Read me\n\nThe zulu handbook lives in these folders.\n")
    return len(teams) * DOCS_PER_PART + 1


async def found(kb, word: str, principals: tuple[str, ...] = ()) -> list[str]:  # type: ignore[no-untyped-def]
    hits = (await kb.search(word, SearchFilters(principals or ("everyone",)), k=10, mode="lexical")).hits
    return [h.external_id for h in hits]


def worker_env(url: str, ragbot_home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": url, "RAGBOT_HOME": str(ragbot_home), "PYTHONPATH": str(REPO),
            "SYNC_SPLIT_FIRST": "true", **extra}


async def plan_state(kb) -> dict[str, bool]:  # type: ignore[no-untyped-def]
    """The split sync's parts: part -> done."""
    async with kb.engine.connect() as conn:
        (source_id,) = (await conn.execute(text("SELECT id FROM sources WHERE name = 'big'"))).one()
        return await parts_store.planned(conn, source_id)


def test_a_folder_lists_its_top_level_folders_and_its_loose_files_as_units(tmp_path: Path):
    make_big_folder(tmp_path, ("alpha", "bravo"))
    (tmp_path / ".hidden").mkdir()
    source = FolderSource(tmp_path, "big")
    assert source.parts() == ["", "alpha/", "bravo/"]
    listed = {name: sorted(i.external_id for i in source.part(name).items()) for name in source.parts()}
    assert listed == {"": ["readme.md"], "alpha/": [f"alpha/note{d}.md" for d in range(3)],
                      "bravo/": [f"bravo/note{d}.md" for d in range(3)]}
    assert FolderSource(tmp_path / "alpha", "big", root=tmp_path).parts() == []  # a subfolder is one unit


async def test_two_workers_share_a_big_first_sync(kb_factory, fresh_database, tmp_path: Path, ragbot_home: Path):
    teams = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")
    url = fresh_database()
    kb = await kb_factory(url, sync_split_first=True)
    total = make_big_folder(tmp_path / "big", teams)
    await kb.add_source("big", "folder", {"path": str(tmp_path / "big")})
    await kb.ensure_embedding_space()  # this worker is warm; the other process starts cold
    other = subprocess.Popen([sys.executable, "-m", "bot.cli", "sync", "big"], env=worker_env(url, ragbot_home),
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            if await kb.open_split_syncs() or other.poll() is not None:
                break
            await asyncio.sleep(0.05)
        assert await kb.open_split_syncs() == ["big"], "the other worker never planned a split sync"
        helped = await kb.sync_source("big")  # the source's lease is the other worker's: this one takes free parts
        _, errors = other.communicate(timeout=900)
    finally:
        if other.poll() is None:
            other.kill()
    assert other.returncode == 0, errors
    runs = sorted(await kb.sync_runs("big"), key=lambda r: r.started_at)
    assert [r.status for r in runs] == ["ok", "ok"], [(r.status, r.error) for r in runs]
    assert 0 < len(helped.added) < total and sum(r.added for r in runs) == total
    assert (await kb.status()).documents == total and await kb.open_split_syncs() == []
    for team in teams:
        if team != "delta":
            assert any(i.startswith(f"{team}/") for i in await found(kb, team)), team
    assert not await found(kb, "delta")  # published with its own access list: the group only
    assert any(i.startswith("delta/") for i in await found(kb, "delta", ("group:delta",)))


async def test_a_dead_workers_part_is_taken_over_and_nothing_shows_until_every_part_is_done(
        kb_factory, fresh_database, tmp_path: Path, ragbot_home: Path):
    teams = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
    url = fresh_database()
    kb = await kb_factory(url, sync_split_first=True)
    total = make_big_folder(tmp_path / "big", teams)
    await kb.add_source("big", "folder", {"path": str(tmp_path / "big")})
    dead = subprocess.Popen([sys.executable, "-m", "bot.cli", "sync", "big"],
                            env=worker_env(url, ragbot_home, SYNC_LEASE_SECONDS="3"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(6000):
            state = await plan_state(kb)
            if any(state.values()) or dead.poll() is not None:
                break
            await asyncio.sleep(0.02)
    finally:
        dead.send_signal(signal.SIGKILL)  # its host is gone: its leases are left to expire
        dead.wait()
    state = await plan_state(kb)
    assert any(state.values()) and not all(state.values()), f"kill it between its parts, not {state}"
    assert (await kb.status()).documents > 0  # committed, but nobody may see them yet
    for team in teams:
        assert not await found(kb, team, ("group:delta",)), f"{team}: a half-finished first sync showed"

    for _ in range(100):  # this worker's scheduled runs: help while the dead one's lease holds, then take over
        try:
            await kb.sync_source("big")
        except SourceBusy:
            pass
        if not await kb.open_split_syncs():
            break
        assert not await found(kb, "alpha", ("group:delta",)) or not await kb.open_split_syncs()
        await asyncio.sleep(0.5)
    runs = sorted(await kb.sync_runs("big"), key=lambda r: r.started_at)
    assert runs[0].status == "interrupted" and runs[-1].status == "ok", [(r.status, r.error) for r in runs]
    assert (await kb.status()).documents == total and await kb.open_split_syncs() == []
    for team in teams:
        assert any(i.startswith(f"{team}/") for i in await found(kb, team, ("group:delta",))), team
    assert any(i == "readme.md" for i in await found(kb, "zulu"))

    # Later syncs stay one unit: a new file is searchable as soon as its (single) run ends, no plan involved.
    (tmp_path / "big" / "alpha" / "late.md").write_text("# Late\n\nThe yankee release ships on Fridays.\n")
    report = await kb.sync_source("big")
    assert report.added == ["alpha/late.md"] and await kb.open_split_syncs() == []
    assert await found(kb, "yankee") == ["alpha/late.md"]


async def test_off_by_default_a_first_sync_is_one_unit(kb_factory, tmp_path: Path):
    kb = await kb_factory()  # SYNC_SPLIT_FIRST unset: on one host, parts would only share its cores
    total = make_big_folder(tmp_path / "big", ("alpha", "bravo"))
    await kb.add_source("big", "folder", {"path": str(tmp_path / "big")})
    report = await kb.sync_source("big")
    assert len(report.added) == total and await plan_state(kb) == {}
    assert [r.added for r in await kb.sync_runs("big")] == [total]
