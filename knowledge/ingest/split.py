"""A big source's first sync split across workers (issue 43, item 3): by the units its connector enumerates.

Why: a first sync is the long one (a whole corpus to parse and embed), and one source is one worker's job, so a
single big source kept every other worker idle. Now a source whose connector can list units (`parts()` and
`part(unit)`) has its first sync cut into parts, each leased on its own (db.leases, `sync_part:SOURCE:PART`,
renewed while it runs). The units by connector:

- a folder: its top-level folders, plus its top-level files as one unit (knowledge.sources.folder);
- Confluence: its spaces (knowledge.sources.confluence); a source of one space is one unit;
- Google Drive: each root's (shared drive's or configured folder's) top-level folders, plus each root's own files
  as one unit (knowledge.sources.gdrive), listed with files.list as the walk lists them.

How the parts are shared:

- The worker that takes the source's lease coordinates: it records the plan (table `sync_parts`), syncs parts
  itself, then waits until every part is done (taking over any part whose worker died, once its lease expired),
  and publishes the source.
- A worker whose run finds the source's lease held but parts not taken helps: it syncs free parts, one at a time,
  and records a run of its own (its counts, its parts in the run's details); it does not wait for the others.
- Every document a part writes has its access masked (knowledge.storage.parts.PENDING): no asker sees a
  half-finished index. `publish` unmasks the whole source in one transaction, so a search sees it whole or not at
  all. A coordinator that dies leaves the plan; the next run of the source (any worker) coordinates it on.
- Only the first sync is split (the source never finished one and holds no documents): later syncs are
  incremental and stay one unit. A part never prunes: its listing covers a slice of the source. A part sets no
  checkpoint either (its listing is not the source's), so the sync after a split one lists the source whole once
  (Confluence, Drive: every item listed again and compared by version, so nothing unchanged is parsed or embedded
  again; a source never pruned is pruned then too) and stores the checkpoint that later syncs go on from.

SYNC_SPLIT_FIRST (a setting, off by default: on one host the parts only share its cores) turns it on. A worker's scheduled job brings it here; the scheduler also
looks for split syncs with free parts on each refresh (knowledge.ingest.schedule), so idle workers join at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from db import leases
from knowledge.errors import RecentlySynced, Remedy, SourceBusy
from knowledge.ingest.pipeline import SyncProgress, SyncReport
from knowledge.sources.base import ChangeBatch, ItemRef, Source, SourceItem, SourceSpec
from knowledge.storage import documents as store
from knowledge.storage import parts as parts_store
from knowledge.storage import sources as sources_store

if TYPE_CHECKING:
    from knowledge.ingest.runs import SyncRunner

logger = logging.getLogger(__name__)

PART_LEASE = "sync_part:"  # + source id + ":" + part (not under leases.SOURCE_SYNC: those name whole sources)
# How often a coordinator looks whether the other workers' parts are done (or one of them died).
POLL_SECONDS = 0.5


class SplittableSource(Source, Protocol):
    """A source whose connector enumerates units: `parts()` lists them (names stored in the plan: a folder's are
    external-id prefixes, Confluence's space keys, Drive's "ROOT/FOLDER" ids; a coroutine when listing them takes
    requests), `part(unit)` is a source limited to one, with the same external ids."""

    def parts(self) -> list[str] | Awaitable[list[str]]: ...

    def part(self, unit: str) -> Source: ...


def part_lease(source_id: int, part: str) -> str:
    return f"{PART_LEASE}{source_id}:{part}"


async def units_of(source: Source) -> list[str] | None:
    """The units a first sync of `source` can be split into; None when it has fewer than two (nothing to share)."""
    parts = getattr(source, "parts", None)
    if parts is None or getattr(source, "part", None) is None:
        return None
    try:
        if inspect.iscoroutinefunction(parts):  # listed over HTTP (Drive's top-level folders)
            units: list[str] = await parts()
        else:  # listed from disk or the configuration
            units = await asyncio.to_thread(parts)
    except Exception as exc:  # noqa: BLE001 - the unsplit sync meets the same error and records it, with its fix
        logger.warning("could not list the parts of %s (%s); its first sync runs as one unit",
                       source.spec.name, type(exc).__name__)
        return None
    return units if len(units) >= 2 else None


def _masked(item: SourceItem) -> SourceItem:
    resolve = item.resolve_access
    if resolve is None:
        return dataclasses.replace(item, access=parts_store.mask(item.access))

    async def resolve_masked() -> Sequence[str]:
        return parts_store.mask(await resolve())

    return dataclasses.replace(item, access=parts_store.mask(item.access), resolve_access=resolve_masked)


@dataclass
class MaskedPart:
    """One part of a source, as the indexer sees it: the same items with their access masked until `publish`.
    No inventory (a part never prunes), no checkpoint (the first sync's parts each list their whole unit)."""

    inner: Source
    prune_on_every_sync: bool = False
    spec: SourceSpec = dataclasses.field(init=False)
    listing_prefix: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.spec = self.inner.spec
        self.listing_prefix = self.inner.listing_prefix

    @property
    def warnings(self) -> list[str]:
        return list(getattr(self.inner, "warnings", ()))

    async def check(self) -> None:
        await self.inner.check()

    async def changes(self, checkpoint: str | None, *, full: bool = False) -> AsyncIterator[ChangeBatch]:
        async for batch in self.inner.changes(None, full=full):
            yield ChangeBatch(items=[_masked(i) for i in batch.items], deleted=batch.deleted, total=batch.total)

    async def inventory(self) -> list[ItemRef] | None:
        return None

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class SplitSync:
    """One worker's share of a split first sync of `source` (stored as `source_id`), over the planned `parts`."""

    runner: SyncRunner
    source: SplittableSource
    source_id: int
    parts: list[str]
    trigger: str
    progress: SyncProgress | None = None

    @property
    def name(self) -> str:
        return self.source.spec.name

    async def run(self, unless_ran_within: float | None = None) -> SyncReport:
        """Coordinate the split sync when the source's lease is free; else help with the parts not taken. Raises
        SourceBusy when the lease is held and no part is free (as an ordinary sync of a busy source does)."""
        coordinating = False
        try:
            async with self.runner.source_lock(self.source_id, self.name):
                coordinating = True
                return await self._coordinate(unless_ran_within)
        except SourceBusy:
            if coordinating:
                raise
        return await self._help()

    async def _coordinate(self, unless_ran_within: float | None) -> SyncReport:
        engine = self.runner.engine
        report = SyncReport(source=self.name, trigger=self.trigger)
        async with engine.begin() as conn:
            # Carrying on a plan under way is never a repetition (a helper's finished run must not hold it back).
            carrying_on = bool(await parts_store.planned(conn, self.source_id))
            if unless_ran_within and not carrying_on and await sources_store.ran_within(
                conn, self.source_id, self.trigger, unless_ran_within, pruned=False
            ):
                raise RecentlySynced(f"source {self.name!r} was synced by another process in the last "
                                     f"{unless_ran_within:.0f} s")
            report.run_id = await sources_store.start_run(conn, self.source_id, self.trigger, False)
            await parts_store.plan(conn, self.source_id, self.parts)
        worked: list[str] = []

        async def work_and_publish() -> None:
            await self.source.check()
            # One bulk load for the whole split sync (the graph built once, after the publish), not one per part.
            async with store.bulk_load(engine, self.runner.indexer.settings.sync_lease_seconds):
                while True:
                    worked.extend(await self._work(report))
                    async with engine.connect() as conn:
                        state = await parts_store.planned(conn, self.source_id)
                    if all(state.values()):
                        break
                    await asyncio.sleep(POLL_SECONDS)  # other workers' parts: wait, or take one whose worker died
                async with engine.begin() as conn:
                    published = await parts_store.publish(conn, self.source_id)
                    await store.mark_source_synced(conn, self.source_id)
                logger.info("split first sync of %s published: %d documents from %d parts (%d here)", self.name,
                            published, len(state), len(worked))
            await store.reweight_bm25(engine)

        await self.runner.run_recorded(report, work_and_publish, details=lambda: {"parts": worked})
        return report

    async def _help(self) -> SyncReport:
        engine = self.runner.engine
        async with engine.connect() as conn:
            state = await parts_store.planned(conn, self.source_id)
        if all(state.values()):  # no split sync, or every part is taken or done: the source is busy
            raise SourceBusy(f"source {self.name!r} is being synced right now (by this or another process); "
                             "try again when that run finishes", remedy=Remedy.SHOW_STATUS, source=self.name)
        report = SyncReport(source=self.name, trigger=self.trigger)
        worked: list[str] = []

        async def start() -> None:  # recorded once a part is taken: a helper that finds none leaves no run
            async with engine.begin() as conn:
                report.run_id = await parts_store.start_helper_run(conn, self.source_id, self.trigger)

        async def work() -> None:
            await self.source.check()
            worked.extend(await self._work(report, on_first_part=start))

        await self.runner.run_recorded(report, work, details=lambda: {"parts": worked, "helped": True})
        if report.run_id is None:
            raise SourceBusy(f"source {self.name!r} is being synced right now, every part of it taken; "
                             "try again when that run finishes", remedy=Remedy.SHOW_STATUS, source=self.name)
        return report

    async def _work(self, report: SyncReport, on_first_part: Callable[[], Awaitable[None]] | None = None) -> list[str]:
        """Sync free parts one after another (each under its own lease) until none is free. Returns those synced.
        `on_first_part` is awaited once, when the first part is taken (before it is synced)."""
        engine = self.runner.engine
        seconds = self.runner.indexer.settings.sync_lease_seconds
        worked: list[str] = []
        while True:
            async with engine.connect() as conn:
                state = await parts_store.planned(conn, self.source_id)
            took = False
            for part in [p for p, done in state.items() if not done]:
                try:
                    async with leases.hold(engine, part_lease(self.source_id, part), seconds):
                        async with engine.connect() as conn:
                            if (await parts_store.planned(conn, self.source_id)).get(part, True):
                                continue  # done (or published) between the listing and the lease
                        if on_first_part is not None:
                            await on_first_part()
                            on_first_part = None
                        await self._sync_part(part, report)
                        async with engine.begin() as conn:
                            await parts_store.mark_done(conn, self.source_id, part)
                        worked.append(part)
                        took = True
                except leases.LeaseBusy:
                    continue
            if not took:
                return worked

    async def _sync_part(self, part: str, report: SyncReport) -> None:
        try:
            inner = self.source.part(part)
        except FileNotFoundError:  # the unit is gone since the plan was made: nothing of it to index
            logger.info("first sync of %s: part %r is gone; skipped", self.name, part)
            return
        piece = MaskedPart(inner)
        logger.info("first sync of %s: part %r", self.name, part or "(top-level files)")
        try:
            await self.runner.indexer.sync(
                piece, self.progress, source_id=self.source_id, checkpoint=None, full=False, prune=False,
                report=report, on_committed=lambda: self.runner.save_progress(report), mark_synced=False,
            )
        finally:
            await piece.aclose()


async def split_sync(
    runner: SyncRunner, source: Source, source_id: int, parts: list[str], *, trigger: str,
    progress: SyncProgress | None, unless_ran_within: float | None,
) -> SyncReport:
    return await SplitSync(runner, cast(SplittableSource, source), source_id, parts, trigger, progress).run(
        unless_ran_within)

