"""Incremental ingest of a folder: what is skipped, re-embedded, replaced, deleted and reported."""

import asyncio

import pytest
from conftest import write
from sqlalchemy import text

from knowledge.errors import SourceConflict
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.folder import FolderSource

LEAVE = """# Leave policy

## Paid time off

Everyone gets 25 days of paid time off per calendar year, booked in Workday.

## Sick leave

Sick days are unlimited; a doctor's note is needed after 3 consecutive days.

## Jury duty

Jury duty is fully paid for up to 10 working days.
"""


async def chunk_count(kb, external_id: str) -> int:
    async with kb.engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.external_id = :e"),
                {"e": external_id},
            )
        ).scalar_one()


async def found(kb, query: str, principals=("everyone",)) -> list[str]:
    results = await kb.search(query, SearchFilters(tuple(principals)), k=5)
    return [h.external_id for h in results.hits]


@pytest.fixture
def docs(tmp_path):
    root = tmp_path / "docs"
    write(root, "policies/leave.md", LEAVE)
    write(root, "it/vpn.html", "<h1>VPN</h1><h2>Install</h2><p>Install Tailscale from Self Service and sign in with Okta.</p>")
    write(root, "notes.txt", "The office wifi network is called northwind-guest.")
    return root


async def test_first_sync_indexes_everything_then_unchanged_files_are_skipped(fresh_kb, docs):
    first = await fresh_kb.sync(FolderSource(docs))
    assert sorted(first.added) == ["it/vpn.html", "notes.txt", "policies/leave.md"]
    assert first.chunks_embedded == first.chunks_written > 0

    second = await fresh_kb.sync(FolderSource(docs))
    assert second.unchanged == 3
    assert (second.added, second.updated, second.deleted, second.chunks_embedded) == ([], [], [], 0)
    assert (await found(fresh_kb, "How do I install the VPN?"))[0] == "it/vpn.html"


async def test_editing_one_section_re_embeds_only_that_chunk(fresh_kb, docs):
    await fresh_kb.sync(FolderSource(docs))
    chunks_before = await chunk_count(fresh_kb, "policies/leave.md")
    write(docs, "policies/leave.md", LEAVE.replace("up to 10 working days", "up to 15 working days"))

    report = await fresh_kb.sync(FolderSource(docs))
    assert report.updated == ["policies/leave.md"] and report.unchanged == 2
    assert report.chunks_embedded == 1
    assert report.chunks_from_cache == chunks_before - 1
    assert await chunk_count(fresh_kb, "policies/leave.md") == chunks_before
    hits = (await fresh_kb.search("how many days of jury duty are paid", SearchFilters(), k=1)).hits
    assert "15 working days" in hits[0].text


async def test_deleted_file_disappears_from_the_index(fresh_kb, docs):
    await fresh_kb.sync(FolderSource(docs))
    (docs / "it" / "vpn.html").unlink()
    report = await fresh_kb.sync(FolderSource(docs))
    assert report.deleted == ["it/vpn.html"]
    assert await chunk_count(fresh_kb, "it/vpn.html") == 0
    assert "it/vpn.html" not in await found(fresh_kb, "Tailscale Okta VPN install")


async def test_corrupt_and_unsupported_files_are_reported_and_the_rest_is_indexed(fresh_kb, docs):
    write(docs, "finance/broken.pdf", b"%PDF-1.7 this file was truncated")
    write(docs, "finance/budget.pptx", b"PK\x03\x04 slides")
    report = await fresh_kb.sync(FolderSource(docs))
    assert sorted(report.added) == ["it/vpn.html", "notes.txt", "policies/leave.md"]
    assert [i for i, _ in report.failed] == ["finance/broken.pdf"]
    assert [i for i, _ in report.skipped] == ["finance/budget.pptx"]
    assert "unsupported file type .pptx" in report.skipped[0][1]


async def test_a_good_file_that_turns_corrupt_keeps_its_previous_version(fresh_kb, tmp_path):
    root = tmp_path / "docs"
    write(root, "guide.docx", b"")  # placeholder so the folder exists
    import docx

    document = docx.Document()
    document.add_heading("Parking guide", level=1)
    document.add_paragraph("Bike racks are in the basement of the Denver office.")
    document.save(root / "guide.docx")
    assert (await fresh_kb.sync(FolderSource(root))).added == ["guide.docx"]

    (root / "guide.docx").write_bytes(b"PK\x03\x04 half-written upload")
    report = await fresh_kb.sync(FolderSource(root))
    assert [i for i, _ in report.failed] == ["guide.docx"] and report.deleted == []
    assert await found(fresh_kb, "where are the bike racks") == ["guide.docx"]


async def test_access_file_change_updates_permissions_without_re_embedding(fresh_kb, docs):
    await fresh_kb.sync(FolderSource(docs))
    assert "it/vpn.html" in await found(fresh_kb, "Tailscale Okta VPN install")

    write(docs, "it/.access", "group:it\n")
    report = await fresh_kb.sync(FolderSource(docs))
    assert report.metadata_updated == ["it/vpn.html"] and report.chunks_embedded == 0
    assert "it/vpn.html" not in await found(fresh_kb, "Tailscale Okta VPN install")
    assert "it/vpn.html" in await found(fresh_kb, "Tailscale Okta VPN install", ["group:it"])


async def test_ingesting_one_file_leaves_the_rest_of_its_source_alone(fresh_kb, docs):
    await fresh_kb.sync(FolderSource(docs))
    write(docs, "notes.txt", "The office wifi network is now called northwind-visitors.")
    report = await fresh_kb.sync(FolderSource(docs / "notes.txt", name="docs"))
    assert report.updated == ["notes.txt"] and report.deleted == []
    assert (await fresh_kb.status()).documents == 3


async def test_a_source_name_cannot_silently_index_a_second_folder(fresh_kb, docs, tmp_path):
    await fresh_kb.sync(FolderSource(docs, name="handbook"))
    other = tmp_path / "other"
    write(other, "a.md", "# A\n\ntext")
    with pytest.raises(SourceConflict, match="pick another name"):
        await fresh_kb.sync(FolderSource(other, name="handbook"))


async def test_replacing_a_document_is_atomic_for_readers(fresh_kb, tmp_path):
    """While a document is rewritten over and over, a reader never sees it with zero or doubled chunks."""
    root = tmp_path / "docs"
    short = "# Doc\n\n" + "\n\n".join(f"## Part {i}\n\nSection {i} text." for i in range(3))
    long = "# Doc\n\n" + "\n\n".join(f"## Part {i}\n\nSection {i} text, revised." for i in range(7))
    write(root, "doc.md", short)
    await fresh_kb.sync(FolderSource(root))
    seen: list[int] = []
    done = asyncio.Event()

    async def reader() -> None:
        while not done.is_set():
            seen.append(await chunk_count(fresh_kb, "doc.md"))
            await asyncio.sleep(0)

    task = asyncio.create_task(reader())
    for i in range(12):
        write(root, "doc.md", long if i % 2 == 0 else short)
        await fresh_kb.sync(FolderSource(root))
    done.set()
    await task
    assert len(seen) > 12  # the reader really ran alongside the rewrites
    assert set(seen) <= {3, 7}


async def test_changing_chunk_size_re_chunks_without_re_embedding_identical_text(kb_factory, fresh_database, docs):
    url = fresh_database()
    first = await kb_factory(url)
    await first.sync(FolderSource(docs))
    second = await kb_factory(url, chunk_tokens=64, chunk_overlap_tokens=0)
    report = await second.sync(FolderSource(docs))
    assert sorted(report.updated) == ["it/vpn.html", "notes.txt", "policies/leave.md"]
    assert report.chunks_from_cache > 0  # short sections come out the same and are not embedded again


async def test_ingesting_a_subfolder_or_file_keeps_restrictions_set_above_it(fresh_kb, tmp_path):
    root = tmp_path / "company"
    write(root, "hr/.access", "group:hr\n")
    write(root, "hr/private/salaries.md", "# Salaries\n\nThe CEO salary is 450,000 dollars.")
    write(root, "public/wifi.md", "# Wifi\n\nThe guest network is northwind-guest.")
    await fresh_kb.sync(await fresh_kb.folder_source(root))

    # Re-index one file and one subfolder on their own: they join the source and keep the hr restriction.
    write(root, "hr/private/salaries.md", "# Salaries\n\nThe CEO salary is 475,000 dollars.")
    report = await fresh_kb.sync(await fresh_kb.folder_source(root / "hr" / "private" / "salaries.md"))
    assert report.updated == ["hr/private/salaries.md"]
    report = await fresh_kb.sync(await fresh_kb.folder_source(root / "hr"))
    assert report.unchanged == 1 and report.deleted == []
    assert (await fresh_kb.status()).documents == 2  # no second copy under another source
    assert "hr/private/salaries.md" not in await found(fresh_kb, "CEO salary", ["user:mallory@example.com"])
    assert (await found(fresh_kb, "CEO salary", ["group:hr"]))[0] == "hr/private/salaries.md"


async def test_a_subfolder_sync_only_deletes_inside_that_subfolder(fresh_kb, tmp_path):
    root = tmp_path / "company"
    write(root, "a/one.md", "# One\n\nFirst.")
    write(root, "a/two.md", "# Two\n\nSecond.")
    write(root, "b/three.md", "# Three\n\nThird.")
    await fresh_kb.sync(await fresh_kb.folder_source(root))
    (root / "a" / "two.md").unlink()
    report = await fresh_kb.sync(await fresh_kb.folder_source(root / "a"))
    assert report.deleted == ["a/two.md"]
    assert (await fresh_kb.status()).documents == 2


async def test_restricting_a_file_that_also_broke_still_hides_it(fresh_kb, docs):
    await fresh_kb.sync(FolderSource(docs))
    write(docs, "it/.access", "group:it\n")
    write(docs, "it/vpn.html", b"<html>" + b"\x00" * 5000)  # now binary garbage
    report = await fresh_kb.sync(FolderSource(docs))
    assert [i for i, _ in report.failed] == ["it/vpn.html"]
    assert "it/vpn.html" not in await found(fresh_kb, "Tailscale Okta VPN install")
    assert "it/vpn.html" in await found(fresh_kb, "Tailscale Okta VPN install", ["group:it"])  # old text kept


async def test_an_empty_listing_deletes_nothing_and_warns(fresh_kb, docs):
    await fresh_kb.sync(FolderSource(docs))
    for path in [p for p in docs.rglob("*") if p.is_file() and p.name != ".access"]:
        path.unlink()
    report = await fresh_kb.sync(FolderSource(docs))
    assert report.deleted == [] and "listing is empty" in report.warnings[0]
    assert (await fresh_kb.status()).documents == 3


async def test_nul_bytes_legacy_encodings_and_undecodable_names_are_indexed(fresh_kb, tmp_path):
    import os

    root = tmp_path / "odd"
    write(root, "late-nul.txt", "Normal text at the start. " * 200 + "\x00 and a NUL later on.")
    write(root, "utf16.txt", "Café opening hours are 8 to 17.".encode("utf-16"))
    write(root, "cp1252.txt", "The café menu costs € 5.".encode("cp1252"))
    os.makedirs(root, exist_ok=True)
    (root / os.fsdecode(b"bad-\xff-name.md")).write_text("# Odd name\n\nStill indexed.")
    write(root, "fine.md", "# Fine\n\nThis one is fine.")
    report = await fresh_kb.sync(FolderSource(root))
    assert report.failed == []
    assert len(report.added) == 5
    assert "bad-\\xff-name.md" in report.added  # undecodable bytes kept as \xNN, so two such names stay distinct
    hits = (await fresh_kb.search("cafe menu price", SearchFilters(), k=3)).hits
    assert any("€" in h.text for h in hits)


async def test_two_syncs_at_once_finish_and_leave_statistics_exact(kb_factory, fresh_database, tmp_path):
    from test_bm25 import assert_statistics_match_chunks

    url = fresh_database()
    words = [f"word{i}" for i in range(60)]
    for folder, order in (("a", words), ("b", list(reversed(words)))):
        for n in range(12):
            write(tmp_path / folder, f"doc{n}.md", f"# {folder} {n}\n\n" + " ".join(order[n:] + order[:n]))
    first, second = await kb_factory(url), await kb_factory(url)
    reports = await asyncio.gather(first.sync(FolderSource(tmp_path / "a")), second.sync(FolderSource(tmp_path / "b")))
    assert [len(r.added) for r in reports] == [12, 12] and all(not r.failed for r in reports)
    await assert_statistics_match_chunks(first)


async def test_an_access_file_with_no_principals_hides_the_folder_from_everyone(fresh_kb, docs):
    write(docs, "it/.access", "# nobody yet: HR will fill this in\n")
    await fresh_kb.sync(FolderSource(docs))
    assert "it/vpn.html" not in await found(fresh_kb, "Tailscale Okta VPN install")
    assert "it/vpn.html" not in await found(fresh_kb, "Tailscale Okta VPN install", ["group:it", "group:hr"])
