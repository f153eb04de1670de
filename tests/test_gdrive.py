"""Google Drive source: the real google-api-python-client (and google-auth's service-account flow) against a local
fake Drive v3, synced into a real database, checked through search as the people who may or may not see each file.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fakes.drive_api import FakeDrive
from sqlalchemy import text

from knowledge.errors import SourceAuthError, SourceConfigError, SourceUnavailable
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.base import build_source
from knowledge.sources.gdrive import GoogleDriveConfig, GoogleDriveSettings, GoogleDriveSource
from knowledge.storage import sources as sources_store

LEAVE_HTML = """<html><head><title>Leave policy</title><style>p {color: red}</style></head><body>
<h1>Leave policy</h1>
<h2>Paid time off</h2><p>Everyone gets 27 days of paid time off per calendar year, booked in Workday.</p>
<h2>Parental leave</h2><ul><li>Birth parents: 20 weeks fully paid.</li><li>Other parents: 12 weeks fully paid.</li></ul>
<table><tr><th>Tenure</th><th>Extra days</th></tr><tr><td>5 years</td><td>3</td></tr></table>
</body></html>"""
VPN_MD = b"# VPN\n\n## Install\n\nInstall Tailscale from Self Service and sign in with Okta.\n"
WIFI_TXT = b"The office wifi network is called northwind-guest and its password rotates monthly."


@pytest.fixture(scope="session")
def private_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


@pytest.fixture
def drive(monkeypatch, private_key_pem):
    """A fake Drive that insists on a bearer token, a service-account key whose token endpoint is the fake's, and
    the Drive settings pointing at the fake (backoff shortened so storms pass quickly)."""
    with FakeDrive(require_auth=True) as fake:
        monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT_JSON", fake.service_account_json(private_key_pem))
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        for name, value in dict(API_ENDPOINT=fake.endpoint, BACKOFF_SECONDS="0.01", MAX_BACKOFF_SECONDS="0.05",
                                EVERYONE_DOMAINS="northwind.example", MAX_FILE_MB="25", MAX_RETRIES="6").items():
            monkeypatch.setenv(f"GDRIVE_{name}", value)
        yield fake


def settings_for(fake: FakeDrive, **overrides: Any) -> GoogleDriveSettings:
    values: dict[str, Any] = dict(api_endpoint=fake.endpoint, backoff_seconds=0.01, max_backoff_seconds=0.05,
                                  everyone_domains="northwind.example")
    values.update(overrides)
    return GoogleDriveSettings(_env_file=None, **values)  # type: ignore[call-arg]


class DriveSync:
    """A stored Drive source, synced the way `ragbot sync` and the scheduler do it (`KnowledgeBase.sync_source`)."""

    def __init__(self, kb, name: str) -> None:  # type: ignore[no-untyped-def]
        self.kb, self.name = kb, name

    @classmethod
    async def add(cls, kb, name: str = "drive", **config: Any) -> DriveSync:  # type: ignore[no-untyped-def]
        await kb.add_source(name, "gdrive", GoogleDriveConfig(**config).to_dict())
        return cls(kb, name)

    async def run(self, **kwargs: Any):  # type: ignore[no-untyped-def]
        return await self.kb.sync_source(self.name, **kwargs)

    async def checkpoint(self) -> str | None:
        async with self.kb.engine.connect() as conn:
            return (await sources_store.get_source(conn, self.name)).checkpoint


@pytest.fixture
def company(drive):
    """Handbook (folder) with HR/ and IT/ inside, a file outside it, and a doc only Alice and HR may see."""
    ids: dict[str, str] = {}
    ids["root"] = drive.add_folder("Handbook")
    ids["hr"] = drive.add_folder("HR", ids["root"])
    ids["it"] = drive.add_folder("IT", ids["root"])
    ids["outside"] = drive.add_folder("Personal")
    ids["leave"] = drive.add_doc("Leave policy", ids["hr"], html=LEAVE_HTML,
                                 permissions=[drive.user("Alice@Northwind.example"), drive.group("hr@northwind.example")])
    ids["vpn"] = drive.add_file("vpn.md", ids["it"], VPN_MD, "text/markdown", permissions=[drive.domain("northwind.example")])
    ids["wifi"] = drive.add_file("wifi.txt", ids["it"], WIFI_TXT, "text/plain", permissions=[drive.anyone()])
    ids["photo"] = drive.add_file("team.png", ids["root"], b"\x89PNG\r\n\x1a\n" + b"0" * 64, "image/png")
    return ids


def source_for(drive: FakeDrive, ids: dict[str, str], **overrides: Any) -> GoogleDriveSource:
    config = GoogleDriveConfig(folders=(ids["root"],))
    return GoogleDriveSource("drive", config, settings_for(drive, **overrides))


async def found(kb, query: str, *principals: str, k: int = 5) -> list[str]:  # type: ignore[no-untyped-def]
    results = await kb.search(query, SearchFilters(tuple(principals) or ("everyone",)), k=k)
    return [hit.external_id for hit in results.hits]


async def document(kb, external_id: str) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    async with kb.engine.connect() as conn:
        row = (await conn.execute(text(
            "SELECT title, url, path, author, updated_at, access, (SELECT count(*) FROM chunks c WHERE "
            "c.document_id = d.id) AS chunks FROM documents d WHERE external_id = :e"), {"e": external_id})).first()
    return None if row is None else dict(row._mapping)


async def test_first_sync_indexes_the_folder_tree_with_metadata_and_permissions(kb_factory, drive, company):
    kb = await kb_factory()
    report = await (await DriveSync.add(kb, folders=(company["root"],))).run()

    assert sorted(report.added) == sorted([company["leave"], company["vpn"], company["wifi"]])
    assert [reason for _id, reason in report.skipped] == ["unsupported file type .png; ragbot reads "
                                                          ".md, .markdown, .txt, .html, .htm, .pdf, .docx, .csv, .xlsx"]
    leave = await document(kb, company["leave"])
    assert leave["title"] == "Leave policy"
    assert leave["url"] == f"https://docs.google.com/document/d/{company['leave']}/edit?usp=drivesdk"
    assert leave["path"] == "Handbook/HR/Leave policy"
    assert leave["author"] == "owner@example.com" and leave["updated_at"] is not None
    # Owners, users and groups by lower-cased email (a group scoped to the source's directory: issue 38); the
    # workspace domain means everyone; a link means everyone.
    assert sorted(leave["access"]) == ["group:drive/hr@northwind.example", "user:alice@northwind.example",
                                       "user:owner@example.com"]
    assert (await document(kb, company["vpn"]))["access"] == ["everyone", "user:owner@example.com"]
    assert "everyone" in (await document(kb, company["wifi"]))["access"]

    # The Doc was exported as HTML: its headings and list items survive into chunks people can find.
    hits = (await kb.search("how long is parental leave for birth parents", SearchFilters(("group:drive/hr@northwind.example",)), k=3)).hits
    assert hits[0].external_id == company["leave"] and "20 weeks" in hits[0].text
    assert "Parental leave" in hits[0].heading
    assert company["leave"] not in await found(kb, "parental leave weeks", "user:bob@northwind.example")
    assert (await found(kb, "how do I install the VPN", "user:bob@northwind.example"))[0] == company["vpn"]
    assert all(r.headers.get("authorization") == "Bearer ya29.fake-drive-token"
               for r in drive.requests if r.path != "/token")


async def test_sheets_are_read_per_sheet_as_rows_with_the_header_in_every_chunk(kb_factory, drive):
    root = drive.add_folder("Ops")
    people = [["Name", "Office", "Desk phone"]] + [[f"Person {i}", f"Office {i % 5}", f"+1 555 01{i:02d}"]
                                                    for i in range(60)]
    sheet = drive.add_sheet("Directory", root, {"People": people, "Rooms": [["Room", "Floor"], ["Aurora", 3]]},
                            permissions=[drive.anyone()])
    slides = drive.add_slides("All hands", root, "Q3 all hands\n\nRevenue grew 12 percent quarter on quarter.",
                              permissions=[drive.anyone()])
    kb = await kb_factory()
    report = await (await DriveSync.add(kb, "ops", folders=(root,))).run()
    assert sorted(report.added) == sorted([sheet, slides])
    async with kb.engine.connect() as conn:
        chunks = (await conn.execute(text(
            "SELECT c.text, c.heading FROM chunks c JOIN documents d ON d.id = c.document_id "
            "WHERE d.external_id = :e ORDER BY c.ordinal"), {"e": sheet})).all()
    people_chunks = [c for c in chunks if c.heading == "People"]
    assert len(people_chunks) > 1
    assert all(c.text.startswith("| Name | Office | Desk phone |\n| Person ") for c in people_chunks)
    assert any(c.heading == "Rooms" and "| Room | Floor |\n| Aurora | 3 |" in c.text for c in chunks)
    assert {"Person 59", "Person 0"} <= {row.split(" | ")[0].strip("| ") for c in people_chunks for row in c.text.splitlines()}
    assert (await found(kb, "revenue growth in Q3"))[0] == slides


async def test_an_edit_refetches_only_that_file(kb_factory, drive, company):
    kb = await kb_factory()
    sync = await DriveSync.add(kb, folders=(company["root"],))
    await sync.run()
    exports, media = len(drive.calls("files.export")), len(drive.calls("files.media"))
    drive.edit_doc(company["leave"], LEAVE_HTML.replace("27 days", "30 days"))

    report = await sync.run()
    assert report.updated == [company["leave"]] and report.added == [] and report.deleted == []
    assert len(drive.calls("files.export")) == exports + 1 and len(drive.calls("files.media")) == media
    assert report.chunks_embedded <= 2  # the edited section, not the whole document
    hits = (await kb.search("paid time off days per year", SearchFilters(("user:alice@northwind.example",)), k=1)).hits
    assert "30 days" in hits[0].text

    nothing = await sync.run()
    assert (nothing.added, nothing.updated, nothing.deleted, nothing.unchanged) == ([], [], [], 0)
    assert len(drive.calls("files.export")) == exports + 1


async def test_a_rename_changes_the_title_and_breadcrumb(kb_factory, drive, company):
    kb = await kb_factory()
    sync = await DriveSync.add(kb, folders=(company["root"],))
    await sync.run()
    drive.rename(company["leave"], "Time off handbook")
    drive.rename(company["it"], "Tech")  # a folder rename moves the breadcrumb of everything below it
    drive.rename(company["root"], "Company handbook")  # and so does renaming the source's own folder

    report = await sync.run()
    assert company["leave"] in report.updated
    assert (await document(kb, company["leave"]))["title"] == "Time off handbook"
    assert (await document(kb, company["leave"]))["path"] == "Company handbook/HR/Time off handbook"
    assert (await document(kb, company["vpn"]))["path"] == "Company handbook/Tech/vpn.md"
    assert company["vpn"] in report.metadata_updated  # new breadcrumb, same content: not fetched again
    hits = (await kb.search("time off handbook", SearchFilters(("user:alice@northwind.example",)), k=1)).hits
    assert hits[0].title == "Time off handbook"


async def test_moves_out_of_and_into_the_scope(kb_factory, drive, company):
    kb = await kb_factory()
    sync = await DriveSync.add(kb, folders=(company["root"],))
    await sync.run()
    drive.move(company["wifi"], company["outside"])
    drive.move(company["hr"], company["outside"])  # a whole folder leaves, with the Doc inside it

    report = await sync.run()
    assert sorted(report.deleted) == sorted([company["wifi"], company["leave"]])
    assert company["wifi"] not in await found(kb, "office wifi network name")
    assert await document(kb, company["leave"]) is None

    drive.move(company["hr"], company["root"])  # back in: the folder is walked again
    report = await sync.run()
    assert report.added == [company["leave"]]
    assert (await document(kb, company["leave"]))["path"] == "Handbook/HR/Leave policy"


async def test_trashed_and_deleted_files_leave_the_index(kb_factory, drive, company):
    kb = await kb_factory()
    sync = await DriveSync.add(kb, folders=(company["root"],))
    await sync.run()
    drive.trash(company["wifi"])
    drive.delete(company["vpn"])

    report = await sync.run()
    assert sorted(report.deleted) == sorted([company["wifi"], company["vpn"]])
    assert company["wifi"] not in await found(kb, "office wifi network password")
    assert company["vpn"] not in await found(kb, "install Tailscale VPN")

    drive.trash(company["root"])  # the source's own folder: refuse to empty the index over what may be a slip
    with pytest.raises(SourceConfigError, match="is in the trash: restore it or remove it from the source"):
        await sync.run()
    assert await document(kb, company["leave"]) is not None


async def test_a_removed_permission_hides_the_file_without_refetching_it(kb_factory, drive, company):
    kb = await kb_factory()
    sync = await DriveSync.add(kb, folders=(company["root"],))
    await sync.run()
    assert company["leave"] in await found(kb, "parental leave weeks", "user:alice@northwind.example")
    exports = len(drive.calls("files.export"))
    drive.set_permissions(company["leave"], [drive.group("hr@northwind.example")])  # Alice's share removed

    report = await sync.run()
    assert report.metadata_updated == [company["leave"]] and report.updated == []
    assert len(drive.calls("files.export")) == exports  # access changed, content not fetched
    assert company["leave"] not in await found(kb, "parental leave weeks", "user:alice@northwind.example")
    assert company["leave"] in await found(kb, "parental leave weeks", "group:drive/hr@northwind.example")


async def test_shared_drives_count_their_members(kb_factory, drive):
    shared = drive.add_shared_drive("Engineering", [drive.group("eng@northwind.example")])
    runbooks = drive.add_folder("Runbooks", shared)
    runbook = drive.add_doc("Database failover", runbooks, html="<h1>Failover</h1><p>Promote the replica with "
                                                              "pg_ctl promote, then repoint the app.</p>")
    kb = await kb_factory()
    report = await (await DriveSync.add(kb, "eng", shared_drives=(shared,))).run()
    assert report.added == [runbook]
    assert (await document(kb, runbook))["path"] == "Engineering/Runbooks/Database failover"
    assert await found(kb, "how to promote the database replica", "group:eng/eng@northwind.example") == [runbook]
    assert await found(kb, "how to promote the database replica", "user:bob@northwind.example") == []
    listing = [r for r in drive.calls("files.list") if r.query.get("corpora") == "drive"]
    assert listing and all(r.query.get("driveId") == shared and r.query["supportsAllDrives"] == "true"
                           and r.query["includeItemsFromAllDrives"] == "true" for r in listing)


async def test_shortcuts_are_followed_once_and_leave_with_their_shortcut(kb_factory, drive, company):
    guide = drive.add_file("onboarding.md", company["outside"], b"# Onboarding\n\nYour laptop arrives on day one.",
                           "text/markdown", permissions=[drive.anyone()])
    shortcut = drive.add_shortcut("Onboarding guide", company["it"], guide)
    drive.add_shortcut("Back to the top", company["hr"], company["root"])  # a loop
    drive.add_shortcut("Again", company["root"], guide)  # the same target twice
    secret = drive.add_file("salaries.md", company["outside"], b"# Salaries", "text/markdown")
    dangling = drive.add_shortcut("Salaries", company["root"], secret)
    drive.hidden.add(secret)  # the service account cannot open the target
    kb = await kb_factory()
    sync = await DriveSync.add(kb, folders=(company["root"],))
    report = await sync.run()
    assert guide in report.added and report.added.count(guide) == 1
    assert "shortcut 'Salaries': its target is not reachable (404 notFound)" in dict(report.failed)[dangling]
    assert await document(kb, dangling) is None and await document(kb, secret) is None
    assert (await found(kb, "when does my laptop arrive"))[0] == guide
    assert drive.calls("files.list")  # the loop ended: the walk finished

    drive.edit_file(guide, b"# Onboarding\n\nYour laptop arrives a week before day one.")  # outside the scope
    report = await sync.run()
    assert report.updated == [guide]

    templates = drive.add_folder("Templates", company["outside"])
    memo = drive.add_file("memo.md", templates, b"# Memo template\n\nStart every memo with a one-line summary.",
                          "text/markdown", permissions=[drive.anyone()])
    drive.add_shortcut("Team templates", company["it"], templates)  # a shortcut to a folder: walked like one
    report = await sync.run()
    assert report.added == [memo]
    assert (await document(kb, memo))["path"] == "Handbook/IT/Team templates/memo.md"
    drive.rename(templates, "Old templates")
    drive.edit_file(memo, b"# Memo template\n\nStart every memo with a two-line summary.")
    report = await sync.run()
    assert report.updated == [memo] and report.failed == []

    drive.trash(shortcut)
    drive.trash(next(f for f, v in drive.files.items() if v.name == "Again"))
    report = await sync.run()
    assert report.deleted == [guide]


async def test_an_oversized_export_and_an_oversized_file_are_reported_and_skipped(kb_factory, drive, company,
                                                                                monkeypatch):
    monkeypatch.setenv("GDRIVE_MAX_FILE_MB", "1")
    huge = drive.add_doc("Meeting notes archive", company["root"],
                         html="<p>" + "minutes of the weekly meeting. " * 360_000 + "</p>")  # ~11 MB of HTML
    video = drive.add_file("all-hands.txt", company["root"], b"x" * (2 * 1024 * 1024), "text/plain")
    kb = await kb_factory()
    report = await (await DriveSync.add(kb, folders=(company["root"],))).run()
    reasons = dict(report.failed)
    assert reasons[huge] == ("could not read: Handbook/Meeting notes archive: Drive cannot export files over 10 MB "
                             "(exportSizeLimitExceeded); split the document or save a PDF copy in the folder")
    assert "over GDRIVE_MAX_FILE_MB (1 MB)" in reasons[video]
    assert not [r for r in drive.calls("files.media") if video in r.path]  # never downloaded
    assert sorted(report.added) == sorted([company["leave"], company["vpn"], company["wifi"]])


async def test_a_rate_limit_storm_is_survived_and_one_past_the_bound_fails_cleanly(kb_factory, drive, company):
    kb = await kb_factory()
    sync = await DriveSync.add(kb, folders=(company["root"],))
    drive.rate_limit(3, status=429)
    drive.rate_limit(2, status=403, reason="userRateLimitExceeded")
    drive.rate_limit(1, status=403, reason="rateLimitExceeded", retry_after="0")
    report = await sync.run()  # six failures in a row on the first call: just within the bound (GDRIVE_MAX_RETRIES)
    assert sorted(report.added) == sorted([company["leave"], company["vpn"], company["wifi"]])
    assert not drive.storm

    checkpoint = await sync.checkpoint()
    drive.edit_doc(company["leave"], LEAVE_HTML.replace("27 days", "31 days"))
    drive.rate_limit(50, status=429)
    with pytest.raises(SourceUnavailable, match=r"still answers 429 rateLimitExceeded after 6 retries \(rate limited\)"):
        await sync.run()
    assert await sync.checkpoint() == checkpoint  # nothing skipped: the next run starts from the same changes
    assert "after 6 retries" in (await kb.sync_runs("drive"))[0].error
    drive.storm.clear()
    report = await sync.run()
    assert report.updated == [company["leave"]]


async def test_a_sync_killed_midway_and_rerun_ends_with_exactly_the_scope(kb_factory, drive):
    root = drive.add_folder("Wiki")
    pages = [drive.add_doc(f"Page {i}", root, html=f"<h1>Page {i}</h1><p>Fact number {i} is about topic {i}.</p>",
                           permissions=[drive.anyone()]) for i in range(12)]
    # Documents commit a batch at a time: batches of 4, so that dying at the fifth document leaves some committed;
    # at most 4 chunks joined into a write, so batches waiting for the writer stay apart.
    kb = await kb_factory(sync_batch_documents=4, write_batch_chunks=4)
    sync = await DriveSync.add(kb, "wiki", folders=(root,))

    class Killed(Exception):
        pass

    class DiesAfterFive:
        done = 0

        def start(self, total: int | None) -> None:
            pass

        def advance(self, label: str) -> None:
            self.done += 1
            if self.done == 5:
                raise Killed

    with pytest.raises(Killed):
        await sync.run(progress=DiesAfterFive())
    assert await sync.checkpoint() is None  # the first listing never finished: no checkpoint
    async with kb.engine.connect() as conn:
        committed = (await conn.execute(text("SELECT count(*) FROM documents"))).scalar_one()
    assert 1 <= committed < 12
    exports = len(drive.calls("files.export"))

    report = await sync.run()
    assert len(report.added) == 12 - committed and report.unchanged == committed
    assert len(drive.calls("files.export")) == exports + 12 - committed  # committed pages were not fetched again
    async with kb.engine.connect() as conn:
        ids = sorted((await conn.execute(text("SELECT external_id FROM documents"))).scalars())
    assert ids == sorted(pages)

    # Killed during an incremental run: the checkpoint stays, and the rerun applies the changes.
    drive.edit_doc(pages[0], "<h1>Page 0</h1><p>Fact number 0 changed to zebra crossings.</p>")
    drive.trash(pages[1])
    checkpoint = await sync.checkpoint()

    class DiesAtOnce(DiesAfterFive):
        done = 4

    with pytest.raises(Killed):
        await sync.run(progress=DiesAtOnce())
    assert await sync.checkpoint() == checkpoint
    report = await sync.run()
    assert report.deleted == [pages[1]]
    assert (await found(kb, "zebra crossings"))[0] == pages[0]


async def test_bad_credentials_and_unreachable_folders_fail_with_the_fix(kb_factory, drive, company, monkeypatch):
    source = source_for(drive, company)
    await source.check()

    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT_JSON", "not json")
    with pytest.raises(SourceAuthError, match="GOOGLE_SERVICE_ACCOUNT_JSON does not hold JSON"):
        await source_for(drive, company).check()
    monkeypatch.delenv("GOOGLE_SERVICE_ACCOUNT_JSON")
    with pytest.raises(SourceAuthError, match="no Google credentials: put the service account's JSON key in"):
        await source_for(drive, company).check()

    missing = GoogleDriveSource("drive", GoogleDriveConfig(folders=("nope",)), settings_for(drive),
                                credentials=None)
    drive.require_auth = False
    with pytest.raises(SourceConfigError, match="not found or is not shared with the service account"):
        await missing.check()

    built = build_source("drive", "gdrive", GoogleDriveConfig(folders=(company["root"],)).to_dict())
    assert isinstance(built, GoogleDriveSource) and built.config.folders == (company["root"],)
    with pytest.raises(SourceConfigError, match="at least one folder or shared drive"):
        build_source("drive", "gdrive", {"folders": []})


async def test_subject_impersonation_is_sent_in_the_token_request(drive, company):
    source = GoogleDriveSource("drive", GoogleDriveConfig(folders=(company["root"],), subject="admin@northwind.example"),
                               settings_for(drive))
    await source.check()
    import base64

    claims = json.loads(base64.urlsafe_b64decode(drive.token_requests[-1]["assertion"].split(".")[1] + "==="))
    assert claims["sub"] == "admin@northwind.example"
    assert claims["scope"] == "https://www.googleapis.com/auth/drive.readonly"


async def test_visibility_everyone_skips_permission_calls(kb_factory, drive, company):
    kb = await kb_factory()
    await (await DriveSync.add(kb, folders=(company["root"],), visibility="everyone")).run()
    assert drive.calls("permissions.list") == []
    assert company["leave"] in await found(kb, "parental leave weeks", "user:bob@northwind.example")


async def test_unreadable_permissions_hide_the_file_from_everyone(kb_factory, drive, company):
    from fakes.drive_api import DriveError

    kb = await kb_factory()
    sync = await DriveSync.add(kb, folders=(company["root"],))
    await sync.run()
    assert (await found(kb, "office wifi network name"))[0] == company["wifi"]
    drive.permission_errors[company["wifi"]] = DriveError(403, "insufficientFilePermissions",
                                                          "The user does not have sufficient permissions for this file.")
    drive.edit_file(company["wifi"], WIFI_TXT + b" Guests use the lobby network.")

    report = await sync.run()
    assert "could not read its permissions (403 insufficientFilePermissions)" in dict(report.failed)[company["wifi"]]
    assert (await document(kb, company["wifi"]))["access"] == []  # fail closed: nobody, until it can be read
    assert company["wifi"] not in await found(kb, "office wifi network name")


async def test_a_forgotten_changes_token_or_new_folders_list_the_scope_again(kb_factory, drive, company):
    kb = await kb_factory()
    sync = await DriveSync.add(kb, folders=(company["root"],))
    await sync.run()
    drive.delete(company["wifi"])
    drive.oldest_token = len(drive.change_log) + 1  # Drive no longer knows the stored token
    report = await sync.run()
    assert report.deleted == [company["wifi"]] and report.unchanged == 2  # listed again, nothing refetched

    drive.hidden.add(company["vpn"])  # lost without a change to say so: only a full listing can tell
    assert (await sync.run()).deleted == []
    report = await sync.run(full=True)
    assert report.deleted == [company["vpn"]] and report.pruned and report.unchanged == 1
    assert len([r for r in drive.calls("changes.getStartPageToken")]) == 3  # one listing per full sync, not two
    drive.hidden.discard(company["vpn"])
    await sync.run(full=True)

    extra = drive.add_folder("Finance")
    budget = drive.add_file("budget.md", extra, b"# Budget\n\nThe travel budget is 2000 euros a year.",
                            "text/markdown", permissions=[drive.anyone()])
    await DriveSync.add(kb, folders=(extra,))  # the same source now covers another folder
    report = await sync.run()  # what the old scope held leaves
    assert report.added == [budget]
    assert sorted(report.deleted) == sorted([company["leave"], company["vpn"]])
    assert (await kb.list_sources())[0].config["folders"] == [extra]


def test_cli_source_add_gdrive_refuses_a_broken_source_and_saves_a_working_one(drive, company, fresh_database,
                                                                                 monkeypatch):
    from typer.testing import CliRunner

    from bot.cli import app

    monkeypatch.setenv("DATABASE_URL", fresh_database())
    runner = CliRunner()

    def cli(*args: str):  # type: ignore[no-untyped-def]
        return runner.invoke(app, list(args), catch_exceptions=False)

    def one_error_line(result) -> str:  # type: ignore[no-untyped-def]
        assert result.exit_code == 2, result.stdout + result.stderr
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
        return lines[0]

    line = one_error_line(cli("source", "add", "gdrive", "handbook", "--folder", company["root"],
                              "--credentials-env", "ACME_DRIVE_KEY"))
    assert "no Google credentials: put the service account's JSON key in ACME_DRIVE_KEY" in line
    line = one_error_line(cli("source", "add", "gdrive", "handbook", "--folder", "1NotSharedWithUs"))
    assert "folder 1NotSharedWithUs was not found or is not shared with the service account" in line
    assert "at least one --folder ID or --shared-drive ID" in one_error_line(cli("source", "add", "gdrive", "handbook"))
    assert json.loads(cli("source", "list", "--json").stdout)["sources"] == []  # nothing broken was saved

    link = f"https://drive.google.com/drive/folders/{company['root']}?usp=sharing"
    result = cli("source", "add", "gdrive", "handbook", "--folder", link, "--every", "1h")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "Saved source handbook (gdrive, Google Drive)" in " ".join(result.stdout.split())
    listed = cli("source", "list", "--json").stdout
    assert "PRIVATE KEY" not in listed  # only the variable's name is stored
    source = json.loads(listed)["sources"][0]
    assert source["config"] == {"folders": [company["root"]], "shared_drives": [],
                                "credentials_env": "GOOGLE_SERVICE_ACCOUNT_JSON", "subject": None,
                                "visibility": "permissions", "admin_email": None}
    assert source["schedule_seconds"] == 3600

    result = cli("sync", "handbook", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert sorted(json.loads(result.stdout)["reports"][0]["added"]) == sorted(
        [company["leave"], company["vpn"], company["wifi"]])
    hits = json.loads(cli("search", "install the VPN", "--as", "user:bob@northwind.example", "--json").stdout)
    assert hits["results"][0]["document"]["url"] == f"https://drive.google.com/file/d/{company['vpn']}/view?usp=drivesdk"


# --- paging and change logs against the shapes of Google's Drive v3 reference (issue 29) -----------------------


async def test_a_shared_drive_is_kept_fresh_from_its_own_change_log_across_pages(kb_factory, drive):
    """Issue 29: each shared drive has its own change log (changes.list with driveId); the user's log does not
    carry its file events, so reading only that one missed every edit, trash and sharing change."""
    shared = drive.add_shared_drive("Engineering", [drive.group("eng@northwind.example")])
    folder = drive.add_folder("Runbooks", shared)
    docs = [drive.add_doc(f"Runbook {n}", folder, html=f"<h1>Runbook {n}</h1><p>Service {n} restarts with "
                                                       f"systemctl restart svc{n}.</p>") for n in range(4)]
    kb = await kb_factory()
    sync = await DriveSync.add(kb, "eng", shared_drives=(shared,))
    assert len((await sync.run()).added) == 4
    starts = drive.calls("changes.getStartPageToken")
    assert starts and all(r.query.get("driveId") == shared and r.query["supportsAllDrives"] == "true" for r in starts)

    drive.changes_page_size = 3  # the fake's smallest page: 7 changes below come in 3 pages
    drive.edit_doc(docs[0], "<h1>Runbook 0</h1><p>Service 0 now restarts with the zebra command.</p>")
    drive.trash(docs[1])
    drive.set_permissions(docs[2], [drive.user("dana@northwind.example")])
    for n in range(4):
        drive.rename(folder, f"Runbooks v{n}") if n == 3 else drive.add_doc(
            f"Extra {n}", folder, html=f"<p>Extra note {n} about the quokka rota.</p>")
    before = len(drive.calls("changes.list"))
    report = await sync.run()
    pages = drive.calls("changes.list")[before:]
    assert len(pages) >= 3
    assert all(r.query.get("driveId") == shared and r.query["supportsAllDrives"] == "true"
               and r.query["includeItemsFromAllDrives"] == "true" and r.query["includeRemoved"] == "true"
               for r in pages)
    assert report.deleted == [docs[1]] and docs[0] in report.updated and docs[2] in report.metadata_updated
    assert len(report.added) == 3
    assert (await found(kb, "zebra command restarts", "group:eng/eng@northwind.example"))[0] == docs[0]
    state = json.loads(await sync.checkpoint())
    assert state["tokens"] == {shared: str(len(drive.change_log) + 1)}  # the last page's newStartPageToken
    assert (await document(kb, docs[3]))["path"] == "Engineering/Runbooks v3/Runbook 3"


async def test_a_checkpoint_without_the_shared_drive_token_lists_the_drive_again(kb_factory, drive):
    shared = drive.add_shared_drive("Engineering", [drive.group("eng@northwind.example")])
    doc = drive.add_doc("Runbook", shared, html="<p>Restart with systemctl.</p>")
    kb = await kb_factory()
    sync = await DriveSync.add(kb, "eng", shared_drives=(shared,))
    await sync.run()
    state = json.loads(await sync.checkpoint())
    old = {"token": "1", "folders": state["folders"], "files": state["files"], "shortcuts": state["shortcuts"]}
    async with kb.engine.begin() as conn:  # a checkpoint written before per-drive change logs
        source = await sources_store.get_source(conn, "eng")
        await sources_store.save_checkpoint(conn, source.id, json.dumps(old))
    drive.edit_doc(doc, "<p>Restart with the walrus switch.</p>")
    report = await sync.run()
    assert report.updated == [doc]
    assert shared in json.loads(await sync.checkpoint())["tokens"]


async def test_files_and_permissions_are_listed_across_three_pages(kb_factory, drive):
    drive.list_page_size = 3
    drive.permissions_page_size = 3
    root = drive.add_folder("Notes")
    people = [drive.user(f"p{n}@northwind.example") for n in range(7)]
    notes = [drive.add_file(f"note{n}.txt", root, f"Note {n} is about the capybara rota.".encode(), "text/plain",
                            permissions=people if n == 0 else [drive.anyone()]) for n in range(8)]
    kb = await kb_factory()
    report = await (await DriveSync.add(kb, folders=(root,))).run()
    assert sorted(report.added) == sorted(notes)
    listing = [r for r in drive.calls("files.list") if f"'{root}' in parents" in r.query.get("q", "")]
    assert len(listing) == 3 and [r.query.get("pageToken") for r in listing] == [None, "3", "6"]
    permission_pages = [r for r in drive.calls("permissions.list") if f"/files/{notes[0]}/" in r.path]
    assert len(permission_pages) == 3 and all(r.query["supportsAllDrives"] == "true" for r in permission_pages)
    owner = "user:owner@example.com"
    assert sorted((await document(kb, notes[0]))["access"]) == sorted(
        [owner] + [f"user:p{n}@northwind.example" for n in range(7)])
