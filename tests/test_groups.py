"""Group membership synced from Confluence and Google Workspace, expanded by the one resolver (knowledge.access):
group-shared pages and files reach members and only members (through `kb.search`/`kb.answer` as the resolver's
principals, and through `ragbot search/ask --as`), nested Google groups expand, a cycle terminates, a removal takes
effect at the next refresh, and an unreachable directory keeps its last good membership for one TTL, then fails
closed. Real client libraries against the fakes in tests/fakes/, real Postgres."""

from __future__ import annotations

import json

import pytest
from fakes.confluence_api import FakeConfluence
from fakes.drive_api import FakeDrive
from test_cli import cli, ok, ok_json, text
from test_gdrive import private_key_pem  # noqa: F401  (session fixture)

from bot.chat.state import BotState
from knowledge.access import AccessResolver
from knowledge.errors import SourceAuthError, SourceUnavailable
from knowledge.search.retrieval import SearchFilters

HR_PAGE = "<p>Salary bands are reviewed every April by the people team.</p>"
PAYROLL_PAGE = "<p>Payroll runs on the 25th; corrections go to the payroll desk before the 20th.</p>"
HANDBOOK_PAGE = "<p>The office opens at 8am and the coffee machine is on the third floor.</p>"


async def visible(kb, query: str, person: str, *, expand: bool = True, k: int = 5) -> list[str]:  # type: ignore[no-untyped-def]
    principals = (await kb.principals_for(person)).principals if expand else (person,)
    return [h.external_id for h in (await kb.search(query, SearchFilters(tuple(principals)), k=k)).hits]


# --- Confluence -------------------------------------------------------------------------------------------------


def people_wiki(wiki: FakeConfluence) -> dict[str, str]:
    """HR space readable by group `hr` only; ENG open to all users, with a page restricted to group `payroll`.
    Five members in `hr` (pages of 3), Bob's email hidden."""
    for ident, email in [("alice", "Alice@Acme.example"), ("bob", None), ("carol", "carol@acme.example"),
                         ("dan", "dan@acme.example"), ("eve", "eve@acme.example"), ("fay", "fay@acme.example")]:
        wiki.add_user(ident, ident.title(), email)
    wiki.set_group_members("hr", ["alice", "dan", "eve", "fay", "bob"])
    wiki.set_group_members("payroll", ["bob", "carol"])
    wiki.add_space("HR", "People", readers=[("group", "hr")])
    wiki.add_space("ENG", "Engineering")
    ids = {"bands": wiki.add_page("HR", "Salary bands", HR_PAGE)}
    ids["handbook"] = wiki.add_page("ENG", "Office handbook", HANDBOOK_PAGE)
    ids["payroll"] = wiki.add_page("ENG", "Payroll calendar", PAYROLL_PAGE, parent=ids["handbook"])
    wiki.restrict(ids["payroll"], groups=["payroll"])
    return ids


@pytest.mark.parametrize("edition", ["cloud", "datacenter"])
async def test_confluence_group_pages_reach_members_and_only_members(fresh_kb, monkeypatch, edition):
    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    with FakeConfluence(edition=edition) as wiki:
        ids = people_wiki(wiki)
        config = {"url": wiki.base_url, "spaces": ["HR", "ENG"]}
        if edition == "cloud":
            config["email"] = wiki.email
        await fresh_kb.add_source("wiki", "confluence", config)
        await fresh_kb.sync_source("wiki")
        wiki.fail_next(2, 429)  # the refresh survives a rate-limit burst
        report = await fresh_kb.refresh_groups("wiki")
        member_calls = [r for r in wiki.requests if "/member" in r]
        assert report.groups == 2 and report.memberships == 7
        assert len([r for r in member_calls if "start=3" in r]) >= 1  # hr's second page was followed
        # The documented member listing of each edition (the fake refuses `groupId` on Cloud's /group/member, and a
        # limit over 200 on membersByGroupId, as Atlassian's reference says).
        listed = {path.rsplit("/", 1)[-1] for path, _ in wiki.member_requests}
        assert listed == ({"membersByGroupId"} if edition == "cloud" else {"member"})
        assert all(int(query.get("limit", 0)) <= 200 for _, query in wiki.member_requests)

        # Cloud shows emails (any case matches); Data Center does not: its people are `user:confluence:<name>`.
        def who(ident: str, email: str) -> str:
            return f"user:{email}" if edition == "cloud" else f"user:confluence:{ident}"

        alice, carol = who("alice", "alice@acme.example"), who("carol", "carol@acme.example")
        # Alice is in hr; Carol is not, and only sees the everyone page.
        assert ids["bands"] in await visible(fresh_kb, "salary bands review", alice)
        assert ids["bands"] not in await visible(fresh_kb, "salary bands review", carol)
        if edition == "cloud":
            assert ids["bands"] in await visible(fresh_kb, "salary bands review", "user:ALICE@acme.example")
        # Carol is in payroll: the restricted page reaches her, not Alice; without expansion, not her either.
        assert ids["payroll"] in await visible(fresh_kb, "when does payroll run", carol)
        assert ids["payroll"] not in await visible(fresh_kb, "when does payroll run", alice)
        assert ids["payroll"] not in await visible(fresh_kb, "when does payroll run", carol, expand=False)
        # Bob's email is hidden on both: he is his `user:confluence:` principal, as documents would carry him, and
        # an admin mapping of his chat identity to it brings his groups along.
        await BotState(fresh_kb.engine).map_identity("slack:UBOB", "user:confluence:bob")
        bob = await fresh_kb.principals_for("slack:UBOB")
        assert {"group:wiki/hr", "group:wiki/payroll"} <= set(bob.principals)
        assert [o.describe() for o in bob.origins["user:confluence:bob"]] == ["admin mapping of slack:UBOB"]
        assert ids["payroll"] in await visible(fresh_kb, "when does payroll run", "user:confluence:bob")

        resolved, verdicts = await fresh_kb.explain_access(alice, "Salary bands")
        (verdict,) = verdicts
        assert verdict.visible and verdict.matched == ("group:wiki/hr",)
        assert [o.describe() for o in resolved.origins["group:wiki/hr"]] == [
            f"wiki directory: {alice} ∈ group:wiki/hr"]
        _, refused = await fresh_kb.explain_access(carol, "Salary bands")
        assert not refused[0].visible and refused[0].access == ("group:wiki/hr",)


# --- Google Workspace -------------------------------------------------------------------------------------------


@pytest.fixture
def drive(monkeypatch, private_key_pem):  # noqa: F811
    with FakeDrive(require_auth=True) as fake:
        monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT_JSON", fake.service_account_json(private_key_pem))
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        monkeypatch.setenv("GDRIVE_API_ENDPOINT", fake.endpoint)
        monkeypatch.setenv("GDRIVE_BACKOFF_SECONDS", "0.01")
        monkeypatch.setenv("GDRIVE_DIRECTORY_API_ENDPOINT", fake.base_url + "/")
        monkeypatch.setenv("GDRIVE_DIRECTORY_BACKOFF_SECONDS", "0.01")
        monkeypatch.setenv("GDRIVE_DIRECTORY_MAX_RETRIES", "3")
        yield fake


def workspace(drive: FakeDrive) -> dict[str, str]:
    """eng@ ∋ platform@ ∋ dave (nested), platform@ ∋ eng@ (a cycle), all@ ∋ the whole customer."""
    directory = drive.directory
    directory.add_group("eng@acme.example", ["erin@acme.example", ("group", "platform@acme.example")])
    directory.add_group("platform@acme.example", ["Dave@acme.example", "gus@acme.example",
                                                   ("group", "eng@acme.example")])
    directory.add_group("all@acme.example", [("customer", "")])
    directory.add_group("sales@acme.example", ["sam@acme.example"])
    root = drive.add_folder("Company")
    return {
        "root": root,
        "arch": drive.add_doc("Architecture", root, html="<p>The billing service talks to the ledger over gRPC.</p>",
                              permissions=[drive.group("ENG@acme.example")]),
        "party": drive.add_doc("Party", root, html="<p>The summer party is on the rooftop in June.</p>",
                               permissions=[drive.group("all@acme.example")]),
        "quota": drive.add_doc("Quota", root, html="<p>Sales quota is set per quarter by region.</p>",
                               permissions=[drive.group("sales@acme.example")]),
    }


async def add_drive(kb, ids: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    await kb.add_source("drive", "gdrive", {"folders": [ids["root"]], "admin_email": "admin@acme.example"})
    await kb.sync_source("drive")


async def test_nested_google_groups_expand_and_a_cycle_terminates(kb_factory, drive):
    kb = await kb_factory(access_cache_seconds=0)
    ids = workspace(drive)
    await add_drive(kb, ids)
    drive.directory.rate_limit(2)  # 429s in the middle of the listing are retried
    report = await kb.refresh_groups("drive")
    assert report.groups == 4 and report.memberships == 7
    paged = [r for r in drive.requests if r.path.startswith("/admin/directory/v1/") and "pageToken" in r.query]
    assert any(r.path.endswith("/members") for r in paged) and any(r.path.endswith("/groups") for r in paged)
    assert any(t.get("assertion") for t in drive.token_requests)

    dave = await kb.principals_for("user:dave@acme.example")  # in platform@, so in eng@ (and eng@ ∋ platform@)
    assert {"group:drive/platform@acme.example", "group:drive/eng@acme.example", "group:drive/all@acme.example"} <= set(dave.principals)
    assert "group:drive/sales@acme.example" not in dave.principals
    assert ids["arch"] in await visible(kb, "how does billing talk to the ledger", "user:dave@acme.example")
    assert ids["arch"] not in await visible(kb, "how does billing talk to the ledger", "user:sam@acme.example")
    assert ids["quota"] not in await visible(kb, "sales quota per region", "user:dave@acme.example")
    # The whole customer: anyone in the Workspace's domains, nobody outside it.
    assert ids["party"] in await visible(kb, "summer party rooftop", "user:sam@acme.example")
    assert ids["party"] not in await visible(kb, "summer party rooftop", "user:mallory@elsewhere.example")
    # Erin is a direct member of eng@: the cycle (eng@ ∋ platform@ ∋ eng@) gives her platform@ too, and ends.
    erin = await kb.principals_for("user:erin@acme.example")
    assert {"group:drive/eng@acme.example", "group:drive/platform@acme.example"} <= set(erin.principals)
    # The answer path uses the same principals.
    answer = await kb.answer("how does billing talk to the ledger?", dave.principals, "t:dave")
    assert any(c.external_id == ids["arch"] for c in answer.citations)


async def test_removal_from_a_group_stops_documents_within_one_refresh(kb_factory, drive):
    kb = await kb_factory(access_cache_seconds=0)
    ids = workspace(drive)
    await add_drive(kb, ids)
    await kb.refresh_groups("drive")
    assert ids["arch"] in await visible(kb, "how does billing talk to the ledger", "user:gus@acme.example")
    drive.directory.remove_member("platform@acme.example", "gus@acme.example")
    await kb.refresh_groups("drive")
    assert ids["arch"] not in await visible(kb, "how does billing talk to the ledger", "user:gus@acme.example")
    assert ids["arch"] in await visible(kb, "how does billing talk to the ledger", "user:dave@acme.example")


async def test_an_unreachable_directory_keeps_the_last_membership_for_one_ttl_then_fails_closed(kb_factory, drive):
    kb = await kb_factory()
    ids = workspace(drive)
    await add_drive(kb, ids)
    await kb.refresh_groups("drive")
    drive.directory.down = True
    with pytest.raises(SourceUnavailable, match="Directory API"):
        await kb.refresh_groups("drive")
    (state,) = await kb.group_directories()
    assert state.error and state.memberships == 7

    now = [state.refreshed_at.timestamp() + 60]
    resolver = AccessResolver(kb.search_engine, ttl_seconds=3600, cache_seconds=30, clock=lambda: now[0])
    within = await resolver.principals_for("user:dave@acme.example")
    assert "group:drive/eng@acme.example" in within.principals and not within.expired
    now[0] = state.refreshed_at.timestamp() + 3601  # one TTL after the last good refresh: the cache entry ends too
    past = await resolver.principals_for("user:dave@acme.example")
    assert past.principals == ("everyone", "user:dave@acme.example") and past.expired == ("drive",)
    hits = await kb.search("how does billing talk to the ledger", SearchFilters(past.principals), k=5)
    assert ids["arch"] not in [h.external_id for h in hits.hits]

    drive.directory.down = False  # a refresh that succeeds again restores it
    await kb.refresh_groups("drive")
    resolver.invalidate()
    now[0] = __import__("time").time()
    assert "group:drive/eng@acme.example" in (await resolver.principals_for("user:dave@acme.example")).principals


# --- the command line --------------------------------------------------------------------------------------------


def test_cli_search_ask_as_expand_groups_and_access_explain_says_why(fresh_database, monkeypatch, drive):
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    ids = workspace(drive)
    added = cli("source", "add", "gdrive", "drive", "--folder", ids["root"], "--admin-email", "admin@acme.example",
                "--groups-every", "30m")
    assert added.exit_code == 0, added.stderr
    synced = ok("sync", "drive")
    assert "Group membership of drive: 4 groups, 7 memberships" in text(synced)
    (listed,) = ok_json("source", "list")["sources"]
    assert listed["config"]["groups_every_seconds"] == 1800 and listed["config"]["admin_email"] == "admin@acme.example"

    hits = ok_json("search", "how does billing talk to the ledger", "--as", "user:dave@acme.example")["results"]
    assert ids["arch"] in [h["document"]["external_id"] for h in hits]
    exact = ok_json("search", "how does billing talk to the ledger", "--as", "user:dave@acme.example",
                    "--no-expand")["results"]
    assert ids["arch"] not in [h["document"]["external_id"] for h in exact]
    outsider = ok_json("ask", "how does billing talk to the ledger?", "--as", "user:sam@acme.example")
    assert ids["arch"] not in [c["external_id"] for c in outsider.get("citations", [])]
    insider = ok_json("ask", "how does billing talk to the ledger?", "--as", "user:dave@acme.example")
    assert ids["arch"] in [c["external_id"] for c in insider.get("citations", [])]

    explained = ok("access", "explain", "user:dave@acme.example", "Architecture")
    out = " ".join(text(explained).split())
    assert "group:drive/eng@acme.example" in out and "drive directory" in out and "source drive's directory" in out
    assert "May see Architecture" in out and "shared with group:drive/eng@acme.example" in out
    refused = ok("access", "explain", "user:sam@acme.example", "Architecture")
    assert "May not see Architecture" in " ".join(text(refused).split())
    status = ok_json("access", "groups")["directories"]
    assert status[0]["source"] == "drive" and status[0]["memberships"] == 7 and status[0]["error"] is None


async def test_the_scheduler_refreshes_group_membership_on_its_own_schedule(fresh_kb, monkeypatch):
    import asyncio

    from knowledge.ingest.schedule import start_scheduler

    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    with FakeConfluence(edition="cloud") as wiki:
        people_wiki(wiki)
        await fresh_kb.add_source("wiki", "confluence", {"url": wiki.base_url, "spaces": ["HR", "ENG"],
                                                         "email": wiki.email, "groups_every_seconds": 1})
        handle = await start_scheduler(fresh_kb, refresh_seconds=0.5)
        try:
            assert handle.jobs() == ["groups:wiki"]  # no sync schedule, but its groups refresh on theirs
            for _ in range(100):
                states = await fresh_kb.group_directories()
                if states and states[0].generation >= 2:
                    break
                await asyncio.sleep(0.1)
            assert states[0].memberships == 5 and states[0].error is None  # hr's members (no documents yet)
            assert states[0].generation >= 2  # refreshed at least twice
        finally:
            await handle.stop()


# --- issue 38: group principals are scoped to the directory that defines them -----------------------------------

LAUNCH_PAGE = "<p>The Falcon launch moves to the ninth of March, after the security review.</p>"


def same_named_groups(wiki: FakeConfluence, drive: FakeDrive) -> dict[str, str]:
    """A Confluence group and a Google group both called eng@acme.example, with different members: Mallory is in the
    Confluence one (any Confluence admin can create a group of any name), Dave in the Google one (via platform@)."""
    wiki.add_user("mallory", "Mallory", "mallory@acme.example")
    wiki.set_group_members("eng@acme.example", ["mallory"])
    wiki.add_space("ENG", "Engineering", readers=[("group", "eng@acme.example")])
    ids = workspace(drive)
    ids["launch"] = wiki.add_page("ENG", "Launch plan", LAUNCH_PAGE)
    return ids


async def add_wiki(kb, wiki: FakeConfluence) -> None:  # type: ignore[no-untyped-def]
    await kb.add_source("wiki", "confluence", {"url": wiki.base_url, "spaces": ["ENG"], "email": wiki.email})
    await kb.sync_source("wiki")
    await kb.refresh_groups("wiki")


async def test_a_group_grants_only_what_its_own_source_shared_with_it(kb_factory, drive, monkeypatch, tmp_path):
    """The leak of issue 38: a Confluence group named like a Google group must not grant the Drive files shared with
    the Google group (nor the reverse). Folder `.access` files: an unscoped group is local (no directory grants
    it), a scoped one names a synced directory's group."""
    from conftest import write

    from knowledge.sources.folder import FolderSource

    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    kb = await kb_factory(access_cache_seconds=0)
    with FakeConfluence(edition="cloud") as wiki:
        ids = same_named_groups(wiki, drive)
        await add_wiki(kb, wiki)
    await add_drive(kb, ids)
    await kb.refresh_groups("drive")
    write(tmp_path, "local/.access", "group:eng@acme.example\n")
    write(tmp_path, "local/offsite.md", "# Offsite\n\nThe engineering offsite is in Lisbon this year.\n")
    write(tmp_path, "synced/.access", "group:drive/ENG@acme.example\n")  # ASCII case folds
    write(tmp_path, "synced/oncall.md", "# On-call\n\nThe on-call rotation hands over every Tuesday at noon.\n")
    assert not (await kb.sync(FolderSource(tmp_path, "notes"))).failed

    mallory = await kb.principals_for("user:mallory@acme.example")
    dave = await kb.principals_for("user:dave@acme.example")
    assert "group:wiki/eng@acme.example" in mallory.principals and "group:drive/eng@acme.example" not in mallory.principals
    assert "group:drive/eng@acme.example" in dave.principals and "group:wiki/eng@acme.example" not in dave.principals
    # Each group grants exactly its own source's documents.
    assert ids["launch"] in await visible(kb, "when is the falcon launch", "user:mallory@acme.example")
    assert ids["arch"] not in await visible(kb, "how does billing talk to the ledger", "user:mallory@acme.example")
    assert ids["arch"] in await visible(kb, "how does billing talk to the ledger", "user:dave@acme.example")
    assert ids["launch"] not in await visible(kb, "when is the falcon launch", "user:dave@acme.example")
    # The answer path too: Mallory's question about the Drive file cites nothing of it.
    answer = await kb.answer("how does billing talk to the ledger?", mallory.principals, "t:mallory")
    assert ids["arch"] not in [c.external_id for c in answer.citations]
    # Folder sources: `group:eng@…` is local (neither directory grants it); `group:drive/…` is the Google group's.
    for person in ("user:mallory@acme.example", "user:dave@acme.example"):
        assert "local/offsite.md" not in await visible(kb, "where is the engineering offsite", person)
    assert "local/offsite.md" in await visible(kb, "where is the engineering offsite", "group:eng@acme.example")
    assert "synced/oncall.md" in await visible(kb, "when does on-call hand over", "user:dave@acme.example")
    assert "synced/oncall.md" not in await visible(kb, "when does on-call hand over", "user:mallory@acme.example")

    resolved, verdicts = await kb.explain_access("user:mallory@acme.example", "Architecture")
    assert not verdicts[0].visible and "group:drive/eng@acme.example" in verdicts[0].access
    assert resolved.to_dict()["scopes"]["group:wiki/eng@acme.example"] == "source wiki's directory"


def test_cli_as_and_access_explain_show_the_scope(fresh_database, monkeypatch, drive):
    """`--as group:<source>/<name>` asks as that group's members; an unscoped `--as group:<name>` is the local group
    and says which synced groups it is not; `access explain` names the directory that defines each group; a
    look-alike or an empty local part is refused with one line."""
    from test_cli import assert_usage_error

    monkeypatch.setenv("DATABASE_URL", fresh_database())
    ids = workspace(drive)
    ok("source", "add", "gdrive", "drive", "--folder", ids["root"], "--admin-email", "admin@acme.example")
    ok("sync", "drive")
    scoped = ok_json("search", "how does billing talk to the ledger", "--as", "group:drive/eng@acme.example")
    assert ids["arch"] in [h["document"]["external_id"] for h in scoped["results"]]
    local = cli("search", "how does billing talk to the ledger", "--as", "group:eng@acme.example", "--json")
    assert local.exit_code == 0, local.stderr
    assert ids["arch"] not in [h["document"]["external_id"] for h in json.loads(local.stdout)["results"]]
    assert "group:drive/eng@acme.example" in " ".join(local.stderr.split())

    explained = " ".join(text(ok("access", "explain", "user:dave@acme.example")).split())
    assert "group:drive/eng@acme.example" in explained and "source drive's directory" in explained
    as_json = ok_json("access", "explain", "user:dave@acme.example")
    assert as_json["scopes"]["group:drive/platform@acme.example"] == "source drive's directory"

    kelvin = cli("search", "ledger", "--as", "user:ali\u212ae@acme.example")
    assert_usage_error(kelvin, "U+212A")
    assert_usage_error(cli("access", "explain", "user:\uff41lice@acme.example"), "U+FF41")
    assert_usage_error(cli("search", "ledger", "--as", "user:@acme.example"), "no name before the @")
    assert_usage_error(cli("users", "map", "slack:U1", "group:drive/\u212aeys"), "U+212A")


async def test_one_forbidden_google_group_is_skipped_and_only_it_expires(kb_factory, drive):
    """A 403 on one group's members.list does not fail the refresh (nor blame domain-wide delegation): the other
    groups are refreshed, that group is reported and keeps its last members until one TTL after they were listed,
    then it alone stops granting."""
    kb = await kb_factory(access_cache_seconds=0)
    ids = workspace(drive)
    await add_drive(kb, ids)
    await kb.refresh_groups("drive")
    (first,) = await kb.group_directories()
    drive.directory.forbid("sales@acme.example")
    drive.directory.remove_member("platform@acme.example", "gus@acme.example")
    report = await kb.refresh_groups("drive")
    assert list(report.skipped) == ["group:drive/sales@acme.example"]
    assert "403" in report.skipped["group:drive/sales@acme.example"]
    assert "delegation" not in report.skipped["group:drive/sales@acme.example"]
    (state,) = await kb.group_directories()
    assert state.error is None and state.refreshed_at > first.refreshed_at
    assert state.skipped and "group:drive/sales@acme.example" in state.skipped[0]
    # The others were refreshed (Gus left platform@), sales@ keeps its last members for now.
    assert ids["arch"] not in await visible(kb, "how does billing talk to the ledger", "user:gus@acme.example")
    assert ids["quota"] in await visible(kb, "sales quota per region", "user:sam@acme.example")

    # One TTL after sales@ was last listed (but within the directory's own TTL): only sales@ stops granting.
    ttl = 3600
    now = [first.refreshed_at.timestamp() + ttl + (state.refreshed_at - first.refreshed_at).total_seconds() / 2]
    resolver = AccessResolver(kb.search_engine, ttl_seconds=ttl, cache_seconds=30, clock=lambda: now[0])
    sam = await resolver.principals_for("user:sam@acme.example")
    assert "group:drive/sales@acme.example" not in sam.principals and not sam.expired
    assert sam.expired_groups == ("group:drive/sales@acme.example",)
    hits = await kb.search("sales quota per region", SearchFilters(sam.principals), k=5)
    assert ids["quota"] not in [h.external_id for h in hits.hits]
    dave = await resolver.principals_for("user:dave@acme.example")
    assert "group:drive/eng@acme.example" in dave.principals  # the rest of the directory still grants

    # Refused on every group: the whole refresh is refused and the last good membership kept.
    for email in list(drive.directory.groups):
        drive.directory.forbid(email)
    with pytest.raises(SourceAuthError, match="every group"):
        await kb.refresh_groups("drive")
    drive.directory.forbid("sales@acme.example", False)
    for email in list(drive.directory.groups):
        drive.directory.forbid(email, False)
    assert not (await kb.refresh_groups("drive")).skipped  # listed again: sales@ is fresh once more
    assert "group:drive/sales@acme.example" in (await kb.principals_for("user:sam@acme.example")).principals


async def test_look_alikes_never_fold_into_someone_elses_address(kb_factory, drive, tmp_path):
    """Emails fold in ASCII only: a Kelvin sign (U+212A) stays itself, so `user:aliKe@…` with one is not Alike. A
    CUSTOMER membership needs a real address: `user:@acme.example` (or a Confluence id that looks like an address)
    is nobody in the Workspace. An `.access` line holding a look-alike grants nobody, with a clear reason."""
    from conftest import write

    from knowledge.sources.folder import FolderSource

    kb = await kb_factory(access_cache_seconds=0)
    ids = workspace(drive)
    ids["alike"] = drive.add_doc("Review", ids["root"], html="<p>Alike's review is scheduled for Friday.</p>",
                                 permissions=[drive.user("Alike@acme.example")])
    await add_drive(kb, ids)
    await kb.refresh_groups("drive")
    assert ids["alike"] in await visible(kb, "when is the review scheduled", "user:ALIKE@acme.example")
    kelvin = "user:ali\u212ae@acme.example"
    resolved = await kb.principals_for(kelvin)
    assert "user:alike@acme.example" not in resolved.principals
    assert ids["alike"] not in await visible(kb, "when is the review scheduled", kelvin)

    for nobody in ("user:@acme.example", "user:confluence:mallory@acme.example"):
        held = (await kb.principals_for(nobody)).principals
        assert "group:drive/all@acme.example" not in held, nobody
        assert ids["party"] not in await visible(kb, "summer party rooftop", nobody)
    assert "group:drive/all@acme.example" in (await kb.principals_for("user:sam@acme.example")).principals

    write(tmp_path, "review/.access", "user:ali\u212ae@acme.example\n")
    write(tmp_path, "review/notes.md", "# Review notes\n\nThe review notes are kept by the people team.\n")
    report = await kb.sync(FolderSource(tmp_path, "notes"))
    assert any("U+212A" in w and "nobody may see" in w for w in report.warnings), report.warnings
    assert "review/notes.md" not in await visible(kb, "who keeps the review notes", kelvin, expand=False)


async def test_an_index_from_before_scoped_groups_migrates_without_a_resync(kb_factory, fresh_database, drive,
                                                                           monkeypatch):
    """Migration 0014: an index whose documents, chunks and directories carry unscoped groups (as before issue 38)
    is rewritten in place to exactly what a sync now writes, so no re-sync is needed and the cross-source grant is
    gone at once; admin mappings to an unscoped group keep granting what they granted."""
    from migrating import migrate_to
    from sqlalchemy import text as sql

    from db.migrate import upgrade_to_head

    async def acl() -> dict[str, object]:
        async with kb.engine.connect() as conn:
            documents = (await conn.execute(sql(
                "SELECT s.name || ':' || d.external_id AS id, d.access FROM documents d JOIN sources s "
                "ON s.id = d.source_id ORDER BY 1"))).all()
            chunks = (await conn.execute(sql(
                "SELECT DISTINCT s.name || ':' || d.external_id AS id, c.access FROM chunks c JOIN documents d "
                "ON d.id = c.document_id JOIN sources s ON s.id = d.source_id ORDER BY 1"))).all()
            members = (await conn.execute(sql(
                "SELECT s.name, m.group_principal, m.member FROM directory_members m JOIN sources s "
                "ON s.id = m.source_id ORDER BY 1, 2, 3"))).all()
        return {"documents": [tuple(r) for r in documents], "chunks": [tuple(r) for r in chunks],
                "members": [tuple(r) for r in members]}

    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    url = fresh_database()
    kb = await kb_factory(url, access_cache_seconds=0)
    with FakeConfluence(edition="cloud") as wiki:
        ids = same_named_groups(wiki, drive)
        await add_wiki(kb, wiki)
    await add_drive(kb, ids)
    await kb.refresh_groups("drive")
    synced = await acl()
    state = BotState(kb.engine)
    await state.map_identity("slack:UM", "group:drive/eng@acme.example", "admin")

    async with kb.engine.begin() as conn:
        await migrate_to(conn, "0013_lease")
    before = await acl()  # the index as the code before issue 38 wrote it
    flat = repr(before)
    assert "group:eng@acme.example" in flat and "group:drive/" not in flat and "group:wiki/" not in flat
    assert await state.identity_principals("slack:UM") == ["group:eng@acme.example"]

    await upgrade_to_head(kb.engine)
    kb.access.invalidate()
    assert await acl() == synced  # exactly what a sync writes now: nothing left to re-sync
    assert ids["arch"] not in await visible(kb, "how does billing talk to the ledger", "user:mallory@acme.example")
    assert ids["arch"] in await visible(kb, "how does billing talk to the ledger", "user:dave@acme.example")
    assert ids["launch"] in await visible(kb, "when is the falcon launch", "user:mallory@acme.example")
    # The admin's mapping to `group:eng@acme.example` granted both sources' groups of that name; it still does.
    assert set(await state.identity_principals("slack:UM")) == {
        "group:eng@acme.example", "group:drive/eng@acme.example", "group:wiki/eng@acme.example"}
    report = await kb.sync_source("drive")
    assert not (report.added or report.updated or report.metadata_updated), report
