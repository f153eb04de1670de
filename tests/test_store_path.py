"""The batched store path and BM25 statistics maintenance outside the writing transaction (migration 0006)."""

import asyncio
import math

import pytest
from conftest import _admin, write
from sqlalchemy import text
from test_bm25 import assert_statistics_match_chunks, lexical, reference_scores

from db import leases
from knowledge.embedding.encoder import EmbeddingModelError, resolve_device
from knowledge.ingest.pipeline import join_waiting_batches, share_out
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.base import SourceItem, SourceSpec, StaticSource
from knowledge.sources.folder import FolderSource
from knowledge.storage import documents as store

SHORT = {f"short{i}.md": f"# Note {i}\n\nCats nap. Dogs bark {i} times." for i in range(6)}
LONG_BODY = " ".join(["The office aquarium needs weekly water changes and careful feeding of the fish."] * 12)


def long_body(i: int) -> str:  # distinct words, or the near-duplicate filter would keep only one of them
    return f"{LONG_BODY} Tank{i} reef{i} coral{i} shrimp{i} snail{i}."


async def chunk_weight_avgdls(kb) -> list[float | None]:
    async with kb.engine.connect() as conn:
        return list((await conn.execute(text("SELECT bm25_avgdl FROM chunks ORDER BY id"))).scalars())


async def test_a_batch_of_documents_is_written_with_exact_bm25_weights(fresh_kb, tmp_path):
    root = tmp_path / "notes"
    for name, body in SHORT.items():
        write(root, name, body)
    report = await fresh_kb.sync(FolderSource(root))
    assert sorted(report.added) == sorted(SHORT)
    await assert_statistics_match_chunks(fresh_kb)
    expected = await reference_scores(fresh_kb, "dogs bark")
    got = await lexical(fresh_kb, "dogs bark")
    assert got.keys() == expected.keys() and len(got) == len(SHORT)
    for external_id, score in expected.items():
        assert math.isclose(got[external_id], score, rel_tol=1e-4)


async def test_each_chunk_stores_the_words_it_repeats_by_tier_as_the_index_function_computes_them(fresh_kb, tmp_path):
    """The write computes a chunk's term-frequency tiers from its own counts; chunks written before migration 0010
    get them from `bm25_tf_tiers` in the index. Both must give the same tokens, or a search would miss chunks."""
    root = tmp_path / "notes"
    write(root, "fish.md", "# Fish\n\n" + " ".join(["Feed the fish, then feed the cat."] * 9) + " Water water.")
    write(root, "plain.md", "# Plain\n\nEvery word here comes once.")
    for name, body in SHORT.items():
        write(root, name, body)
    await fresh_kb.sync(FolderSource(root))
    async with fresh_kb.engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT tf_tiers::text AS stored, bm25_tf_tiers(tsv)::text AS computed FROM chunks ORDER BY id"))).all()
    assert [r.stored for r in rows] == [r.computed for r in rows]
    fish = next(r.stored for r in rows if "fish" in r.stored)  # "fish" 10 times with the heading, "feed" 18
    assert {"'fish#8'", "'feed#16'", "'cat#8'", "'water#2'"} <= set(fish.split())
    assert any(r.stored == "" for r in rows)  # a chunk repeating nothing: an empty set, not NULL


async def test_avgdl_drift_is_reweighted_after_the_writes_in_small_batches(fresh_kb, tmp_path, monkeypatch):
    root = tmp_path / "notes"
    for name, body in SHORT.items():
        write(root, name, body)
    await fresh_kb.sync(FolderSource(root))
    before = set(await chunk_weight_avgdls(fresh_kb))
    assert len(before) == 1  # every chunk weighted with the same avgdl

    # Long documents move avgdl far past the 10% bound. The write itself must not rewrite the old chunks ...
    async with fresh_kb.engine.connect() as conn:
        source_id = (await conn.execute(text("SELECT id FROM sources WHERE name = 'notes'"))).scalar_one()
    vector = store.as_vector([1.0] + [0.0] * (fresh_kb.embedder.dimension - 1))
    writes = [
        store.DocumentWrite(f"long{i}.md", f"Aquarium {i}", None, None, None, None, f"h{i}", ["everyone"],
                            [store.ChunkRow(0, long_body(i), "", 200, f"c{i}", vector, long_body(i))])
        for i in range(6)
    ]
    await store.write_documents(fresh_kb.engine, source_id, writes, "english")
    assert set(await chunk_weight_avgdls(fresh_kb)) == before  # old and new chunks: still the old avgdl

    # ... the re-weighting does, one short transaction per batch, until every chunk carries the new avgdl.
    reweighted = await store.reweight_bm25(fresh_kb.engine, batch=4)
    assert reweighted == 12
    after = set(await chunk_weight_avgdls(fresh_kb))
    assert len(after) == 1 and after != before
    await assert_statistics_match_chunks(fresh_kb)
    expected = await reference_scores(fresh_kb, "aquarium fish cats")
    got = await lexical(fresh_kb, "aquarium fish cats")  # the 10 best of 12 matching documents
    assert len(expected) == 12 and len(got) == 10
    for external_id, score in got.items():
        assert math.isclose(score, expected[external_id], rel_tol=1e-4)
    assert await store.reweight_bm25(fresh_kb.engine) == 0  # nothing left to do


async def test_a_sync_leaves_no_stale_weights_after_a_drift(fresh_kb, tmp_path):
    root = tmp_path / "notes"
    for name, body in SHORT.items():
        write(root, name, body)
    await fresh_kb.sync(FolderSource(root))
    for i in range(6):
        write(root, f"long{i}.md", f"# Aquarium {i}\n\n{long_body(i)}")
    await fresh_kb.sync(FolderSource(root))
    await assert_statistics_match_chunks(fresh_kb)
    async with fresh_kb.engine.connect() as conn:
        stale = (await conn.execute(text(
            "SELECT count(*) FROM chunks, corpus_stats s WHERE bm25_avgdl IS DISTINCT FROM s.weights_avgdl"
        ))).scalar_one()
    assert stale == 0


def test_embedding_device_setting():
    assert resolve_device("cpu") == "cpu"
    import torch

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(EmbeddingModelError, match="EMBEDDING_DEVICE=cuda"):
            resolve_device("cuda")


class IndexWatcher:
    """A sync's progress that looks, after each document is committed, at which vector indexes exist (through its
    own connection: the sync's writes are committed by then)."""

    def __init__(self, kb) -> None:  # type: ignore[no-untyped-def]
        self.conn = _admin(kb.engine.url.render_as_string(hide_password=False))  # an autocommit psycopg connection
        self.seen: list[list[str]] = []

    def start(self, total: int | None) -> None:
        pass

    def advance(self, label: str) -> None:
        self.seen.append(self.vector_indexes())

    def vector_indexes(self) -> list[str]:
        rows = self.conn.execute(
            "SELECT indexname FROM pg_indexes WHERE indexname LIKE 'chunks_embedding_hnsw_%' ORDER BY 1").fetchall()
        return [name for (name,) in rows]


async def test_a_first_sync_writes_without_the_graph_and_builds_it_once_at_the_end(fresh_kb, tmp_path):
    root = tmp_path / "notes"
    for name, body in SHORT.items():
        write(root, name, body)
    watcher = IndexWatcher(fresh_kb)
    await fresh_kb.sync(FolderSource(root), watcher)
    assert len(watcher.seen) == len(SHORT) and all(seen == [] for seen in watcher.seen)  # no graph while loading
    assert watcher.vector_indexes() == ["chunks_embedding_hnsw_half_384"]  # built at the end
    hits = (await fresh_kb.search("how often do dogs bark", SearchFilters(), k=3, mode="dense")).hits
    assert len(hits) == 3

    # A later sync into the non-empty index keeps the graph and inserts into it.
    write(root, "more.md", "# More\n\nParrots talk all day.")
    await fresh_kb.sync(FolderSource(root), watcher)
    assert watcher.seen[-1] == ["chunks_embedding_hnsw_half_384"]
    hits = (await fresh_kb.search("which bird talks", SearchFilters(), k=1, mode="dense")).hits
    assert hits[0].external_id == "more.md"


async def test_a_graph_left_missing_by_a_killed_load_is_built_by_the_next_sync(fresh_kb, tmp_path):
    root = tmp_path / "notes"
    for name, body in SHORT.items():
        write(root, name, body)
    await fresh_kb.sync(FolderSource(root))
    watcher = IndexWatcher(fresh_kb)
    watcher.conn.execute("DROP INDEX chunks_embedding_hnsw_half_384")  # what a load killed midway leaves

    # While another process holds the bulk-load lease, that load is alive and will build the graph itself.
    watcher.conn.execute("INSERT INTO leases (name, holder, expires_at) VALUES (%s, 'other:1:x', now() + "
                         "interval '1 hour')", (leases.BULK_LOAD,))
    write(root, "more.md", "# More\n\nParrots talk all day.")
    await fresh_kb.sync(FolderSource(root))
    assert watcher.vector_indexes() == []
    # The loader died: it renews its lease no more, and the lease expires.
    watcher.conn.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE name = %s",
                         (leases.BULK_LOAD,))

    write(root, "again.md", "# Again\n\nHamsters run at night.")
    await fresh_kb.sync(FolderSource(root))
    assert watcher.vector_indexes() == ["chunks_embedding_hnsw_half_384"]
    hits = (await fresh_kb.search("which pet runs at night", SearchFilters(), k=1, mode="dense")).hits
    assert hits[0].external_id == "again.md"


def test_batches_waiting_for_the_writer_are_joined_up_to_the_limit_in_order():
    batches = [[("a", 3), ("b", 2)], [("c", 4)], [("d", 6)], [("e", 1)], [("e", 1)], [("f", 30)], [("g", 1)]]
    joined = join_waiting_batches(batches, external_id=lambda d: d[0], chunks=lambda d: d[1], max_chunks=10)
    assert [[name for name, _ in batch] for batch in joined] == [
        ["a", "b", "c"],  # 9 chunks: d would make 15
        ["d", "e"],
        ["e"],  # a second version of e: never twice in one write, and after the first
        ["f"],  # larger than the limit: written alone, not split or dropped
        ["g"],
    ]
    assert join_waiting_batches([], external_id=lambda d: d, chunks=lambda d: 1, max_chunks=10) == []


def test_waiting_batches_are_shared_out_equally_among_the_free_writers():
    batches = [[("a", 2), ("b", 2)], [("c", 2)], [("d", 2)], [("e", 2), ("f", 2)]]

    def shared(writers: int) -> list[list[str]]:
        writes = share_out(batches, writers, external_id=lambda d: d[0], chunks=lambda d: d[1], max_chunks=10)
        return [[name for name, _ in write] for write in writes]

    assert shared(2) == [["a", "b", "c"], ["d", "e", "f"]]  # 12 chunks: 6 each
    assert shared(1) == [["a", "b", "c", "d"], ["e", "f"]]  # one writer, but never more than 10 chunks a write
    assert shared(3) == [["a", "b"], ["c", "d"], ["e", "f"]]
    # Uneven batches: each write takes batches until it holds its share, so nothing is left for a third.
    uneven = [[("a", 3)], [("b", 3)], [("c", 1)], [("d", 3)]]
    writes = share_out(uneven, 2, external_id=lambda d: d[0], chunks=lambda d: d[1], max_chunks=10)
    assert [[name for name, _ in write] for write in writes] == [["a", "b"], ["c", "d"]]


class HeldWriter:
    """Another session holds the statistics row that a sync's first chunk insert updates: the sync's writer waits
    on it while the rest of the pipeline (reading, the model) runs on. `count` reads committed rows."""

    def __init__(self, kb) -> None:  # type: ignore[no-untyped-def]
        url = kb.engine.url.render_as_string(hide_password=False)
        self.reader, self.holder = _admin(url), _admin(url)
        self.holder.execute("BEGIN")
        self.holder.execute("SELECT * FROM corpus_stats WHERE id = 1 FOR UPDATE")

    def count(self, table: str) -> int:
        return self.reader.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]

    def release(self) -> None:
        self.holder.execute("ROLLBACK")

    def close(self) -> None:
        self.reader.close()
        self.holder.close()


async def test_batches_that_wait_for_a_busy_writer_commit_together_and_a_refused_document_still_fails_alone(
    kb_factory,
):
    """When the model is ahead of Postgres (a GPU), the writer commits every batch waiting for it in one
    transaction. Here Postgres is held busy by another session while the model embeds everything. (One writer:
    with two, which of them commits first after the release is a race.)"""
    kb = await kb_factory(sync_batch_documents=2, store_writers=1)
    items = [SourceItem(external_id=f"room{i}.md", filename=f"room{i}.md",
                        title=f"Meeting room {i}" if i != 1 else "Meeting room \x00one",  # Postgres refuses it
                        read=(lambda i=i: f"# Room {i}\n\nMeeting room {i} seats {i + 4} people.".encode()))
             for i in range(8)]
    held = HeldWriter(kb)
    committed: list[int] = []

    class CommittedCounter:
        def start(self, total: int | None) -> None:
            pass

        def advance(self, label: str) -> None:
            committed.append(held.count("documents"))

    try:
        sync = asyncio.create_task(kb.sync(StaticSource(SourceSpec("rooms", "test"), items), CommittedCounter()))
        for _ in range(600):
            if held.count("embedding_cache") == 8:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # the last embedded batch is handed to the writer
        assert not sync.done() and committed == []
        held.release()
        report = await sync
    finally:
        held.close()

    assert [i for i, _ in report.failed] == ["room1.md"]
    assert sorted(report.added) == [f"room{i}.md" for i in range(8) if i != 1]
    # The first batch was being written when the others arrived: it is written on its own (a document at a time,
    # since Postgres refused one of its two); the three batches that waited for it are committed together.
    assert committed == [1, 1, 7, 7, 7, 7, 7, 7]
    hits = (await kb.search("how many people does meeting room 6 seat", SearchFilters(), k=1)).hits
    assert hits[0].external_id == "room6.md"


async def test_the_model_stops_when_a_writers_worth_of_chunks_waits_for_a_busy_writer(kb_factory):
    """However far ahead the model could run, at most WRITE_BATCH_CHUNKS chunks wait in memory for the writer."""
    # One writer: with two, how much each takes is a race.
    kb = await kb_factory(sync_batch_documents=2, write_batch_chunks=4, store_writers=1)
    items = [SourceItem(external_id=f"desk{i}.md", filename=f"desk{i}.md", title=f"Desk {i}",
                        read=(lambda i=i: f"# Desk {i}\n\nDesk {i} is by window {i + 2}.".encode()))
             for i in range(12)]
    held = HeldWriter(kb)
    try:
        sync = asyncio.create_task(kb.sync(StaticSource(SourceSpec("desks", "test"), items)))
        embedded = []
        for _ in range(600):  # files are parsed in worker processes, whose start takes a moment: wait for the
            await asyncio.sleep(0.1)  # model to begin, then for it to stop
            embedded.append(held.count("embedding_cache"))
            if len(embedded) > 10 and embedded[-1] == embedded[-10] and embedded[-1] > 0:
                break
        # Being written: the first batch (2 chunks); waiting: two batches (4 chunks); held by the model until there
        # is room: one more. The other four desks are not embedded yet.
        assert embedded[-1] == 8 and not sync.done()
        held.release()
        report = await sync
        assert sorted(report.added) == sorted(f"desk{i}.md" for i in range(12))
        assert held.count("embedding_cache") == 12
    finally:
        held.close()


# What a session waits on in pg_stat_activity: a row another transaction holds (the first waiter waits for that
# transaction, the next ones queue for the row), or an advisory lock.
ROW_LOCK = ("transactionid", "tuple")
ADVISORY_LOCK = ("advisory",)
# The chunk INSERT of store.write_documents as pg_stat_activity shows it (its first kilobyte).
CHUNK_INSERT = "%WITH u AS MATERIALIZED%"


def waiting_statements(conn, waits: tuple[str, ...], like: str) -> int:  # type: ignore[no-untyped-def]
    """How many other sessions of this database wait on such a lock while running a statement like `like`."""
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND wait_event_type = 'Lock' AND wait_event = ANY(%s) AND query LIKE %s", (list(waits), like),
    ).fetchone()[0]


async def wait_until(check, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.05)):
        if check():
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("index", ["empty", "holding a document"])
async def test_two_writers_insert_side_by_side_and_queue_only_for_the_statistics(kb_factory, index):
    """With the model ahead of Postgres, two transactions write at once: both insert their chunks (tokens, weights,
    GIN and HNSW) and only then wait for the statistics row, which another session holds here. Once it is
    released, everything is committed with exact statistics and scores. Into an empty index each writer weighted
    its chunks with the average length of its own batch (one of them holds a longer chunk, but not long enough for
    a re-weighting after the sync); the one that commits second is re-weighted to the index's as it commits."""
    kb = await kb_factory(sync_batch_documents=2)
    items = [SourceItem(external_id=f"plant{i}.md", filename=f"plant{i}.md", title=f"Plant {i}",
                        read=(lambda i=i: (f"# Plant {i}\n\nThe fern{i} by window {i} needs water every {i + 2} days."
                                           + " It likes shade." * (i == 2)).encode()))
             for i in range(10)]
    if index != "empty":
        await kb.sync(StaticSource(SourceSpec("seed", "test"), [SourceItem(
            external_id="seed.md", filename="seed.md", title="Seed", read=lambda: b"# Seed\n\nA first note.")]))
    before = 0 if index == "empty" else 1
    held = HeldWriter(kb)
    try:
        sync = asyncio.create_task(kb.sync(StaticSource(SourceSpec("plants", "test"), items)))
        both = await wait_until(lambda: waiting_statements(held.reader, ROW_LOCK, CHUNK_INSERT) == 2)
        assert both and held.count("chunks") == before and not sync.done()  # two inserts done, neither committed
        held.release()
        report = await sync
    finally:
        held.close()
    assert sorted(report.added) == sorted(i.external_id for i in items) and not report.failed
    await assert_statistics_match_chunks(kb)
    assert len(set(await chunk_weight_avgdls(kb))) == 1  # every chunk weighted with the index's avgdl
    expected = await reference_scores(kb, "fern window water")
    got = await lexical(kb, "fern window water")
    assert len(got) == 10 and got.keys() <= expected.keys()
    for external_id, score in got.items():
        assert math.isclose(score, expected[external_id], rel_tol=1e-4)


async def test_two_writes_of_one_document_at_once_leave_one_version(fresh_kb):
    """Two syncs may write the same document at the same moment: the second waits for the first (a lock per
    document), then replaces its chunks, so the document is never doubled and the statistics stay exact."""
    async with fresh_kb.engine.begin() as conn:
        source_id = await store.ensure_source(conn, "notes", "test", None)
    vector = store.as_vector([1.0] + [0.0] * (fresh_kb.embedder.dimension - 1))

    def version(n: int) -> list[store.DocumentWrite]:
        rows = [store.ChunkRow(i, f"Version {n} line {i} about lighthouse{n}.", "", 6, f"v{n}-{i}", vector,
                               f"Version {n} line {i} about lighthouse{n}.") for i in range(3)]
        return [store.DocumentWrite("guide.md", "Guide", None, None, None, None, f"h{n}", ["everyone"], rows)]

    held = HeldWriter(fresh_kb)
    try:
        first = asyncio.create_task(store.write_documents(fresh_kb.engine, source_id, version(1), "english"))
        assert await wait_until(lambda: waiting_statements(held.reader, ROW_LOCK, CHUNK_INSERT) == 1)
        second = asyncio.create_task(store.write_documents(fresh_kb.engine, source_id, version(2), "english"))
        assert await wait_until(lambda: waiting_statements(held.reader, ADVISORY_LOCK, "%pg_advisory_xact_lock(%") == 1)
        held.release()
        outcomes = [(await first)[0].outcome, (await second)[0].outcome]
    finally:
        held.close()
    assert outcomes == ["added", "updated"]
    async with fresh_kb.engine.connect() as conn:
        texts = list((await conn.execute(text("SELECT text FROM chunks ORDER BY ordinal"))).scalars())
    assert texts == [f"Version 2 line {i} about lighthouse2." for i in range(3)]
    await assert_statistics_match_chunks(fresh_kb)


async def test_two_writers_replacing_documents_leave_each_with_its_new_chunks_only(kb_factory):
    """Edited documents written by two writers at once: each write inserts the new chunks, then (holding the
    statistics row by then) deletes the old ones, so no document ends with both versions or none, and the
    statistics count exactly what is left."""
    kb = await kb_factory(sync_batch_documents=2)

    def items(version: str) -> list[SourceItem]:
        return [SourceItem(external_id=f"shelf{i}.md", filename=f"shelf{i}.md", title=f"Shelf {i}",
                           read=(lambda i=i: f"# Shelf {i}\n\nShelf {i} holds {version} binders. The spare "
                                             f"{version} key{i} is in drawer {i}.".encode()))
                for i in range(8)]

    source = SourceSpec("shelves", "test")
    await kb.sync(StaticSource(source, items("blue")))
    held = HeldWriter(kb)
    try:
        sync = asyncio.create_task(kb.sync(StaticSource(source, items("green"))))
        assert await wait_until(lambda: waiting_statements(held.reader, ROW_LOCK, CHUNK_INSERT) == 2)
        held.release()
        report = await sync
    finally:
        held.close()
    assert sorted(report.updated) == sorted(f"shelf{i}.md" for i in range(8)) and not report.failed
    async with kb.engine.connect() as conn:
        texts = list((await conn.execute(text("SELECT text FROM chunks"))).scalars())
    assert texts and all("green" in t and "blue" not in t for t in texts)
    await assert_statistics_match_chunks(kb)
    expected = await reference_scores(kb, "green spare key3")
    got = await lexical(kb, "green spare key3")
    for external_id, score in got.items():
        assert math.isclose(score, expected[external_id], rel_tol=1e-4)
