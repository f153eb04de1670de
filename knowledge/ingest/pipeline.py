"""Sync a source into the index: incremental, batched, pipelined, and safe to interrupt.

- A source reports what changed since its checkpoint (see `knowledge.sources.base`). An item whose cheap version
  matches the stored one is not even fetched; one whose bytes (and title) hash the same as last time is skipped;
  if only its metadata or access list changed, those are updated in place without re-chunking.
- A changed item is re-parsed and re-chunked; only chunks whose text is new are embedded, the rest come from the
  embedding cache keyed by (model, hash of the embedded text).
- Three stages run at once, a batch of SYNC_BATCH_DOCUMENTS (a setting) documents apart (see `Indexer.sync`):
  reading, parsing and chunking batch N+1, embedding batch N (the model runs in a worker thread, and torch releases
  the GIL), and writing batch N-1 to Postgres (another process). On a CPU-bound machine the model is the
  bottleneck; the other stages hide behind it instead of adding to it.
- When the model is ahead of Postgres (a GPU), the batches waiting for the writer are joined, up to
  WRITE_BATCH_CHUNKS (a setting) chunks, into one transaction (`join_waiting_batches`): fewer, larger writes cost
  less a chunk. Up to STORE_WRITERS (a setting) transactions write at once (`WriterPool`), each its share of what waits.
- A batch of documents is written in one transaction (`store.write_documents`), so an interrupted sync leaves
  every document either fully old or fully new. If Postgres refuses the batch, its documents are written one at a
  time, so only the document it refuses fails. A batch's checkpoint is stored only after all its documents are
  committed, so a run killed at any moment resumes where the committed work ends. Deletions come from the
  source's delete feed or from a prune pass over a complete inventory, so a failed listing never empties the index.
- A file that cannot be read or parsed is reported and skipped, and its previously indexed version is kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from knowledge.embedding.encoder import Embedder, content_hash
from knowledge.errors import CorruptDocument, ItemUnavailable, LimitExceeded, Remedy, SyncWarning, UnsupportedFormat
from knowledge.ingest.chunking import ChunkDraft, chunk_document, compose_search_text
from knowledge.ingest.isolation import ParsePool
from knowledge.ingest.parsing import ParseLimits
from knowledge.settings import KnowledgeSettings
from knowledge.sources.base import Source, SourceItem, as_source, principals_key, read_item
from knowledge.storage import documents as store

logger = logging.getLogger(__name__)
D = TypeVar("D")

# Batches waiting to be embedded: one is enough to keep the model busy, and it bounds memory.
PIPELINE_DEPTH = 1
# Items fetched at once within a batch (HTTP sources bound their own connections too).
FETCH_CONCURRENCY = 4
# A chunk token is rarely more than this many characters: bounds the text chunked for MAX_DOCUMENT_CHUNKS.
CHARS_PER_TOKEN_BOUND = 8
MIN_DOCUMENT_CHARS = 1_000_000
# Bump when parsing or chunking changes what a file turns into: every document is then re-chunked on its next sync
# (the embedding cache still spares re-embedding chunks whose text came out the same).
PIPELINE_VERSION = "2"


class SyncProgress(Protocol):
    """What a sync reports while it runs. `start` is called once with the expected number of items (None when
    the source cannot tell yet); a source that pages through changes may then call `grow(n)` (optional: a
    progress object without it is fine) as more items arrive; `advance` once per item handled."""

    def start(self, total: int | None) -> None: ...
    def advance(self, label: str) -> None: ...


class _NoProgress:
    def start(self, total: int | None) -> None:
        pass

    def advance(self, label: str) -> None:
        pass


@dataclass
class SyncReport:
    source: str
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: int = 0
    metadata_updated: list[str] = field(default_factory=list)  # access or metadata changed, content did not
    deleted: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # unsupported types: (external id, reason)
    failed: list[tuple[str, str]] = field(default_factory=list)  # unreadable or corrupt: (external id, reason)
    empty: list[str] = field(default_factory=list)  # no text at all: left out, reported (never a title-only chunk)
    # Over a resource limit: (external id, "<limit> (setting NAME)"); see `skip_over_limit`.
    over_limit: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    chunks_written: int = 0
    chunks_embedded: int = 0
    chunks_from_cache: int = 0
    seconds: float = 0.0
    # Filled by KnowledgeBase.sync_source / sync: the recorded run.
    run_id: int | None = None
    trigger: str | None = None
    pruned: bool = False
    checkpoint: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source, "added": self.added, "updated": self.updated, "unchanged": self.unchanged,
            "metadata_updated": self.metadata_updated, "deleted": self.deleted,
            "skipped": [{"id": i, "reason": r} for i, r in self.skipped],
            "failed": [{"id": i, "reason": r} for i, r in self.failed],
            "empty": self.empty,
            "over_limit": [{"id": i, "reason": r} for i, r in self.over_limit],
            "warnings": self.warnings,
            "chunks_written": self.chunks_written, "chunks_embedded": self.chunks_embedded,
            "chunks_from_cache": self.chunks_from_cache, "seconds": round(self.seconds, 2),
            "run_id": self.run_id, "trigger": self.trigger, "pruned": self.pruned,
        }

    def skip_over_limit(self, external_id: str, limit: str) -> None:
        """An item left out because it would cost more than a limit allows; `limit` reads "<what> (setting NAME)".
        One mechanism for every source: the file kept its previous version, if any."""
        self.over_limit.append((external_id, limit))

    def over_limit_lines(self) -> list[str]:
        """One report line per item over a limit: "skipped: <item>: <limit> (setting NAME)"."""
        return [f"skipped: {external_id}: {limit}" for external_id, limit in self.over_limit]

    def finish(self) -> None:
        """Stable order for people and tests: fetches run concurrently, so items finish in any order."""
        for name in ("added", "updated", "metadata_updated", "deleted"):
            getattr(self, name).sort()
        self.skipped.sort()
        self.empty.sort()
        self.failed.sort()
        self.over_limit.sort()


def unique_chunks(drafts: Sequence[ChunkDraft]) -> list[ChunkDraft]:
    """Identical chunks within one document (a paragraph repeated, boilerplate on every page) are stored once:
    copies add nothing to answers, and thousands of identical vectors degrade the HNSW graph."""
    seen: set[str] = set()
    unique = []
    for draft in drafts:
        if draft.search_text not in seen:
            seen.add(draft.search_text)
            unique.append(draft)
    return unique


@dataclass(frozen=True)
class _Prepared:
    """A document parsed and chunked, ready to embed; `chunk_hashes[i]` is the cache key of `drafts[i]`."""

    item: SourceItem
    hash: str
    title: str
    drafts: list[ChunkDraft]
    chunk_hashes: list[str]


@dataclass(frozen=True)
class _Embedded:
    """A batch of prepared documents and the embeddings of their chunks, {chunk hash: float32 vector}."""

    prepared: list[_Prepared]
    embeddings: dict[str, np.ndarray]


def join_waiting_batches(
    batches: Sequence[Sequence[D]], *, external_id: Callable[[D], str], chunks: Callable[[D], int],
    max_chunks: int, enough: int | None = None,
) -> list[list[D]]:
    """Batches of documents waiting for the writer, as it commits them: each joined to the one before while the
    sum stays within `max_chunks` chunks and no document appears twice in one write; with `enough`, a write that
    already holds that many chunks takes no more.

    Why: per transaction, the store path pays once for every distinct term of the batch (its vocabulary row and
    document frequency), and the terms of a few thousand chunks overlap heavily: 2,000 chunks in one write cost
    about 35% more chunks a second than 16 documents' worth in each (`bench/ingest.py --unmerged` beside the
    default). On a CPU the model is slower than the writer, nothing waits, and each batch is written as it comes;
    a document too large for the limit is still written, alone."""
    joined: list[list[D]] = []
    size = 0
    for batch in batches:
        ids = {external_id(d) for d in joined[-1]} if joined else set()
        added = sum(chunks(d) for d in batch)
        if (joined and size + added <= max_chunks and (enough is None or size < enough)
                and not any(external_id(d) in ids for d in batch)):
            joined[-1].extend(batch)
            size += added
        else:
            joined.append(list(batch))
            size = added
    return joined


class _WriteQueue:
    """Between the embedder and the writer: what waits to be written, bounded by its chunks (not its batches,
    whose size varies with the documents'), so memory stays bounded however far ahead the model runs. A batch is
    let in while the queue is empty, so one larger than the bound still passes."""

    def __init__(self, max_chunks: int) -> None:
        self.max_chunks = max_chunks
        self._waiting: list[_Embedded | _AfterWrites | None] = []
        self._chunks = 0
        self._changed = asyncio.Condition()

    async def put(self, work: _Embedded | _AfterWrites | None) -> None:
        chunks = sum(len(p.drafts) for p in work.prepared) if isinstance(work, _Embedded) else 0
        async with self._changed:
            await self._changed.wait_for(lambda: not self._waiting or self._chunks + chunks <= self.max_chunks)
            self._waiting.append(work)
            self._chunks += chunks
            self._changed.notify_all()

    async def take_all(self) -> list[_Embedded | _AfterWrites | None]:
        """Everything waiting, in order, once there is something."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._waiting))
            taken, self._waiting, self._chunks = self._waiting, [], 0
            self._changed.notify_all()
            return taken


def share_out(
    batches: Sequence[Sequence[D]], writers: int, *, external_id: Callable[[D], str], chunks: Callable[[D], int],
    max_chunks: int,
) -> list[list[D]]:
    """Batches waiting for `writers` free writers, as the writes to start: joined (`join_waiting_batches`) until
    each holds an equal share, and never more than `max_chunks` (WRITE_BATCH_CHUNKS). 2,000 waiting chunks and two
    free writers make two writes of about 1,000 (not a third with what is left over); one free writer, one of 2,000."""
    total = sum(chunks(d) for batch in batches for d in batch)
    share = -(-total // max(1, writers))
    return join_waiting_batches(batches, external_id=external_id, chunks=chunks, max_chunks=max_chunks,
                                enough=share)


class WriterPool:
    """The writes in flight (coroutines, each one transaction), at most `size` at once. A write that shares a
    document with one in flight starts only after every write before it has finished, so a document's versions are
    committed in the order they came."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._running: dict[asyncio.Task[object], set[str]] = {}

    def free(self) -> int:
        """Writers free now; at least 1, since a write started while none is free waits for one."""
        return max(1, self.size - len(self._running))

    async def start(self, write: Coroutine[object, object, object], *, documents: set[str]) -> None:
        if any(documents & held for held in self._running.values()):
            await self.finish_all()
        await self.wait_for_a_free_one()
        self._running[asyncio.ensure_future(write)] = documents

    async def wait_for_a_free_one(self) -> None:
        while len(self._running) >= self.size:
            await self._reap()

    async def finish_all(self) -> None:
        while self._running:
            await self._reap()

    async def _reap(self) -> None:
        done, _ = await asyncio.wait(list(self._running), return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            del self._running[task]
            task.result()  # a failed write fails the sync, as it did when writes ran one at a time

    async def cancel_all(self) -> None:
        for task in self._running:
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running.clear()


@dataclass(frozen=True)
class _AfterWrites:
    """What a source's change batch asks for once all its items are committed: deletions, then its checkpoint."""

    deleted: list[str]
    checkpoint: str | None


@dataclass(frozen=True)
class _Fetched:
    data: bytes | None = None
    error: str | None = None


def pipeline_recipe(settings: KnowledgeSettings, model: str) -> str:
    """How chunks are made: bump PIPELINE_VERSION, change the model or the chunking settings and every document
    is re-chunked on its next sync (chunks are measured with the model's tokenizer, so the model is part of it)."""
    return (
        f"{PIPELINE_VERSION}|{model}|{settings.chunk_tokens}|{settings.chunk_overlap_tokens}|"
        f"{settings.text_search_config}"
    )


def item_hash(item: SourceItem, data: bytes, settings: KnowledgeSettings, model: str) -> str:
    """What decides whether a document must be re-chunked: its bytes, its title, and how chunks are made."""
    digest = hashlib.sha256()
    digest.update(pipeline_recipe(settings, model).encode("utf-8") + b"\x00")
    digest.update((item.title or "").encode("utf-8") + b"\x00")
    digest.update(data)
    return digest.hexdigest()


CheckpointCallback = Callable[[str], Awaitable[None]]


class Indexer:
    def __init__(self, engine: AsyncEngine, embedder: Embedder, settings: KnowledgeSettings) -> None:
        self.engine = engine
        self.embedder = embedder
        self.settings = settings
        self._recipe = hashlib.sha256(pipeline_recipe(settings, embedder.name).encode("utf-8")).hexdigest()[:16]
        self.parser = ParsePool(
            ParseLimits(
                max_table_columns=settings.max_table_columns, max_table_header_chars=settings.max_table_header_chars,
                max_spreadsheet_cells=settings.max_spreadsheet_cells, max_paragraphs=settings.max_paragraphs,
                max_decompressed_mb=settings.max_decompressed_mb, max_zip_ratio=settings.max_zip_ratio,
            ),
            workers=settings.parse_workers, timeout_seconds=settings.parse_timeout_seconds,
            memory_mb=settings.parse_memory_mb,
        )

    def stored_version(self, item: SourceItem) -> str | None:
        """The version string stored with a document: the source's version, tied to the pipeline recipe so a new
        chunking setup still re-reads every item once."""
        return None if item.version is None else f"{self._recipe}|{item.version}"

    async def sync(
        self, source: Source, progress: SyncProgress | None = None, *, source_id: int | None = None,
        checkpoint: str | None = None, full: bool = False, prune: bool | None = None,
        on_checkpoint: CheckpointCallback | None = None, report: SyncReport | None = None,
        on_committed: Callable[[], Awaitable[None]] | None = None, mark_synced: bool = True,
    ) -> SyncReport:
        """Apply the source's changes since `checkpoint`, then prune when asked (None: when the source prunes on
        every sync). `mark_synced=False` (a part of a split first sync, knowledge.ingest.split) leaves the source's
        last sync time unset: the source is synced once all its parts are. Each batch of documents commits on its own; `on_checkpoint` is awaited with a change batch's
        checkpoint only once every document of it is committed. Source errors propagate (the run fails; what was
        read before the error is still written, and committed work stays)."""
        source = as_source(source)
        progress = progress or _NoProgress()
        started = time.monotonic()
        report = report or SyncReport(source=source.spec.name)
        if source_id is None:
            async with self.engine.begin() as conn:
                source_id = await store.ensure_source(conn, source.spec.name, source.spec.kind, source.spec.location)
        async with self.engine.connect() as conn:
            stored = await store.stored_documents(conn, source_id)
        handled: dict[str, str | None] = {}  # items seen this run, by stored version: overlapping pages repeat them
        # The pipeline: read and prepare -> embed -> write, each stage a task, joined by queues: PIPELINE_DEPTH
        # batches before the model, settings.write_batch_chunks chunks before the writer. Deletions and checkpoints travel
        # down the same queues, so they are applied after the writes of every batch before them. None marks the end.
        to_embed: asyncio.Queue[list[_Prepared] | _AfterWrites | None] = asyncio.Queue(PIPELINE_DEPTH)
        batch_documents, write_batch_chunks = self.settings.sync_batch_documents, self.settings.write_batch_chunks
        to_write: _WriteQueue = _WriteQueue(write_batch_chunks)
        source_failed: list[Exception] = []

        async def read_and_prepare() -> None:
            announced = 0
            try:
                async for batch in source.changes(None if full else checkpoint, full=full):
                    fresh = []
                    for item in batch.items:
                        if item.external_id in handled and handled[item.external_id] == self.stored_version(item):
                            continue
                        handled[item.external_id] = self.stored_version(item)
                        fresh.append(item)
                    if announced == 0:
                        announced = batch.total if batch.total is not None else len(fresh)
                        progress.start(announced if batch.total is not None else None)
                    grow = getattr(progress, "grow", None)
                    if batch.total is None and grow is not None:
                        grow(len(fresh))
                    for start in range(0, len(fresh), batch_documents):
                        prepared = await self._prepare_items(
                            fresh[start : start + batch_documents], stored, report, progress
                        )
                        if prepared:
                            await to_embed.put(prepared)
                    gone = [i for i in batch.deleted if i.startswith(source.listing_prefix)]
                    if gone or batch.checkpoint is not None:
                        await to_embed.put(_AfterWrites(gone, batch.checkpoint))
            except Exception as exc:  # what was handed on is still written; then the run fails with this error
                source_failed.append(exc)
            await to_embed.put(None)

        async def embed() -> None:
            while (work := await to_embed.get()) is not None:
                if isinstance(work, list):
                    texts = {h: d.search_text for p in work for h, d in zip(p.chunk_hashes, p.drafts, strict=True)}
                    await to_write.put(_Embedded(work, await self.embeddings_for(texts, report)))
                else:
                    await to_write.put(work)
            await to_write.put(None)

        writers = WriterPool(self.settings.store_writers)

        async def write_joined(batches: list[_Embedded]) -> None:
            """Share what waits out among the free writers: as many writes as writers are free (each joined up to
            write_batch_chunks), started as soon as a writer is."""
            embeddings = {h: e for b in batches for h, e in b.embeddings.items()}
            joined = share_out([b.prepared for b in batches], writers.free(),
                               external_id=lambda p: p.item.external_id, chunks=lambda p: len(p.drafts),
                               max_chunks=write_batch_chunks)
            for prepared in joined:
                await writers.start(
                    self._write_then(_Embedded(prepared, embeddings), stored, source_id, report, progress,
                                     on_committed),
                    documents={p.item.external_id for p in prepared},
                )

        async def write() -> None:
            try:
                while True:
                    await writers.wait_for_a_free_one()  # meanwhile the batches wait, and the queue bounds them
                    embedded: list[_Embedded] = []
                    for work in await to_write.take_all():  # what queued up while the writers were busy
                        if isinstance(work, _Embedded):
                            embedded.append(work)
                            continue
                        await write_joined(embedded)  # deletions, a checkpoint or the end come after these writes
                        embedded = []
                        await writers.finish_all()
                        if work is None:
                            return
                        if work.deleted:
                            async with self.engine.begin() as conn:
                                report.deleted.extend(await store.delete_documents(conn, source_id, work.deleted))
                        if work.checkpoint is not None:
                            report.checkpoint = work.checkpoint
                            if on_checkpoint is not None:
                                await on_checkpoint(work.checkpoint)
                    await write_joined(embedded)
            finally:
                await writers.cancel_all()

        # Into an empty index, chunks are written without the HNSW graph, which is built once at the end (see
        # store.bulk_load): about ten times less work than inserting them into it one by one.
        async with store.bulk_load(self.engine, self.settings.sync_lease_seconds):
            await run_stages(read_and_prepare(), embed(), write())
        if source_failed:
            raise source_failed[0]
        # Sources may report listing problems (unreadable folders, bad access files, skipped links).
        report.warnings.extend(w for w in getattr(source, "warnings", ()) if w not in report.warnings)
        if prune or (prune is None and source.prune_on_every_sync):
            await self.prune(source, source_id, report)
        await self._drop_vanished(source, source_id, stored, handled, report)
        if mark_synced:
            async with self.engine.begin() as conn:
                await store.mark_source_synced(conn, source_id)
        if report.deleted:
            await self.after_large_delete(sum(stored[i].chunks for i in report.deleted if i in stored))
        # After the writes, not inside them: see store.reweight_bm25.
        await store.reweight_bm25(self.engine)
        report.seconds = time.monotonic() - started
        report.finish()
        return report

    async def _drop_vanished(
        self, source: Source, source_id: int, stored: dict[str, store.StoredDocument], listed: Mapping[str, object],
        report: SyncReport,
    ) -> None:
        """A partial sync (a subfolder or one file) still drops documents outside it whose file is gone: a file
        moved into the synced part must not stay searchable at its old path (with its old access list)."""
        vanished = getattr(source, "vanished", None)
        if vanished is None or not source.listing_prefix:
            return
        outside = [i for i in stored if not i.startswith(source.listing_prefix) and i not in listed]
        gone = await asyncio.to_thread(vanished, outside)
        if gone:
            async with self.engine.begin() as conn:
                report.deleted.extend(await store.delete_documents(conn, source_id, gone))

    async def after_large_delete(self, chunks_deleted: int) -> None:
        """After deleting many chunks, VACUUM the chunks table: until dead rows are cleaned out of the HNSW index,
        a filtered vector search can spend its whole scan budget on them and return nothing."""
        if chunks_deleted < self.settings.vacuum_after_deleted_chunks:
            return
        await store.vacuum_chunks(self.engine)

    async def prune(self, source: Source, source_id: int, report: SyncReport) -> None:
        """Delete what the source no longer lists and apply access lists that changed without a new version."""
        inventory = await source.inventory()
        if inventory is None:
            return
        # Parts of the inventory that could not be listed (an unreadable folder): nothing under them is deleted.
        unlisted: list[str] = list(getattr(source, "unlisted_prefixes", ()))
        report.pruned = True
        async with self.engine.connect() as conn:
            stored = await store.stored_documents(conn, source_id)
        in_scope = [i for i in stored if i.startswith(source.listing_prefix)]
        if not inventory and in_scope:
            # An empty listing is far more often an unmounted drive or a wrong path than a deliberate purge.
            report.warnings.append(SyncWarning(
                f"the listing is empty, so none of the {len(in_scope)} indexed documents were deleted; "
                "check the path, or remove the source to drop them on purpose",
                remedy=Remedy.REMOVE_SOURCE, source=source.spec.name,
            ))
            return
        if "" not in unlisted:
            async with self.engine.begin() as conn:
                report.deleted.extend(
                    await store.delete_documents_not_in(
                        conn, source_id, [ref.external_id for ref in inventory], source.listing_prefix, unlisted
                    )
                )
        for ref in inventory:
            old = stored.get(ref.external_id)
            if ref.access is None or old is None or principals_key(old.access) == principals_key(ref.access):
                continue
            async with self.engine.begin() as conn:
                changed = await store.update_document_metadata(
                    conn, old.id, url=old.url, path=old.path, author=old.author, updated_at=old.updated_at,
                    access=ref.access,
                )
            if changed and ref.external_id not in report.metadata_updated:
                report.metadata_updated.append(ref.external_id)

    async def _prepare_items(
        self, items: Sequence[SourceItem], stored: dict[str, store.StoredDocument], report: SyncReport,
        progress: SyncProgress,
    ) -> list[_Prepared]:
        """Settle what needs no new chunks (same version or same content: at most a metadata update), fetch the
        rest (concurrently, bounded), then parse and chunk it one document at a time. Returns what to embed."""
        need: list[SourceItem] = []
        for item in items:
            old = stored.get(item.external_id)
            version = self.stored_version(item)
            if old is not None and version is not None and old.version == version:
                if item.resolve_access is not None:  # not resolved for unchanged items: the prune pass re-checks
                    item = dataclasses.replace(item, access=old.access, resolve_access=None)
                if await self._update_metadata_if_changed(item, old):
                    report.metadata_updated.append(item.external_id)
                else:
                    report.unchanged += 1
                progress.advance(item.external_id)
            else:
                need.append(item)
        resolved = []
        for item in need:
            if item.resolve_access is not None:
                try:
                    item = dataclasses.replace(item, access=tuple(await item.resolve_access()), resolve_access=None)
                except ItemUnavailable as exc:  # e.g. deleted mid-sync: this item is recorded, the run goes on
                    report.failed.append((item.external_id, f"could not read: {exc}"))
                    progress.advance(item.external_id)
                    continue
            resolved.append(item)
        need = resolved
        max_bytes = self.settings.max_file_mb * 1024 * 1024
        for item in [i for i in need if i.size is not None and i.size > max_bytes]:  # refused before reading it
            await self._over_limit(item, stored.get(item.external_id), self._too_large(item.size or 0), report)
            progress.advance(item.external_id)
        need = [i for i in need if i.size is None or i.size <= max_bytes]
        fetched = await asyncio.gather(*(self._fetch(item) for item in need))
        # Parsed concurrently: each file in a worker process of the parse pool (PARSE_WORKERS of them).
        results = await asyncio.gather(*(
            self._prepare(item, stored.get(item.external_id), result, report)
            for item, result in zip(need, fetched, strict=True)
        ))
        prepared = []
        for item, ready in zip(need, results, strict=True):
            if ready is not None:
                prepared.append(ready)
            else:
                progress.advance(item.external_id)
        return prepared

    def _too_large(self, size: int) -> str:
        return f"{size / 1024 / 1024:,.1f} MB, over {self.settings.max_file_mb} MB (setting MAX_FILE_MB)"

    async def _fetch(self, item: SourceItem) -> _Fetched:
        async with self._fetch_slots:
            try:
                data = await read_item(item)
            except (OSError, ItemUnavailable) as exc:
                return _Fetched(error=f"could not read: {exc}")
        return _Fetched(data=data)

    @property
    def _chunk_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if getattr(self, "_chunk_lock_loop", None) is not loop:
            self._chunk_lock_loop = loop
            self._chunk_lock_value = asyncio.Lock()
        return self._chunk_lock_value

    @property
    def _fetch_slots(self) -> asyncio.Semaphore:
        # One per event loop: the knowledge base may be used from several loops over its life (tests, the CLI).
        loop = asyncio.get_running_loop()
        if getattr(self, "_slots_loop", None) is not loop:
            self._slots_loop = loop
            self._slots = asyncio.Semaphore(FETCH_CONCURRENCY)
        return self._slots

    async def _prepare(
        self, item: SourceItem, old: store.StoredDocument | None, fetched: _Fetched, report: SyncReport
    ) -> _Prepared | None:
        if fetched.data is None:
            await self._fail(item, old, fetched.error or "could not read", report)
            return None
        data = fetched.data
        if len(data) > self.settings.max_file_mb * 1024 * 1024:
            await self._over_limit(item, old, self._too_large(len(data)), report)
            return None
        digest = item_hash(item, data, self.settings, self.embedder.name)
        if old is not None and old.content_hash == digest:
            if await self._update_metadata_if_changed(item, old):
                report.metadata_updated.append(item.external_id)
            else:
                report.unchanged += 1
            if old.version != self.stored_version(item):
                async with self.engine.begin() as conn:
                    await store.set_document_version(conn, old.id, self.stored_version(item))
            return None
        limit = self.settings.max_document_chunks
        max_chars = max(limit * self.settings.chunk_tokens * CHARS_PER_TOKEN_BOUND, MIN_DOCUMENT_CHARS)
        try:
            result = await self.parser.parse(data, item.filename, max_chars)
        except UnsupportedFormat as exc:
            report.skipped.append((item.external_id, str(exc)))
            return None
        except LimitExceeded as exc:
            await self._over_limit(item, old, str(exc), report)
            return None
        except CorruptDocument as exc:
            await self._fail(item, old, str(exc), report)
            return None
        parsed = result.document
        if not parsed.text.strip():
            # Nothing to answer from: indexing it would store a chunk holding only its title ("Empty" for
            # empty.txt). Reported; a version indexed before is kept, like a file that failed.
            report.empty.append(item.external_id)
            logger.info("skipped %s: empty", item.external_id)
            if old is not None:
                await self._update_metadata_if_changed(item, old)
            return None
        if item.title:
            parsed.title = item.title
        if result.truncated:
            report.warnings.append(
                f"{item.external_id}: only its first {max_chars:,} characters are indexed (MAX_DOCUMENT_CHUNKS)"
            )
        try:
            async with self._chunk_lock:  # files parse side by side; the tokenizer is used by one thread at a time
                drafts = await asyncio.to_thread(
                    chunk_document, parsed, self.embedder.count_tokens_many, self.settings.chunk_tokens,
                    self.settings.chunk_overlap_tokens,
                )
        except Exception as exc:  # one document the chunker or tokenizer chokes on must not end the whole sync
            logger.exception("could not chunk %s", item.external_id)
            await self._fail(item, old, f"could not be split into chunks: {type(exc).__name__}: {exc}", report)
            return None
        drafts = unique_chunks(drafts)
        if len(drafts) > limit:
            drafts = drafts[:limit]
            report.warnings.append(
                f"{item.external_id}: only its first {limit} chunks are indexed (MAX_DOCUMENT_CHUNKS)"
            )
        return _Prepared(item, digest, parsed.title, drafts, [content_hash(d.search_text) for d in drafts])

    async def _fail(self, item: SourceItem, old: store.StoredDocument | None, reason: str, report: SyncReport) -> None:
        """Report the item and keep its previous version, but with its current access list and metadata: a file
        that was restricted and broken in the same change must not stay visible under its old permissions."""
        report.failed.append((item.external_id, reason))
        logger.info("skipping %s: %s", item.external_id, reason)
        if old is not None:
            await self._update_metadata_if_changed(item, old)

    async def _over_limit(
        self, item: SourceItem, old: store.StoredDocument | None, limit: str, report: SyncReport
    ) -> None:
        """Like `_fail` (the previous version stays, under the current access list), reported as over a limit."""
        report.skip_over_limit(item.external_id, limit)
        logger.info("skipped %s: %s", item.external_id, limit)
        if old is not None:
            await self._update_metadata_if_changed(item, old)

    async def _update_metadata_if_changed(self, item: SourceItem, old: store.StoredDocument) -> bool:
        current = (item.url, item.path, item.author, item.updated_at, principals_key(item.access))
        if (old.url, old.path, old.author, old.updated_at, principals_key(old.access)) == current:
            return False
        async with self.engine.begin() as conn:
            return await store.update_document_metadata(
                conn, old.id, url=item.url, path=item.path, author=item.author, updated_at=item.updated_at,
                access=item.access,
            )

    async def _write(
        self, batch: _Embedded, stored: dict[str, store.StoredDocument], source_id: int, report: SyncReport,
        progress: SyncProgress,
    ) -> None:
        """Write a batch of documents in one transaction. If Postgres refuses it (e.g. text it cannot store), write
        them one at a time, so only the refused document is reported failed and the rest of the batch is kept.

        The report counts what `store.write_documents` decided under the documents' locks, not what this sync read
        before: another sync of the same source may have written a document first."""
        writes = [self._document_write(p, batch.embeddings) for p in batch.prepared]
        outcomes: list[store.WriteOutcome | None] | None = None
        if len({w.external_id for w in writes}) == len(writes):  # else one item came twice: write them in order
            try:
                outcomes = list(await store.write_documents(
                    self.engine, source_id, writes, self.settings.text_search_config
                ))
            except DBAPIError:  # e.g. text Postgres cannot store: find out which document, one at a time
                pass
        if outcomes is None:
            outcomes = [await self._write_alone(source_id, w, report) for w in writes]
        for p, outcome in zip(batch.prepared, outcomes, strict=True):
            if outcome is not None:
                self._count(p, outcome, report)
                stored[p.item.external_id] = store.StoredDocument(
                    outcome.document_id, p.hash, p.title, p.item.url, p.item.path, p.item.author,
                    p.item.updated_at, tuple(p.item.access), chunks=len(p.drafts), version=self.stored_version(p.item),
                )
            progress.advance(p.item.external_id)

    async def _write_then(
        self, batch: _Embedded, stored: dict[str, store.StoredDocument], source_id: int, report: SyncReport,
        progress: SyncProgress, on_committed: Callable[[], Awaitable[None]] | None,
    ) -> None:
        await self._write(batch, stored, source_id, report, progress)
        if on_committed is not None:
            await on_committed()

    def _document_write(self, p: _Prepared, embeddings: dict[str, np.ndarray]) -> store.DocumentWrite:
        rows = [
            store.ChunkRow(d.ordinal, d.text, d.heading, d.token_count, h, embeddings[h], d.search_text)
            for d, h in zip(p.drafts, p.chunk_hashes, strict=True)
        ]
        return store.DocumentWrite(
            p.item.external_id, p.title, p.item.url, p.item.path, p.item.author, p.item.updated_at, p.hash,
            p.item.access, rows, version=self.stored_version(p.item),
        )

    async def _write_alone(
        self, source_id: int, write: store.DocumentWrite, report: SyncReport
    ) -> store.WriteOutcome | None:
        """One document in its own transaction; None, and reported failed, when Postgres refuses it."""
        try:
            (outcome,) = await store.write_documents(self.engine, source_id, [write], self.settings.text_search_config)
        except DBAPIError as exc:  # the rest of the sync goes on
            report.failed.append((write.external_id, f"could not store: {str(exc.orig).splitlines()[0]}"))
            logger.info("could not store %s: %s", write.external_id, exc.orig)
            return None
        return outcome

    @staticmethod
    def _count(p: _Prepared, written: store.WriteOutcome, report: SyncReport) -> None:
        if written.outcome == "unchanged":
            report.unchanged += 1
        elif written.outcome == "metadata_updated":
            report.metadata_updated.append(p.item.external_id)
        else:
            report.chunks_written += len(p.drafts)
            (report.added if written.outcome == "added" else report.updated).append(p.item.external_id)

    async def embeddings_for(
        self, texts: dict[str, str], report: SyncReport | None = None
    ) -> dict[str, np.ndarray]:
        """Embeddings (float32 vectors) for {hash: text}, from the cache where possible."""
        async with self.engine.begin() as conn:
            found, embedded = await self._embed_with_cache(conn, texts)
        if report is not None:
            report.chunks_embedded += embedded
            report.chunks_from_cache += len(texts) - embedded
        return found

    async def _embed_with_cache(
        self, conn: AsyncConnection, texts: dict[str, str]
    ) -> tuple[dict[str, np.ndarray], int]:
        """Look {hash: text} up in the cache, embed what is missing and cache it. Returns (embeddings, embedded)."""
        found = await store.cached_embeddings(conn, self.embedder.name, list(texts))
        missing = [h for h in texts if h not in found]
        if missing:
            vectors = await self.embedder.embed_async([texts[h] for h in missing])
            computed = {h: store.as_vector(v) for h, v in zip(missing, vectors, strict=True)}
            await store.cache_embeddings(conn, self.embedder.name, computed)
            found.update(computed)
        return found, len(missing)

    async def embedding_space_matches(self) -> bool:
        """Whether the stored vectors were made by the configured model, read from kb_meta without loading it."""
        async with self.engine.connect() as conn:
            return await store.get_meta(conn, "embedding_model") == self.embedder.name

    async def ensure_embedding_space(self) -> bool:
        """Make the stored embeddings match the configured model. Returns True if chunks were re-embedded.

        Changing EMBEDDING_MODEL re-embeds every chunk (from the cache when it has them) and rebuilds the vector
        index in one transaction: searches see either the old model's vectors or the new one's, never a mix.
        """
        async with self.engine.begin() as conn:
            await store.lock_embedding_space(conn)
            model = await store.get_meta(conn, "embedding_model")
            if model == self.embedder.name:
                return False  # set together with its vector index below, in one transaction
            dimension = self.embedder.dimension
            reembedded = False
            if model is not None:
                await store.drop_vector_indexes(conn)  # rebuilt once below: faster than updating it row by row
                await self._reembed_all(conn)
                reembedded = True
            await store.set_meta(conn, "embedding_model", self.embedder.name)
            await store.set_meta(conn, "embedding_dimension", str(dimension))
            await store.ensure_vector_index(conn, dimension)
            return reembedded

    async def _reembed_all(self, conn: AsyncConnection) -> None:
        last_id = 0
        while True:
            rows = await store.chunks_for_reembedding(conn, last_id, 256)
            if not rows:
                return
            texts = {row[0]: compose_search_text(row[1], row[2], row[3]) for row in rows}
            found, _ = await self._embed_with_cache(conn, {content_hash(t): t for t in texts.values()})
            ids = list(texts)
            await store.set_chunk_embeddings(conn, ids, [found[content_hash(texts[i])] for i in ids])
            last_id = rows[-1][0]


async def run_stages(*stages: Coroutine[object, object, None]) -> None:
    """Run the stages of a pipeline as concurrent tasks until all have finished. The first to fail cancels the
    others, and its exception is raised as it is (not in an ExceptionGroup, so callers still catch, say,
    SourceUnavailable); so does cancelling the caller."""
    tasks = [asyncio.ensure_future(stage) for stage in stages]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            error = task.exception() if task.done() and not task.cancelled() else None
            if error is not None:
                raise error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
