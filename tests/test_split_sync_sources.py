"""A big Confluence or Google Drive source's first sync split across workers (issue 43, item 3), as a folder's is
(tests/test_split_sync.py): Confluence by space, Drive by each root's top-level folders (and its loose files). Each
part is leased on its own; a part whose worker died (its lease left to expire) is taken over; nothing of the source
shows until every part is done, then everything shows with its own access; the next sync is one unit again.

The real client libraries (httpx for Confluence, google-api-python-client for Drive) against the local fakes, which
answer only the documented endpoints the unsplit sync already uses (CQL search per space, files.list per folder)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import test_gdrive
from fakes.confluence_api import FakeConfluence
from fakes.drive_api import FakeDrive
from sqlalchemy import text
from test_gdrive import LEAVE_HTML, VPN_MD, WIFI_TXT, source_for

from db import leases
from knowledge.ingest.split import part_lease
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.base import build_source
from knowledge.sources.gdrive import GoogleDriveConfig
from knowledge.storage import parts as parts_store

# The Drive tests' fixtures: a fake Drive insisting on a service account's token, and a small company tree in it.
private_key_pem, drive, company = test_gdrive.private_key_pem, test_gdrive.drive, test_gdrive.company

DEAD_LEASE_SECONDS = 4.0  # the dead worker's part lease: renewed by the test until it "dies", then left to expire


async def plan_state(kb, name: str) -> dict[str, bool]:  # type: ignore[no-untyped-def]
    async with kb.engine.connect() as conn:
        (source_id,) = (await conn.execute(text("SELECT id FROM sources WHERE name = :n"), {"n": name})).one()
        return await parts_store.planned(conn, source_id)


async def source_id_of(kb, name: str) -> int:  # type: ignore[no-untyped-def]
    async with kb.engine.connect() as conn:
        return int((await conn.execute(text("SELECT id FROM sources WHERE name = :n"), {"n": name})).scalar_one())


async def found(kb, words: str, *principals: str) -> list[str]:  # type: ignore[no-untyped-def]
    hits = (await kb.search(words, SearchFilters(principals or ("everyone",)), k=10, mode="lexical")).hits
    return list(dict.fromkeys(h.external_id for h in hits))  # a document once, however many chunks matched


async def first_sync_with_a_dead_worker(
    kb, name: str, dead_unit: str, while_waiting: Callable[[], Awaitable[None]],  # type: ignore[no-untyped-def]
) -> dict[str, bool]:
    """Run the source's first sync (this worker coordinates) while another worker holds `dead_unit`'s part lease:
    once every other part is done, `while_waiting` runs (the source must not show yet); then the other worker dies
    (stops renewing) and this one takes its part over after the lease. Returns the plan seen while waiting."""
    engine = kb.engine
    lease = part_lease(await source_id_of(kb, name), dead_unit)
    assert await leases.try_take(engine, lease, "dead-host:1:worker", DEAD_LEASE_SECONDS)
    run = asyncio.create_task(kb.sync_source(name))
    seen: dict[str, bool] = {}
    try:
        for _ in range(3000):
            assert await leases.renew(engine, lease, "dead-host:1:worker", DEAD_LEASE_SECONDS)
            seen = await plan_state(kb, name)
            if seen and all(done for part, done in seen.items() if part != dead_unit) or run.done():
                break
            await asyncio.sleep(0.1)
        assert not run.done() and seen.get(dead_unit) is False, (seen, run)
        await while_waiting()
        assert not (await plan_state(kb, name))[dead_unit], "a leased part was synced by another worker"
    except BaseException:
        run.cancel()
        raise
    # The other worker is gone: its lease expires, this worker's run takes the part over and publishes.
    report = await asyncio.wait_for(run, timeout=600)
    assert report.failed == []
    return seen


# --- Confluence: one part per space ----------------------------------------------------------------------------


def wiki_with_spaces(wiki: FakeConfluence) -> dict[str, str]:
    ids = {}
    for n, (key, word) in enumerate([("ENG", "kestrel"), ("OPS", "heron"), ("HR", "osprey"), ("FIN", "plover")]):
        wiki.add_space(key, f"Space {key}", readers=[("group", "finance")] if key == "FIN" else None)
        ids[key] = wiki.add_page(key, f"{key} handbook", f"<p>The {word} build takes {n + 3} minutes.</p>")
        ids[f"{key}-2"] = wiki.add_page(key, f"{key} runbook", f"<p>Restart the {word} worker on Mondays.</p>",
                                        parent=ids[key])
    return ids


def test_a_confluence_source_lists_its_spaces_as_units(monkeypatch):
    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    source = build_source("wiki", "confluence", {"url": "https://acme.atlassian.net/wiki", "spaces": ["ENG", "OPS"],
                                                  "email": "bot@acme.example"})
    assert source.parts() == ["ENG", "OPS"]
    assert source.part("OPS").config.spaces == ("OPS",) and source.part("OPS").spec == source.spec


async def test_a_confluence_first_sync_is_split_by_space_and_a_dead_workers_space_taken_over(
        kb_factory, monkeypatch):
    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    kb = await kb_factory(sync_split_first=True)
    with FakeConfluence(edition="cloud") as wiki:
        ids = wiki_with_spaces(wiki)
        await kb.add_source("wiki", "confluence", {"url": wiki.base_url, "spaces": ["ENG", "OPS", "HR", "FIN"],
                                                   "email": wiki.email, "visibility": "permissions"})

        async def nothing_shows() -> None:
            assert (await kb.status()).documents > 0  # the other spaces are written, masked
            for word in ("kestrel", "heron", "osprey", "plover"):
                assert await found(kb, word) == [] and await found(kb, word, "group:wiki/finance") == [], word

        seen = await first_sync_with_a_dead_worker(kb, "wiki", "OPS", nothing_shows)
        assert list(seen) == ["ENG", "FIN", "HR", "OPS"]
        assert (await kb.status()).documents == len(ids) and await plan_state(kb, "wiki") == {}
        for key, word in (("ENG", "kestrel"), ("OPS", "heron"), ("HR", "osprey")):
            assert set(await found(kb, word)) == {ids[key], ids[f"{key}-2"]}, key
        assert await found(kb, "plover") == []  # published with its own space's permissions
        assert set(await found(kb, "plover", "group:wiki/finance")) == {ids["FIN"], ids["FIN-2"]}
        runs = await kb.sync_runs("wiki")
        assert [r.status for r in runs] == ["ok"] and runs[0].added == len(ids)

        # The next sync is one unit: a new page shows as soon as its run ends, no plan involved.
        late = wiki.add_page("HR", "Late news", "<p>The grebe release ships on Fridays.</p>")
        report = await kb.sync_source("wiki")
        assert report.added == [late] and await plan_state(kb, "wiki") == {}
        assert await found(kb, "grebe") == [late]


# --- Google Drive: one part per top-level folder of each root, and one for each root's own files ------------------


async def test_a_drive_source_lists_each_roots_top_level_folders_and_its_own_files_as_units(drive, company):
    source = source_for(drive, company)
    root = company["root"]
    units = await source.parts()
    assert sorted(units) == sorted([f"{root}/", f"{root}/{company['hr']}", f"{root}/{company['it']}"])
    whole = {i.external_id: (i.path, i.access) async for i in items_of(source)}
    by_part = {u: {i.external_id: (i.path, i.access) async for i in items_of(source.part(u))} for u in units}
    assert set(by_part[f"{root}/{company['hr']}"]) == {company["leave"]}
    assert set(by_part[f"{root}/{company['it']}"]) == {company["vpn"], company["wifi"]}
    assert set(by_part[f"{root}/"]) == {company["photo"]}
    assert {k: v for part in by_part.values() for k, v in part.items()} == whole  # same ids, breadcrumbs, access


async def items_of(source):  # type: ignore[no-untyped-def]
    async for batch in source.changes(None):
        for item in batch.items:
            yield item


async def test_a_drive_first_sync_is_split_by_top_level_folder_and_a_dead_workers_folder_taken_over(
        kb_factory, drive: FakeDrive):
    kb = await kb_factory(sync_split_first=True)
    root = drive.add_folder("Handbook")
    ids: dict[str, str] = {}
    for n, (team, word) in enumerate([("Sales", "kestrel"), ("Support", "heron"), ("Legal", "osprey")]):
        folder = drive.add_folder(team, root)
        ids[f"{team}-folder"] = folder
        ids[team] = drive.add_file(f"{team.lower()}.md", folder, f"# {team}\n\nThe {word} build takes {n + 3} "
                                   "minutes.\n".encode(), "text/markdown", permissions=[drive.anyone()])
        sub = drive.add_folder("Archive", folder)
        ids[f"{team}-old"] = drive.add_file("old.txt", sub, f"The {word} archive is read-only.".encode(),
                                            "text/plain", permissions=[drive.anyone()])
    ids["leave"] = drive.add_doc("Leave policy", ids["Legal-folder"], html=LEAVE_HTML,
                                 permissions=[drive.user("alice@northwind.example")])
    ids["wifi"] = drive.add_file("wifi.txt", root, WIFI_TXT, "text/plain", permissions=[drive.anyone()])
    await kb.add_source("drive", "gdrive", GoogleDriveConfig(folders=(root,)).to_dict())

    async def nothing_shows() -> None:
        assert (await kb.status()).documents > 0
        for words in ("kestrel", "heron", "wifi", "parental leave"):
            assert await found(kb, words) == [] and await found(kb, words, "user:alice@northwind.example") == []

    dead = f"{root}/{ids['Support-folder']}"
    seen = await first_sync_with_a_dead_worker(kb, "drive", dead, nothing_shows)
    assert set(seen) == {f"{root}/"} | {f"{root}/{ids[f'{t}-folder']}" for t in ("Sales", "Support", "Legal")}
    assert (await kb.status()).documents == 8 and await plan_state(kb, "drive") == {}
    assert set(await found(kb, "heron")) == {ids["Support"], ids["Support-old"]}  # the dead worker's part
    assert set(await found(kb, "kestrel")) == {ids["Sales"], ids["Sales-old"]}
    assert await found(kb, "wifi") == [ids["wifi"]]
    assert await found(kb, "parental leave") == []  # published with the file's own permissions
    assert await found(kb, "parental leave", "user:alice@northwind.example") == [ids["leave"]]
    async with kb.engine.connect() as conn:
        path = (await conn.execute(text("SELECT path FROM documents WHERE external_id = :e"),
                                   {"e": ids["Support-old"]})).scalar_one()
    assert path == "Handbook/Support/Archive/old.txt"  # the breadcrumb the whole walk gives

    # The next sync is one unit and leaves a checkpoint: the one after it reads Drive's change log.
    late = drive.add_file("late.md", ids["Sales-folder"], VPN_MD, "text/markdown", permissions=[drive.anyone()])
    report = await kb.sync_source("drive")
    assert report.added == [late] and await plan_state(kb, "drive") == {}
    assert await found(kb, "Tailscale") == [late]
    async with kb.engine.connect() as conn:
        checkpoint = (await conn.execute(text("SELECT checkpoint FROM sources WHERE name = 'drive'"))).scalar_one()
    assert checkpoint and '"tokens"' in checkpoint
