"""Stored sources and the sync job (`KnowledgeBase.sync_source`): recorded runs, the per-source lock, typed
errors, and folder sources indexed before stored sources existed."""

from __future__ import annotations

import asyncio

import pytest
from conftest import write
from sqlalchemy import text

from bot.chat import admin
from knowledge.errors import Remedy, SourceBusy, SourceUnavailable, UnknownSource
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.folder import FolderSource


@pytest.fixture
def docs(tmp_path):
    root = tmp_path / "docs"
    write(root, "vpn.md", "# VPN\n\nInstall Tailscale from Self Service and sign in with Okta.")
    write(root, "wifi.md", "# Wifi\n\nThe guest network is northwind-guest.")
    return root


async def test_a_stored_folder_source_syncs_by_name_and_every_run_is_recorded(fresh_kb, docs):
    info = await fresh_kb.add_source("handbook", "folder", {"path": str(docs)}, schedule_seconds=3600)
    assert (info.name, info.kind, info.schedule_seconds, info.last_run) == ("handbook", "folder", 3600, None)

    first = await fresh_kb.sync_source("handbook", trigger="cli")
    assert sorted(first.added) == ["vpn.md", "wifi.md"] and first.run_id is not None
    write(docs, "wifi.md", "# Wifi\n\nThe guest network is now northwind-visitors.")
    (docs / "vpn.md").unlink()
    second = await fresh_kb.sync_source("handbook", trigger="chat")
    assert (second.updated, second.deleted) == (["wifi.md"], ["vpn.md"])

    runs = await fresh_kb.sync_runs("handbook")
    assert [(r.trigger, r.status, r.added, r.updated, r.deleted) for r in runs] == [
        ("chat", "ok", 0, 1, 1), ("cli", "ok", 2, 0, 0)]
    assert all(r.finished_at >= r.started_at for r in runs)
    (listed,) = await fresh_kb.list_sources()
    assert listed.documents == 1 and listed.last_run == runs[0] and not listed.running
    status = await fresh_kb.status()
    assert status.sources[0].last_run == runs[0]


async def test_unknown_source_names_the_known_ones(fresh_kb, docs):
    await fresh_kb.add_source("handbook", "folder", {"path": str(docs)})
    with pytest.raises(UnknownSource, match="'nope'.*handbook"):
        await fresh_kb.sync_source("nope")


async def test_a_source_already_syncing_is_busy_in_another_process(kb_factory, fresh_database, docs):
    url = fresh_database()
    first, second = await kb_factory(url), await kb_factory(url)
    await first.add_source("handbook", "folder", {"path": str(docs)})
    async with first.syncs.source_lock(await _source_id(first, "handbook"), "handbook"):
        with pytest.raises(SourceBusy, match="being synced right now"):
            await second.sync_source("handbook")
        assert (await second.list_sources())[0].running
    assert (await second.sync_source("handbook")).added == ["vpn.md", "wifi.md"]
    assert not (await second.list_sources())[0].running


async def test_a_missing_folder_fails_the_run_with_the_fix_and_keeps_the_index(fresh_kb, docs, tmp_path):
    await fresh_kb.add_source("handbook", "folder", {"path": str(docs)})
    await fresh_kb.sync_source("handbook")
    moved = tmp_path / "moved"
    docs.rename(moved)
    with pytest.raises(SourceUnavailable, match="does not exist.*fix the path or remove the source") as raised:
        await fresh_kb.sync_source("handbook")
    # The same error reaches `/kb reindex` in Slack: no CLI command in it, the fix carried as a fact for the CLI.
    assert "ragbot" not in str(raised.value)
    assert (raised.value.remedy, raised.value.source) == (Remedy.REMOVE_SOURCE, "handbook")
    (latest, _) = await fresh_kb.sync_runs("handbook")
    assert latest.status == "failed" and "does not exist" in latest.error
    assert (await fresh_kb.status()).documents == 2


async def test_reindex_in_the_chat_names_chat_commands_never_cli_ones(kb_factory, fresh_database, docs, tmp_path):
    url = fresh_database()
    first, second = await kb_factory(url), await kb_factory(url)
    await first.add_source("handbook", "folder", {"path": str(docs)})
    async with first.syncs.source_lock(await _source_id(first, "handbook"), "handbook"):
        busy = await admin.reindex(second, "handbook")
    assert "being synced right now" in busy and "(`/kb status` shows it)" in busy and "ragbot " not in busy
    docs.rename(tmp_path / "moved")
    gone = await admin.reindex(second, "handbook")
    assert "does not exist" in gone and "fix the path or remove the source" in gone and "ragbot " not in gone


async def test_a_run_whose_process_died_shows_as_interrupted(kb_factory, fresh_database, docs):
    url = fresh_database()
    kb = await kb_factory(url)
    await kb.add_source("handbook", "folder", {"path": str(docs)})
    async with kb.engine.begin() as conn:  # what a killed process leaves behind: a run still marked running
        await conn.execute(text("INSERT INTO sync_runs (source_id, trigger) SELECT id, 'schedule' FROM sources"))
    assert not (await kb.list_sources())[0].running  # nobody holds the lock
    await kb.sync_source("handbook")
    runs = await kb.sync_runs("handbook")
    assert [r.status for r in runs] == ["ok", "interrupted"]


async def test_folder_sources_indexed_with_ingest_sync_by_name(fresh_kb, docs):
    await fresh_kb.sync(FolderSource(docs))  # `ragbot ingest docs`
    write(docs, "new.md", "# New\n\nThe parking garage opens at 7am.")
    report = await fresh_kb.sync_source("docs")
    assert report.added == ["new.md"] and report.unchanged == 2
    hits = (await fresh_kb.search("when does the parking garage open", SearchFilters(), k=1)).hits
    assert hits[0].external_id == "new.md"
    assert [r.trigger for r in await fresh_kb.sync_runs("docs")] == ["cli", "cli"]


async def test_two_syncs_of_one_source_at_once_never_overlap(kb_factory, fresh_database, docs):
    url = fresh_database()
    first, second = await kb_factory(url), await kb_factory(url)
    await first.add_source("handbook", "folder", {"path": str(docs)})
    results = await asyncio.gather(first.sync_source("handbook"), second.sync_source("handbook"),
                                   return_exceptions=True)
    assert all(not isinstance(r, Exception) or isinstance(r, SourceBusy) for r in results), results
    assert any(not isinstance(r, Exception) for r in results)
    runs = sorted(await first.sync_runs("handbook"), key=lambda r: r.started_at)
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert earlier.finished_at <= later.started_at  # one run at a time
    assert (await first.status()).documents == 2


async def _source_id(kb, name: str) -> int:
    async with kb.engine.connect() as conn:
        return (await conn.execute(text("SELECT id FROM sources WHERE name = :n"), {"n": name})).scalar_one()


async def test_folder_sources_from_before_the_upgrade_keep_working(server_url, tmp_path, kb_factory, docs):
    """A database at revision 0001 with an indexed folder: `db upgrade` keeps it, and it syncs by name."""
    import uuid

    from conftest import create_database, drop_database
    from migrating import migrate_to

    from db.engine import create_engine

    name = f"old_{uuid.uuid4().hex[:8]}"
    url = create_database(server_url, name)
    try:
        engine = create_engine(url)
        async with engine.begin() as conn:
            await migrate_to(conn, "0001", down=False)
            await conn.execute(text("INSERT INTO sources (name, kind, location) VALUES ('docs', 'folder', :p)"),
                               {"p": str(docs.resolve())})
        await engine.dispose()

        kb = await kb_factory(url)  # opening upgrades to head
        (info,) = await kb.list_sources()
        assert info.config == {"path": str(docs.resolve())} and info.schedule_seconds is None
        report = await kb.sync_source("docs")
        assert sorted(report.added) == ["vpn.md", "wifi.md"]
        await kb.close()
    finally:
        drop_database(server_url, name)
