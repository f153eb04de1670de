"""The sync job: one function that the CLI, the scheduler and the chat adapters' `/kb reindex` all call.

A run: take the source's lock (or raise SourceBusy), record the run, rebuild the source from its stored row,
check the connection (bad credentials fail here, before anything is touched), apply the changes since the
stored checkpoint (saving each batch's checkpoint once its documents are committed), prune when due, and record
the outcome. Any error fails the run with its message recorded; the index keeps everything committed before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from db import leases
from knowledge.errors import RecentlySynced, Remedy, SourceBusy, SourceConfigError, SourceError, UnknownSource
from knowledge.ingest.pipeline import Indexer, SyncProgress, SyncReport
from knowledge.ingest.split import split_sync, units_of
from knowledge.sources.base import Source, SourceInfo, as_source, build_source
from knowledge.sources.folder import FolderSource
from knowledge.storage import documents as store
from knowledge.storage import parts as parts_store
from knowledge.storage import sources as sources_store
from knowledge.storage.sources import SyncRun

logger = logging.getLogger(__name__)

DEFAULT_PRUNE_SECONDS = 24 * 3600


def failed_files_line(failed: list[tuple[str, str]], shown: int = 3) -> str | None:
    """A run that finished but could not index some files records which, and why, as its error: a run listed "ok"
    with an empty error column while a file failed hid the failure (issue 41). None when nothing failed."""
    if not failed:
        return None
    named = "; ".join(f"{item}: {reason}" for item, reason in failed[:shown])
    more = f"; and {len(failed) - shown} more" if len(failed) > shown else ""
    return f"{len(failed)} {'file' if len(failed) == 1 else 'files'} failed: {named}{more}"


@dataclass
class SyncRunner:
    engine: AsyncEngine
    indexer: Indexer

    async def sync_stored(
        self, name: str, *, trigger: str, full: bool, progress: SyncProgress | None, prune: bool | None,
        unless_ran_within: float | None = None,
    ) -> SyncReport:
        """`unless_ran_within` (the scheduler: most of its interval): under the source's lock, skip with
        RecentlySynced when a run with the same trigger (a pruning one, for a prune job) started that recently, so
        N replicas on one database still run each source once per interval (the lock alone prevents overlap, not
        repetition)."""
        async with self.engine.connect() as conn:
            row = await sources_store.get_source(conn, name)
        if row is None:
            raise UnknownSource(f"unknown source {name!r}; sources: {', '.join(await self.names()) or 'none yet'}",
                                remedy=Remedy.ADD_SOURCE, source=name)
        try:
            source = build_source(row.name, row.kind, row.config)
        except SourceError as exc:  # e.g. the folder is gone: a failed run, recorded like any other
            async with self.source_lock(row.id, name):
                async with self.engine.begin() as conn:
                    run_id = await sources_store.start_run(conn, row.id, trigger, full)
                await self._record(SyncReport(source=name, run_id=run_id), "failed", str(exc))
            raise
        parts = None if full else await self._split_parts(source, row)
        if parts is not None:  # a big source's first sync, shared by the workers (knowledge.ingest.split)
            try:
                return await split_sync(self, source, row.id, parts, trigger=trigger, progress=progress,
                                        unless_ran_within=unless_ran_within)
            finally:
                await source.aclose()
        if prune is None and not full:
            prune = self._prune_due(row) or None
        return await self._run(source, row.id, trigger=trigger, full=full, progress=progress, prune=prune,
                               checkpoint=row.checkpoint, save_checkpoints=True, unless_ran_within=unless_ran_within)

    async def _split_parts(self, source: Source, row: sources_store.StoredSource) -> list[str] | None:
        """The parts of a split first sync to run: the plan under way, if any; else, for a source that never
        finished a sync and holds no documents, its units when it has several (SYNC_SPLIT_FIRST); else None. A plan
        under way is carried on whatever the setting says: its documents stay hidden until it is published."""
        async with self.engine.connect() as conn:
            planned = await parts_store.planned(conn, row.id)
            if planned:
                return list(planned)
            if (not self.indexer.settings.sync_split_first or row.last_synced_at is not None
                    or await parts_store.has_documents(conn, row.id)):
                return None
        return await units_of(source)

    async def sync_adhoc(self, source: Source, progress: SyncProgress | None, trigger: str = "cli") -> SyncReport:
        """A one-off sync of a source object (`ragbot ingest PATH`, BEIR corpora, tests): recorded and locked like
        any run; a folder becomes a stored source that `ragbot sync NAME` can run again."""
        source = as_source(source)
        async with self.engine.begin() as conn:
            source_id = await store.ensure_source(conn, source.spec.name, source.spec.kind, source.spec.location)
            if isinstance(source, FolderSource):
                await sources_store.ensure_folder_config(conn, source_id, str(source.root))
        return await self._run(source, source_id, trigger=trigger, full=False, progress=progress, prune=None,
                               checkpoint=None, save_checkpoints=False, close=False, wait=True)

    async def _run(
        self, source: Source, source_id: int, *, trigger: str, full: bool, progress: SyncProgress | None,
        prune: bool | None, checkpoint: str | None, save_checkpoints: bool, close: bool = True, wait: bool = False,
        unless_ran_within: float | None = None,
    ) -> SyncReport:
        name = source.spec.name
        report = SyncReport(source=name, trigger=trigger)
        try:
            async with self.source_lock(source_id, name, wait=wait):
                async with self.engine.begin() as conn:
                    if unless_ran_within and await sources_store.ran_within(
                        conn, source_id, trigger, unless_ran_within, pruned=bool(prune)
                    ):
                        raise RecentlySynced(f"source {name!r} was synced by another process in the last "
                                             f"{unless_ran_within:.0f} s")
                    report.run_id = await sources_store.start_run(conn, source_id, trigger, full)

                async def body() -> None:
                    await source.check()

                    async def save(value: str) -> None:
                        async with self.engine.begin() as conn:
                            await sources_store.save_checkpoint(conn, source_id, value)

                    await self.indexer.sync(
                        source, progress, source_id=source_id, checkpoint=checkpoint, full=full,
                        prune=True if full else prune, on_checkpoint=save if save_checkpoints else None,
                        report=report, on_committed=lambda: self.save_progress(report),
                    )
                    if report.pruned:
                        async with self.engine.begin() as conn:
                            await sources_store.mark_pruned(conn, source_id)

                await self.run_recorded(report, body)
        finally:
            if close:
                await source.aclose()
        return report

    async def run_recorded(
        self, report: SyncReport, body: Callable[[], Awaitable[None]],
        details: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """Run a recorded run's work (`report.run_id` started) and record how it ended: ok (with the files that
        failed, if any), failed with the error, or interrupted; errors are re-raised. `details` adds to the record."""
        status, error = "failed", None
        try:
            await body()
            status = "ok"
            error = failed_files_line(report.failed)
        except SourceError as exc:
            error = str(exc)
            raise
        except (asyncio.CancelledError, KeyboardInterrupt) as exc:  # stopped mid-run: resumes next time
            status, error = "interrupted", f"stopped before the end ({type(exc).__name__}); the next run resumes"
            raise
        except BaseException as exc:  # a bug: recorded, then re-raised
            error = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
            raise
        finally:
            report.finish()
            await self._record(report, status, error, details() if details is not None else None)

    @staticmethod
    def _counts(report: SyncReport) -> dict[str, int]:
        return {
            "added": len(report.added), "updated": len(report.updated),
            "metadata_updated": len(report.metadata_updated), "deleted": len(report.deleted),
            "unchanged": report.unchanged,
            "skipped": len(report.skipped) + len(report.over_limit) + len(report.empty),
            "failed": len(report.failed),
        }

    async def save_progress(self, report: SyncReport) -> None:
        """After each committed write: the run's counts so far (a kill -9 leaves them, not "no changes")."""
        if report.run_id is None:
            return
        try:
            async with self.engine.begin() as conn:
                await sources_store.save_run_counts(conn, report.run_id, self._counts(report))
        except Exception:  # a progress record is not worth failing the run for
            logger.warning("could not record the progress of sync run %s", report.run_id, exc_info=True)

    async def _record(self, report: SyncReport, status: str, error: str | None,
                      extra: dict[str, Any] | None = None) -> None:
        if report.run_id is None:
            return
        counts = self._counts(report)
        details = {"skipped": report.skipped[:200], "failed": report.failed[:200], "empty": report.empty[:200],
                   "warnings": report.warnings,
                   "over_limit": report.over_limit[:200], **(extra or {})}
        try:
            async with self.engine.begin() as conn:
                await sources_store.finish_run(conn, report.run_id, status=status, counts=counts,
                                               pruned=report.pruned, error=error, details=details)
        except Exception:  # the run's own outcome matters more than its record; the next run marks it
            logger.exception("could not record the end of sync run %s", report.run_id)

    @asynccontextmanager
    async def source_lock(self, source_id: int, name: str, wait: bool = False) -> AsyncIterator[None]:
        """Hold the source's sync lease (db.leases: a row, renewed while the run goes on, so it works behind a
        transaction-mode pooler and hands the source over SYNC_LEASE_SECONDS after its holder died). Raises
        SourceBusy if another run holds it, unless `wait` (a one-off `ragbot ingest` queues behind a scheduled run
        of the same folder instead of failing)."""
        try:
            async with leases.hold(self.engine, f"{leases.SOURCE_SYNC}{source_id}",
                                   self.indexer.settings.sync_lease_seconds, wait=wait):
                yield
        except leases.LeaseBusy:
            raise SourceBusy(f"source {name!r} is being synced right now (by this or another process); "
                             "try again when that run finishes", remedy=Remedy.SHOW_STATUS, source=name) from None

    def _prune_due(self, row: sources_store.StoredSource) -> bool:
        if not row.prune_seconds:
            return False
        if row.last_pruned_at is None:
            return True
        return datetime.now(UTC) - row.last_pruned_at >= timedelta(seconds=row.prune_seconds)

    async def open_split_syncs(self) -> list[str]:
        """Sources whose split first sync is not published yet (knowledge.ingest.split): where to help."""
        async with self.engine.connect() as conn:
            return await parts_store.open_split_sources(conn)

    async def names(self) -> list[str]:
        async with self.engine.connect() as conn:
            return [s.name for s in await sources_store.list_sources(conn)]

    async def list_sources(self) -> list[SourceInfo]:
        async with self.engine.connect() as conn:
            rows = await sources_store.list_sources(conn)
            last = await sources_store.last_runs(conn)
            running = await sources_store.syncing_source_ids(conn)
            documents = await sources_store.document_counts(conn)
        return [
            SourceInfo(r.name, r.kind, r.location, dict(r.config), r.schedule_seconds, r.prune_seconds,
                       documents.get(r.id, 0), last.get(r.name), r.id in running)
            for r in rows
        ]

    async def runs(self, name: str | None = None, limit: int = 20, engine: AsyncEngine | None = None) -> list[SyncRun]:
        """Recorded runs, newest first; `engine` is where to read them (a standby's read engine)."""
        async with (engine or self.engine).connect() as conn:
            if name is not None and await sources_store.get_source(conn, name) is None:
                raise UnknownSource(f"unknown source {name!r}")
            return await sources_store.list_runs(conn, name, limit)

    async def add(
        self, name: str, kind: str, config: dict[str, Any], *, schedule_seconds: int | None,
        prune_seconds: int | None, check: bool = True,
    ) -> SourceInfo:
        """Check the connection and save the source. A source that fails its check is not saved. Adding a name
        again with the same kind and location updates its settings (schedule, options) and keeps its index."""
        source = build_source(name, kind, config)
        async with self.engine.connect() as conn:
            existing = await sources_store.get_source(conn, name)
        if existing is not None and (existing.kind != kind or (existing.location or "") != (source.spec.location or "")):
            await source.aclose()
            raise SourceConfigError(
                f"source {name!r} already indexes {existing.kind} {existing.location or ''}".rstrip()
                + "; pick another name, or remove that source first", remedy=Remedy.REMOVE_SOURCE, source=name,
            )
        try:
            if check:
                await source.check()
        finally:
            await source.aclose()
        async with self.engine.begin() as conn:
            await sources_store.save_source(
                conn, name=name, kind=kind, location=source.spec.location, config=config,
                schedule_seconds=schedule_seconds,
                prune_seconds=prune_seconds if prune_seconds is not None else DEFAULT_PRUNE_SECONDS,
            )
        return next(s for s in await self.list_sources() if s.name == name)
