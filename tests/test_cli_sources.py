"""`ragbot source ...`, `ragbot sync`, `ragbot sync-runs` and `ragbot status` as a user (and tools reading --json)
see them, against a fake Confluence and a folder."""

from __future__ import annotations

import json

import pytest
from conftest import write
from fakes.confluence_api import FakeConfluence
from test_cli import assert_usage_error, cli, ok, ok_json, text


@pytest.fixture
def cli_db(fresh_database, monkeypatch) -> str:
    url = fresh_database()
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("WIKI_TOKEN", "good-token")
    return url


@pytest.fixture
def wiki():
    with FakeConfluence(edition="cloud") as fake:
        fake.add_space("ENG", "Engineering")
        root = fake.add_page("ENG", "Handbook", "<p>The Northwind engineering handbook.</p>")
        fake.add_page("ENG", "Deploys", "<h2>Friday</h2><p>Nobody deploys to production on Fridays.</p>", parent=root)
        fake.add_page("ENG", "Old", "<p>Obsolete.</p>", labels=["archived"])
        yield fake


def add_wiki(wiki: FakeConfluence, *extra: str):  # type: ignore[no-untyped-def]
    return cli("source", "add", "confluence", "wiki", "--url", wiki.base_url, "--space", "ENG", "--email", wiki.email,
               "--token-env", "WIKI_TOKEN", "--exclude-label", "archived", "--every", "1h", *extra)


def test_confluence_source_add_list_sync_runs_and_status(cli_db, wiki):
    added = add_wiki(wiki)
    assert added.exit_code == 0, added.stderr
    assert "Saved source wiki" in text(added) and "every 1h" in text(added)

    (listed,) = ok_json("source", "list")["sources"]
    assert listed["name"] == "wiki" and listed["kind"] == "confluence" and listed["schedule_seconds"] == 3600
    assert listed["config"]["token_env"] == "WIKI_TOKEN" and "good-token" not in json.dumps(listed)
    assert listed["last_run"] is None and listed["prune_seconds"] == 86400

    synced = ok("sync", "wiki")
    assert "wiki: 2 added" in text(synced)
    report = ok_json("sync", "wiki", "--full")["reports"][0]
    assert report["unchanged"] == 2 and report["pruned"] and report["trigger"] == "cli"

    runs = ok_json("sync-runs", "wiki")["runs"]
    assert [(r["trigger"], r["status"], r["added"], r["pruned"]) for r in runs] == [
        ("cli", "ok", 0, True), ("cli", "ok", 2, False)]
    assert "ok" in text(ok("sync-runs"))

    status = ok_json("status")
    (source,) = status["sources"]
    assert source["last_run"]["status"] == "ok" and source["running"] is False and source["documents"] == 2
    assert "ok" in text(ok("status")) and "wiki" in text(ok("source", "list"))

    assert "Removed source wiki and its 2 documents" in text(ok("source", "remove", "wiki"))
    assert ok_json("source", "list")["sources"] == []


def test_a_source_with_a_bad_token_is_refused_and_not_saved(cli_db, wiki, monkeypatch):
    monkeypatch.setenv("WIKI_TOKEN", "wrong")
    assert_usage_error(add_wiki(wiki), "source 'wiki'", "refused the credentials (401)", "WIKI_TOKEN")
    assert ok_json("source", "list")["sources"] == []
    assert_usage_error(cli("source", "add", "confluence", "wiki", "--url", "not-a-url", "--space", "ENG"), "--url")
    assert_usage_error(add_wiki(wiki, "--visibility", "secret"), "--visibility must be permissions or everyone")


def test_a_failing_sync_is_one_line_and_recorded(cli_db, wiki, monkeypatch):
    assert add_wiki(wiki).exit_code == 0
    ok("sync", "wiki")
    monkeypatch.setenv("WIKI_TOKEN", "revoked")
    assert_usage_error(cli("sync", "wiki"), "refused the credentials (401)")
    runs = ok_json("sync-runs", "wiki")["runs"]
    assert runs[0]["status"] == "failed" and "401" in runs[0]["error"]
    assert ok_json("status")["documents"] == 2  # nothing deleted


def test_folder_sources_sync_all_and_ingest_stays_a_one_off_sync(cli_db, tmp_path):
    write(tmp_path / "a", "one.md", "# One\n\nThe first folder.")
    write(tmp_path / "b", "two.md", "# Two\n\nThe second folder.")
    assert_usage_error(cli("sync"), "no sources to sync")
    ok("source", "add", "folder", "alpha", str(tmp_path / "a"), "--every", "30m")
    ok("ingest", str(tmp_path / "b"), "--source", "beta")
    reports = ok_json("sync")["reports"]
    assert [(r["source"], r["added"], r["unchanged"]) for r in reports] == [("alpha", ["one.md"], 0), ("beta", [], 1)]
    sources = {s["name"]: s for s in ok_json("source", "list")["sources"]}
    assert sources["alpha"]["schedule_seconds"] == 1800 and sources["beta"]["schedule_seconds"] is None
    assert sources["beta"]["config"] == {"path": str((tmp_path / "b").resolve())}
    assert_usage_error(cli("source", "add", "folder", "alpha", str(tmp_path / "b")), "already indexes folder")
    assert_usage_error(cli("source", "add", "folder", "x", str(tmp_path / "a"), "--every", "soon"), "interval")
    assert_usage_error(cli("sync-runs", "nope"), "unknown source 'nope'")


def test_sync_errors_name_the_command_that_fixes_them(cli_db, tmp_path):
    write(tmp_path / "a", "one.md", "# One\n\nThe first folder.")
    ok("source", "add", "folder", "alpha", str(tmp_path / "a"))
    ok("sync", "alpha")
    assert_usage_error(cli("sync", "nope"), "unknown source 'nope'; sources: alpha (add one with `ragbot source add`)")
    assert_usage_error(cli("source", "add", "folder", "alpha", str(tmp_path)),
                       "already indexes folder", "(`ragbot source remove alpha`)")
    (tmp_path / "a").rename(tmp_path / "moved")
    assert_usage_error(cli("sync", "alpha"), "does not exist", "fix the path or remove the source "
                                                               "(`ragbot source remove alpha`)")
