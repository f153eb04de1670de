"""Confluence through the real client code (httpx) against a fake Confluence speaking the REST v1 shapes."""

from __future__ import annotations

import asyncio
import time

import pytest
from fakes.confluence_api import FakeConfluence
from sqlalchemy import text

from knowledge.errors import SourceAuthError, SourceConfigError, SourceError, SourceUnavailable
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.confluence import storage_to_markdown

VPN = (
    "<h2>Install</h2><p>Install the WireGuard client from Self Service.</p>"
    '<ac:structured-macro ac:name="code"><ac:parameter ac:name="language">bash</ac:parameter>'
    "<ac:plain-text-body><![CDATA[wg-quick up northwind0]]></ac:plain-text-body></ac:structured-macro>"
    '<ac:structured-macro ac:name="warning"><ac:rich-text-body><p>Never share your private key.</p>'
    "</ac:rich-text-body></ac:structured-macro>"
)
LEAVE = (
    "<h2>Allowance</h2><table><tbody><tr><th>Years</th><th>Days</th></tr><tr><td>0-5</td><td>25</td></tr>"
    "<tr><td>5+</td><td>28</td></tr></tbody></table>"
    '<ac:structured-macro ac:name="expand"><ac:parameter ac:name="title">Carry-over</ac:parameter>'
    "<ac:rich-text-body><ul><li>Up to 5 unused days carry over to March.</li></ul></ac:rich-text-body>"
    "</ac:structured-macro>"
)


def handbook(wiki: FakeConfluence) -> dict[str, str]:
    wiki.add_space("ENG", "Engineering")
    ids = {"root": wiki.add_page("ENG", "Handbook", "<p>The Northwind engineering handbook.</p>")}
    ids["vpn"] = wiki.add_page("ENG", "VPN setup", VPN, parent=ids["root"])
    ids["leave"] = wiki.add_page("ENG", "Leave policy", LEAVE, parent=ids["root"])
    ids["draft"] = wiki.add_page("ENG", "Old draft", "<p>The launch codeword is pineapple.</p>", labels=["archived"])
    ids["oncall"] = wiki.add_page("ENG", "On-call", "<p>The on-call rotation hands over on Mondays at 10am.</p>",
                                  parent=ids["root"])
    ids["blog"] = wiki.add_page("ENG", "Offsite recap", "<p>The offsite was held in Lisbon in October.</p>",
                                type="blogpost")
    ids["runbook"] = wiki.add_attachment(ids["oncall"], "runbook.txt",
                                         b"Restart the billing worker with systemctl restart billing.", "text/plain")
    wiki.add_attachment(ids["oncall"], "diagram.png", b"\x89PNG....", "image/png")
    return ids


@pytest.fixture
def wiki(monkeypatch):
    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    with FakeConfluence(edition="cloud") as fake:
        yield fake


def cloud_config(wiki: FakeConfluence, **extra) -> dict:
    return {"url": wiki.base_url, "spaces": ["ENG"], "email": wiki.email, "exclude_labels": ["archived"], **extra}


async def documents(kb) -> dict[str, tuple[str, list[str]]]:
    async with kb.engine.connect() as conn:
        rows = await conn.execute(text("SELECT external_id, title, access FROM documents"))
        return {r.external_id: (r.title, sorted(r.access)) for r in rows}


async def top(kb, query: str, principals=("everyone",)) -> list[str]:
    return [h.external_id for h in (await kb.search(query, SearchFilters(tuple(principals)), k=3)).hits]


async def test_first_sync_indexes_pages_blogposts_and_attachments_as_markdown(fresh_kb, wiki):
    ids = handbook(wiki)
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    report = await fresh_kb.sync_source("wiki")
    expected = {ids[k] for k in ("root", "vpn", "leave", "oncall", "blog", "runbook")}
    assert set(report.added) == expected and report.failed == []
    assert set(await documents(fresh_kb)) == expected  # no archived draft, no png

    hit = (await fresh_kb.search("how do I bring the VPN tunnel up", SearchFilters(), k=1)).hits[0]
    assert hit.external_id == ids["vpn"] and hit.title == "VPN setup"
    assert hit.path == "Engineering > Handbook > VPN setup"
    assert hit.url == f"{wiki.base_url}/spaces/ENG/pages/{ids['vpn']}/VPN+setup"
    all_text = await _text_of(fresh_kb, ids["vpn"]) + await _text_of(fresh_kb, ids["leave"])
    assert "wg-quick up northwind0" in all_text and "Warning:" in all_text and "private key" in all_text
    assert "| 5+ | 28 |" in all_text and "Carry-over" in all_text and "carry over to March" in all_text
    assert (await top(fresh_kb, "how do I restart the billing worker"))[0] == ids["runbook"]
    assert ids["draft"] not in await top(fresh_kb, "launch codeword pineapple")
    # Cloud's search paged only by cursor, relative to `_links.base`: three pages of three were followed.
    searches = [r for r in wiki.requests if "/content/search" in r]
    assert len(searches) == 3 and all("cursor=" in r for r in searches[1:]) and "start=" not in "".join(searches)
    assert all(r.startswith("/wiki/rest/api/") for r in searches)


async def test_an_edit_re_indexes_one_page_and_fetches_and_embeds_nothing_else(fresh_kb, wiki):
    ids = handbook(wiki)
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    await fresh_kb.sync_source("wiki")
    downloads = sum("/download" in r for r in wiki.requests)

    wiki.edit_page(ids["oncall"], "<p>The on-call rotation hands over on Tuesdays at 9am.</p>")
    report = await fresh_kb.sync_source("wiki")
    assert report.updated == [ids["oncall"]] and report.added == [] and report.deleted == []
    assert report.chunks_embedded == 1  # the one chunk of the edited page
    assert sum("/download" in r for r in wiki.requests) == downloads  # the attachment was not fetched again
    hit = (await fresh_kb.search("when does on-call hand over", SearchFilters(), k=1)).hits[0]
    assert "Tuesdays at 9am" in hit.text


async def test_a_deleted_page_disappears_after_the_prune(fresh_kb, wiki):
    ids = handbook(wiki)
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    await fresh_kb.sync_source("wiki")
    wiki.delete_page(ids["oncall"])  # and its attachment

    incremental = await fresh_kb.sync_source("wiki")  # no delete feed: nothing to see yet
    assert incremental.deleted == [] and not incremental.pruned
    full = await fresh_kb.sync_source("wiki", full=True)
    assert full.pruned and sorted(full.deleted) == sorted([ids["oncall"], ids["runbook"]])
    assert full.chunks_embedded == 0
    assert ids["oncall"] not in await top(fresh_kb, "when does on-call hand over")

    wiki.edit_page(ids["blog"], labels=["archived"])  # labelled out later: removed on the next sync
    assert (await fresh_kb.sync_source("wiki")).deleted == [ids["blog"]]


async def test_a_sync_killed_midway_resumes_and_ends_with_exactly_the_source(fresh_kb, wiki):
    ids = handbook(wiki)
    for n in range(4):
        wiki.add_page("ENG", f"Team page {n}", f"<p>Team {n} sits on floor {n + 2}.</p>")
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    wiki.hold_next_pages()
    task = asyncio.create_task(fresh_kb.sync_source("wiki"))
    assert await asyncio.to_thread(wiki.held.wait, 30)  # the first results page is being committed
    async def first_page_committed() -> bool:  # its documents first, then its checkpoint
        async with fresh_kb.engine.connect() as conn:
            saved = (await conn.execute(text("SELECT checkpoint FROM sources WHERE name = 'wiki'"))).scalar()
        return len(await documents(fresh_kb)) == 3 and saved is not None

    for _ in range(600):
        if await first_page_committed():
            break
        await asyncio.sleep(0.05)
    task.cancel()  # killed mid-run, while the second page is held
    with pytest.raises(asyncio.CancelledError):
        await task
    wiki.release()
    partial = await documents(fresh_kb)
    assert len(partial) == 3
    async with fresh_kb.engine.connect() as conn:
        checkpoint = (await conn.execute(text("SELECT checkpoint FROM sources WHERE name = 'wiki'"))).scalar()
    assert checkpoint is not None  # moved as far as the committed page, no further

    report = await fresh_kb.sync_source("wiki")
    assert report.unchanged == 3 and report.chunks_embedded > 0
    final = await documents(fresh_kb)
    expected = {ids[k] for k in ("root", "vpn", "leave", "oncall", "blog", "runbook")} | {
        pid for pid, page in wiki.pages.items() if page.title.startswith("Team page")}
    assert set(final) == expected
    async with fresh_kb.engine.connect() as conn:
        dupes = (await conn.execute(text(
            "SELECT count(*) FROM (SELECT document_id, ordinal FROM chunks GROUP BY 1, 2 HAVING count(*) > 1) d"
        ))).scalar()
    assert dupes == 0
    runs = await fresh_kb.sync_runs("wiki")
    assert [r.status for r in runs] == ["ok", "interrupted"] and "CancelledError" in runs[1].error


async def test_a_restriction_added_to_a_parent_hides_its_child_from_others(fresh_kb, wiki):
    ids = handbook(wiki)
    wiki.add_user("acc-alice", "Alice", "Alice@Acme.example")
    wiki.add_user("acc-bob", "Bob", None)  # Cloud hides Bob's email
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    await fresh_kb.sync_source("wiki")
    assert (await top(fresh_kb, "how do I bring the VPN tunnel up"))[0] == ids["vpn"]

    wiki.restrict(ids["root"], users=["acc-alice", "acc-bob"], groups=["it"])  # no new version
    report = await fresh_kb.sync_source("wiki", prune=True)
    assert ids["vpn"] in report.metadata_updated and report.chunks_embedded == 0
    docs = await documents(fresh_kb)
    assert docs[ids["vpn"]][1] == ["group:wiki/it", "user:alice@acme.example", "user:confluence:acc-bob"]
    assert docs[ids["runbook"]][1] == docs[ids["oncall"]][1]  # attachments follow their page
    assert docs[ids["blog"]][1] == ["everyone"]
    assert ids["vpn"] not in await top(fresh_kb, "how do I bring the VPN tunnel up", ["user:mallory@acme.example"])
    assert ids["vpn"] in await top(fresh_kb, "how do I bring the VPN tunnel up", ["group:wiki/it"])

    wiki.restrict(ids["vpn"], groups=["it", "security"])  # the child narrows it further: both must allow
    await fresh_kb.sync_source("wiki", prune=True)
    assert (await documents(fresh_kb))[ids["vpn"]][1] == ["group:wiki/it"]


async def test_space_permissions_and_visibility_everyone(fresh_kb, kb_factory, wiki):
    wiki.add_space("HR", "People team", readers=[("group", "hr"), ("user", "acc-carol")])
    wiki.add_space("PUB", "Public", readers=[("anonymous", ""), ("group", "hr")])
    wiki.add_user("acc-carol", "Carol", "carol@acme.example")
    wiki.add_page("HR", "Salary bands", "<p>Band L3 pays 120k to 150k.</p>")
    wiki.add_page("PUB", "Office hours", "<p>The office opens at 8am.</p>")
    config = {"url": wiki.base_url, "spaces": ["HR", "PUB"], "email": wiki.email}
    await fresh_kb.add_source("wiki", "confluence", config)
    await fresh_kb.sync_source("wiki")
    access = {title: acl for title, acl in (await documents(fresh_kb)).values()}
    assert access == {"Salary bands": ["group:wiki/hr", "user:carol@acme.example"], "Office hours": ["everyone"]}

    other = await kb_factory()
    before = len(wiki.requests)
    await other.add_source("open", "confluence", {**config, "visibility": "everyone"})
    await other.sync_source("open", full=True)
    assert {tuple(acl) for _, acl in (await documents(other)).values()} == {("everyone",)}
    assert not any("restriction" in r or "permissions" in r for r in wiki.requests[before:])


async def test_a_429_storm_is_survived_and_retry_after_is_honoured(fresh_kb, wiki):
    handbook(wiki)
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    wiki.fail_next(4, status=429, retry_after="0")
    wiki.fail_next(1, status=503, retry_after="1")
    started = time.monotonic()
    report = await fresh_kb.sync_source("wiki")
    assert len(report.added) == 6 and report.failed == []
    assert time.monotonic() - started >= 1.0  # the 503's Retry-After: 1 was waited out


async def test_a_storm_past_the_retry_bound_fails_cleanly_and_keeps_the_index(fresh_kb, wiki):
    ids = handbook(wiki)
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    await fresh_kb.sync_source("wiki")
    wiki.edit_page(ids["vpn"], VPN + "<p>New text</p>")
    wiki.fail_next(50, status=429, retry_after="0")
    with pytest.raises(SourceUnavailable, match="'wiki'.*kept answering 429.*next sync retries"):
        await fresh_kb.sync_source("wiki")
    wiki.scripted.clear()
    assert len(await documents(fresh_kb)) == 6
    assert (await fresh_kb.sync_runs("wiki"))[0].status == "failed"
    assert (await fresh_kb.sync_source("wiki")).updated == [ids["vpn"]]  # the next interval catches up


async def test_a_bad_token_gives_a_clear_error_and_deletes_nothing(fresh_kb, wiki, monkeypatch):
    handbook(wiki)
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    await fresh_kb.sync_source("wiki")
    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "revoked-token")
    with pytest.raises(SourceAuthError) as caught:
        await fresh_kb.sync_source("wiki", full=True)
    message = str(caught.value)
    assert "'wiki'" in message and "refused the credentials (401)" in message and "CONFLUENCE_API_TOKEN" in message
    assert "revoked-token" not in message
    assert len(await documents(fresh_kb)) == 6
    run = (await fresh_kb.sync_runs("wiki"))[0]
    assert run.status == "failed" and run.deleted == 0 and "401" in run.error

    monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
    with pytest.raises(SourceConfigError, match="space 'NOPE' was not found"):
        await fresh_kb.add_source("bad", "confluence", {**cloud_config(wiki), "spaces": ["NOPE"]})
    monkeypatch.delenv("CONFLUENCE_API_TOKEN")
    with pytest.raises(SourceAuthError, match="CONFLUENCE_API_TOKEN is not set"):
        await fresh_kb.add_source("bad", "confluence", cloud_config(wiki))
    assert [s.name for s in await fresh_kb.list_sources()] == ["wiki"]  # broken sources are never saved


async def test_data_center_bearer_token_context_path_and_start_paging(fresh_kb, monkeypatch):
    monkeypatch.setenv("DC_PAT", "pat-123")
    with FakeConfluence(edition="dc", token="pat-123") as wiki:
        wiki.add_space("OPS", "Operations", readers=[("group", "ops"), ("user", "dave")])
        wiki.add_user("dave", "Dave", None)
        ids = [wiki.add_page("OPS", f"Runbook {n}", f"<p>Runbook {n} restarts service {n}.</p>") for n in range(8)]
        wiki.restrict(ids[0], users=["dave"])
        await fresh_kb.add_source("ops", "confluence", {"url": wiki.base_url, "spaces": ["OPS"], "token_env": "DC_PAT"})
        report = await fresh_kb.sync_source("ops")
        assert sorted(report.added) == sorted(ids)
        searches = [r for r in wiki.requests if "/content/search" in r]
        assert len(searches) == 3 and "start=3" in searches[1] and "start=6" in searches[2]  # pages by start
        assert all(r.startswith("/confluence/") for r in wiki.requests)
        docs = await documents(fresh_kb)
        assert docs[ids[0]][1] == ["user:confluence:dave"]
        assert docs[ids[1]][1] == ["group:ops/ops", "user:confluence:dave"]


def test_storage_format_keeps_structure_and_macro_text():
    markdown = storage_to_markdown(
        "<h1>Title</h1><h3>Sub</h3><ol><li>one</li><li>two</li></ol>"
        '<ac:structured-macro ac:name="info"><ac:parameter ac:name="title">Heads up</ac:parameter>'
        "<ac:rich-text-body><p>Read this.</p></ac:rich-text-body></ac:structured-macro>"
        '<p>See <ac:link><ri:page ri:content-title="Other page"/></ac:link> and '
        '<ac:image><ri:attachment ri:filename="x.png"/></ac:image>done.</p>'
        '<ac:structured-macro ac:name="code"><ac:plain-text-body><![CDATA[if a < b: print("<ok>")]]>'
        "</ac:plain-text-body></ac:structured-macro>"
    )
    assert "# Title" in markdown and "### Sub" in markdown and "1. one" in markdown and "2. two" in markdown
    assert "> Info: Heads up" in markdown and "> Read this." in markdown
    assert "See Other page and done." in markdown
    assert '```\nif a < b: print("<ok>")\n```' in markdown


async def _text_of(kb, external_id: str) -> str:
    async with kb.engine.connect() as conn:
        rows = await conn.execute(text(
            "SELECT c.text FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.external_id = :e "
            "ORDER BY c.ordinal"), {"e": external_id})
        return "\n".join(r.text for r in rows)


# --- paging and HTTP failures, against the shapes of Atlassian's documented examples (issue 29) ---------------


async def test_v2_space_permissions_follow_site_relative_next_links_across_three_pages(fresh_kb, wiki):
    """Issue 29: v2's `_links.next` (and `Link` header) starts with /wiki and is relative to the SITE, while the
    same answer's `_links.base` is https://SITE/wiki. Joining them asked for /wiki/wiki/... and failed the sync."""
    readers = [("group", f"team-{n}") for n in range(5)] + [("user", "acc-erin"), ("user", "acc-finn")]
    wiki.add_space("HR", "People team", readers=readers)  # 7 read assignments + 1 administer: 3 pages of 3
    wiki.add_user("acc-erin", "Erin", "erin@acme.example")
    wiki.add_user("acc-finn", "Finn", None)
    wiki.add_page("HR", "Salary bands", "<p>Band L3 pays 120k to 150k.</p>")
    await fresh_kb.add_source("wiki", "confluence", {"url": wiki.base_url, "spaces": ["HR"], "email": wiki.email})
    report = await fresh_kb.sync_source("wiki")
    assert len(report.added) == 1 and report.failed == []
    assert wiki.v2_pages == 3
    assert not any("/wiki/wiki/" in r for r in wiki.requests)
    ((title, access),) = (await documents(fresh_kb)).values()
    assert access == sorted([f"group:wiki/team-{n}" for n in range(5)] + ["user:erin@acme.example",
                                                                      "user:confluence:acc-finn"])


async def test_long_restriction_lists_are_paged_by_start(fresh_kb, wiki):
    ids = handbook(wiki)
    people = [f"acc-{n}" for n in range(7)]
    wiki.restrict(ids["vpn"], users=people)  # byOperation cuts the list at its limit (3): the rest by start
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    await fresh_kb.sync_source("wiki")
    assert (await documents(fresh_kb))[ids["vpn"]][1] == sorted(f"user:confluence:{p}" for p in people)
    assert [start for page, paged, start in wiki.restriction_requests if page == ids["vpn"] and paged] == [0, 3, 6]


async def test_one_failing_space_keeps_the_others_and_names_source_space_and_path(fresh_kb, wiki):
    handbook(wiki)
    wiki.add_space("HR", "People team", readers=[("group", "hr")])
    salary = wiki.add_page("HR", "Salary bands", "<p>Band L3 pays 120k to 150k.</p>")
    hr_id = wiki.spaces["HR"]["id"]
    wiki.broken[rf"/api/v2/spaces/{hr_id}/permissions"] = 404
    await fresh_kb.add_source("wiki", "confluence", {**cloud_config(wiki), "spaces": ["HR", "ENG"]})
    with pytest.raises(SourceConfigError) as caught:
        await fresh_kb.sync_source("wiki")
    message = str(caught.value)
    assert "\n" not in message and "NotFound" not in message and "Error" not in message
    assert message.startswith("source 'wiki', space 'HR': Confluence answered 404 for "
                              f"/wiki/api/v2/spaces/{hr_id}/permissions")
    assert "space key" in message
    assert len(await documents(fresh_kb)) == 6 and salary not in await documents(fresh_kb)  # ENG was synced
    run = (await fresh_kb.sync_runs("wiki"))[0]
    assert run.status == "failed" and run.error == message and run.added == 6

    del wiki.broken[rf"/api/v2/spaces/{hr_id}/permissions"]
    report = await fresh_kb.sync_source("wiki")
    assert report.added == [salary] and report.unchanged == 6  # ENG's checkpoint was kept, HR's was not moved


async def test_items_gone_mid_sync_are_skipped_and_recorded_and_the_run_goes_on(fresh_kb, wiki):
    ids = handbook(wiki)
    wiki.broken[rf"/rest/api/content/{ids['oncall']}/child/attachment/{ids['runbook']}/download"] = 404
    wiki.broken[rf"/rest/api/content/{ids['leave']}/restriction/byOperation"] = 404
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    report = await fresh_kb.sync_source("wiki")
    failed = dict(report.failed)
    assert set(failed) == {ids["runbook"], ids["leave"]}
    assert "deleted during the sync" in failed[ids["runbook"]]
    assert "deleted during the sync" in failed[ids["leave"]] and "restriction" in failed[ids["leave"]]
    assert set(report.added) == {ids[k] for k in ("root", "vpn", "oncall", "blog")}
    assert (await fresh_kb.sync_runs("wiki"))[0].status == "ok"


@pytest.mark.parametrize("status, expected", [
    (403, "denied access (403) to /wiki/rest/api/content/search; give the account"),
    (404, "answered 404 for /wiki/rest/api/content/search; check the space key"),
    (400, "refused the request (400) for /wiki/rest/api/content/search"),
    (500, "answered 500 (a server error) for /wiki/rest/api/content/search"),
    (502, "retry later"),
])
async def test_every_http_failure_of_a_listing_is_one_line_naming_the_fix(fresh_kb, wiki, status, expected):
    handbook(wiki)
    await fresh_kb.add_source("wiki", "confluence", cloud_config(wiki))
    wiki.broken[r"/rest/api/content/search"] = status
    with pytest.raises(SourceError) as caught:
        await fresh_kb.sync_source("wiki")
    message = str(caught.value)
    assert message.startswith("source 'wiki', space 'ENG': ") and expected in message and "\n" not in message
    assert "Error" not in message and "Confluence" in message
