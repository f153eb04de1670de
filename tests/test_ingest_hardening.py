"""One bad thing never costs the rest: runaway documents, concurrent syncs, a vector index full of rows the asker
cannot use, malformed database URLs."""

from __future__ import annotations

import asyncio
import random

import pytest
from conftest import write
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from bot.cli import app
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.base import SourceItem, SourceSpec, StaticSource
from knowledge.sources.folder import FolderSource
from knowledge.storage import documents as store


async def chunks_of(kb, external_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    async with kb.engine.connect() as conn:
        return list((await conn.execute(text(
            "SELECT c.text FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.external_id = :e "
            "ORDER BY c.ordinal"), {"e": external_id})).scalars())


async def test_a_repeated_paragraph_is_stored_once_and_a_huge_document_is_cut_and_reported(kb_factory, tmp_path):
    kb = await kb_factory(max_document_chunks=6)
    paragraph = "Expense reports are due on the fifth working day of each month, with receipts attached."
    write(tmp_path / "docs", "repeated.txt", "\n\n".join([paragraph] * 3000))
    sections = "\n\n".join(f"## Topic {i}\n\nTopic {i} covers the {i}th rule of the travel policy in detail."
                           for i in range(200))
    write(tmp_path / "docs", "long.md", "# Travel policy\n\n" + sections)
    report = await kb.sync(FolderSource(tmp_path / "docs"))
    assert sorted(report.added) == ["long.md", "repeated.txt"]
    repeated = await chunks_of(kb, "repeated.txt")
    assert len(repeated) == len(set(repeated)) <= 3  # thousands of identical chunks became a handful
    assert len(await chunks_of(kb, "long.md")) == 6
    assert report.warnings == ["long.md: only its first 6 chunks are indexed (MAX_DOCUMENT_CHUNKS)"]
    hits = (await kb.search("when are expense reports due", SearchFilters(), k=3, mode="dense")).hits
    assert hits[0].external_id == "repeated.txt"


async def test_two_syncs_of_one_folder_at_once_each_report_only_what_they_did(kb_factory, fresh_database, tmp_path):
    url = fresh_database()
    docs = tmp_path / "docs"
    for n in range(20):
        write(docs, f"page{n}.md", f"# Page {n}\n\nPage {n} explains step {n} of the onboarding checklist.")
    first, second = await kb_factory(url), await kb_factory(url)
    a, b = await asyncio.gather(first.sync(FolderSource(docs)), second.sync(FolderSource(docs)))
    assert not a.failed and not b.failed
    assert set(a.added).isdisjoint(b.added)
    assert set(a.added) | set(b.added) == {f"page{n}.md" for n in range(20)}
    assert len(a.added) + a.unchanged == 20 and len(b.added) + b.unchanged == 20
    assert a.updated == b.updated == []
    async with first.engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM documents"))).scalar_one() == 20


async def test_a_document_postgres_refuses_fails_alone_and_the_rest_of_its_batch_is_written(fresh_kb):
    """Documents are written a batch per transaction; one Postgres cannot store (a NUL in its title, which a
    source's API can hand over) must not take the others in its batch down with it."""
    items = [SourceItem(external_id=f"room{i}.md", filename=f"room{i}.md",
                        title=f"Meeting room {i}" if i != 3 else "Meeting room \x00three",
                        read=(lambda i=i: f"# Room {i}\n\nMeeting room {i} seats {i + 4} people.".encode()))
             for i in range(6)]
    source = StaticSource(SourceSpec("rooms", "test"), items)
    report = await fresh_kb.sync(source)
    assert [i for i, _ in report.failed] == ["room3.md"] and "could not store" in report.failed[0][1]
    assert report.added == [f"room{i}.md" for i in range(6) if i != 3]
    hits = (await fresh_kb.search("how many people does meeting room 5 seat", SearchFilters(), k=1)).hits
    assert hits[0].external_id == "room5.md"

    again = await fresh_kb.sync(source)  # the refused one is tried again and still reported, the rest unchanged
    assert [i for i, _ in again.failed] == ["room3.md"] and again.unchanged == 5 and again.added == []


async def _write_many_chunks(kb, source: str, access: list[str], near: list[float], count: int) -> None:  # type: ignore[no-untyped-def]
    """`count` chunks whose vectors sit right next to `near` (written directly: embedding them would be slow)."""
    rng = random.Random(7)
    rows = []
    for i in range(count):
        vector = [v + rng.gauss(0, 0.01) for v in near]
        norm = sum(v * v for v in vector) ** 0.5
        body = f"restricted note {i} about the office coffee machine schedule"
        rows.append(store.ChunkRow(i, body, "", 12, f"hash-{source}-{i}", store.as_vector([v / norm for v in vector]),
                                   body))
    async with kb.engine.begin() as conn:
        source_id = await store.ensure_source(conn, source, "test", None)
    await store.write_documents(
        kb.engine, source_id, [store.DocumentWrite("bulk", "Bulk", None, None, None, None, "bulk", access, rows)],
        "english",
    )


def small_scan_budget(engine: AsyncEngine, tuples: int) -> None:
    """Every connection of `engine` gives an iterative HNSW scan `tuples` index tuples to visit (pgvector's
    hnsw.max_scan_tuples; db.engine sets 20,000 when a connection opens, this runs after, at each checkout)."""

    @event.listens_for(engine.sync_engine, "checkout")
    def _budget(dbapi_connection, _record, _proxy):  # type: ignore[no-untyped-def]
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET hnsw.max_scan_tuples = {int(tuples)}")
        cursor.close()
        dbapi_connection.commit()


async def test_dense_search_is_not_blinded_by_a_large_deletion(kb_factory, fresh_database):
    # A small scan budget reproduces, with hundreds of rows, what happens at pgvector's default (20,000) with tens
    # of thousands: after a large delete, the iterative index scan meets only dead rows and gives up.
    url = fresh_database()
    kb = await kb_factory(url, vacuum_after_deleted_chunks=10**9)  # first, no vacuum at all
    for engine in (kb.engine, kb.search_engine):
        small_scan_budget(engine, 50)

    @event.listens_for(kb.engine.sync_engine, "checkout")
    def _plan_like_a_big_table(dbapi_connection, _record, _proxy):  # type: ignore[no-untyped-def]
        # With a few hundred rows the planner would sort them all instead of using the index; at the sizes where
        # this matters it uses the index, so make it do so here. (The exact fallback orders by a distance no index
        # serves.)
        cursor = dbapi_connection.cursor()
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_bitmapscan = off")
        cursor.close()
        dbapi_connection.commit()

    public = [SourceItem(external_id=f"p{i}", filename=f"p{i}.md",
                         read=(lambda i=i: f"# Kitchen {i}\n\nThe coffee machine in kitchen {i} is cleaned on Fridays.".encode()))
              for i in range(6)]
    await kb.sync(StaticSource(SourceSpec("public", "test"), public))
    query = "when is the office coffee machine cleaned"
    (near,) = await kb.embedder.embed_async([query])
    await _write_many_chunks(kb, "bulk", ["everyone"], list(near), 600)
    assert await kb.remove_source("bulk") == 1

    for mode in ("dense", "hybrid"):
        results = await kb.search(query, SearchFilters(), k=5, mode=mode)
        assert len(results.hits) == 5 and all(h.external_id.startswith("p") for h in results.hits), mode
        assert results.best_similarity is not None and results.best_similarity > 0.5

    # A large delete now vacuums the table (dead rows leave the index).
    kb = await kb_factory(url, vacuum_after_deleted_chunks=100)
    await _write_many_chunks(kb, "bulk2", ["everyone"], list(near), 200)
    assert await kb.remove_source("bulk2") == 1
    async with kb.engine.connect() as conn:
        for _ in range(50):
            vacuumed = (await conn.execute(text(
                # chunks is partitioned by source (0019): VACUUM of the parent vacuums each partition, which is
                # where Postgres records it
                "SELECT coalesce(bool_or(s.last_vacuum IS NOT NULL), false) FROM pg_stat_user_tables s "
                "JOIN pg_inherits i ON i.inhrelid = s.relid WHERE i.inhparent = 'chunks'::regclass"))).scalar_one()
            if vacuumed:
                break
            await conn.rollback()
            await asyncio.sleep(0.1)
    assert vacuumed


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgresql//bob:hunter2@db.example.com/ragbot", "no '://'"),
        ("mysql://bob:hunter2@db.example.com/ragbot", "needs PostgreSQL"),
        ("postgresql://bob:hunter2@db.example.com:port/ragbot", "could not be parsed"),
    ],
)
def test_a_malformed_database_url_is_one_line_naming_the_fix(monkeypatch, url, needle):
    monkeypatch.setenv("DATABASE_URL", url)
    for command in (["status"], ["db", "upgrade"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error:") and needle in lines[0], result.stderr
        assert "postgresql://USER:PASSWORD@HOST:5432/DATABASE" in lines[0]
        assert "hunter2" not in result.stderr + result.stdout and "Traceback" not in result.stderr
