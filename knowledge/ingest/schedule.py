"""Scheduled syncs: APScheduler 3.11 inside `ragbot run` (via `start_scheduler`) or alone (`ragbot scheduler`).

Each stored source with a schedule gets two interval jobs: a sync every `schedule_seconds` and a prune every
`prune_seconds`, both calling the one job function `KnowledgeBase.sync_source(trigger="schedule")`. Jobs are
jittered (start times spread, so replicas and sources do not fire together), coalesce missed runs into one, and
allow one instance at a time. Across processes, `sync_source` holds a lease per source for the whole run (a row of
`leases`, renewed while it runs: db.leases), so several schedulers on one database, on any hosts and behind a
transaction-mode pooler, never sync the same source at once (the loser's run is skipped with SourceBusy, which is
normal and logged at debug level); a scheduler that dies mid-run hands the source over once its lease expires
(SYNC_LEASE_SECONDS). The lease prevents overlap, not repetition: N
replicas would still run each source N times an interval, one after another. So, under the lease, a scheduled run
is skipped (RecentlySynced, a SourceBusy) when a scheduled run of that source started within the last
`interval × (1 - 2 × jitter)` by the database's clock: one run per source per interval, whatever the number of
replicas (a run whose process died does not count, so a replica takes over within the interval). APScheduler's own job store is in memory: jobs are
rebuilt from the `sources` table, re-read every `refresh_seconds` so `ragbot source add/remove` in another process
takes effect without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from knowledge.errors import KnowledgeError, SourceBusy
from knowledge.ingest.groups import groups_seconds

if TYPE_CHECKING:
    from knowledge.kb import KnowledgeBase

logger = logging.getLogger(__name__)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_interval(value: str) -> int:
    """"90s", "15m", "1h", "1h30m", "1d" → seconds. Raises ValueError with the accepted forms."""
    cleaned = value.strip().lower().replace(" ", "")
    parts = re.findall(r"(\d+)([smhdw])", cleaned)
    if not cleaned or "".join(n + u for n, u in parts) != cleaned:
        raise ValueError(f"cannot read the interval {value!r}: use a number and a unit, e.g. 30m, 1h, 6h, 1d")
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"the interval {value!r} must be longer than zero")
    return seconds


def format_interval(seconds: int | None) -> str:
    if not seconds:
        return "on demand"
    out = []
    for unit in ("d", "h", "m", "s"):
        n, seconds = divmod(seconds, _UNITS[unit])
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)


@dataclass
class SchedulerHandle:
    """What `start_scheduler` returns: stop it with `await handle.stop()` (waits for running syncs to finish)."""

    kb: KnowledgeBase
    scheduler: AsyncIOScheduler
    refresh_seconds: float
    jitter_fraction: float
    _signatures: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    _groups: dict[str, int] = field(default_factory=dict)  # source -> group directory refresh interval
    _refresher: asyncio.Task[None] | None = None
    _running: set[asyncio.Task[object]] = field(default_factory=set)
    _helping: set[str] = field(default_factory=set)  # sources whose split first sync this scheduler is helping
    _syncing: set[str] = field(default_factory=set)  # sources this scheduler's own jobs are syncing now

    async def refresh(self) -> None:
        """Add, change and drop jobs to match the stored sources."""
        sources = await self.kb.list_sources()
        wanted = {s.name: (s.schedule_seconds, s.prune_seconds) for s in sources if s.schedule_seconds}
        for name in list(self._signatures):
            if self._signatures[name] != wanted.get(name):
                for job_id in (f"sync:{name}", f"prune:{name}"):
                    if self.scheduler.get_job(job_id):
                        self.scheduler.remove_job(job_id)
                del self._signatures[name]
        for name, (every, prune_every) in wanted.items():
            if name in self._signatures:
                continue
            self._add_job(f"sync:{name}", name, every, prune=None)
            if prune_every:
                self._add_job(f"prune:{name}", name, prune_every, prune=True)
            self._signatures[name] = (every, prune_every)
        self._refresh_group_jobs({s.name: groups_seconds(s.kind, s.config) for s in sources})
        # A big source's first sync split into parts (knowledge.ingest.split): join it now rather than at this
        # source's next firing, which may be an interval away.
        for name in await self.kb.open_split_syncs():
            # Not a source this process already syncs: a second task here shares the same cores and model, and
            # measured slower (bench/sync_workers.py --case big); other processes' parts are what it is for.
            if name in wanted and name not in self._helping and name not in self._syncing:
                self._helping.add(name)
                self._running.add(asyncio.create_task(self._help_split(name)))

    async def _help_split(self, name: str) -> None:
        task = asyncio.current_task()
        try:
            report = await self.kb.sync_source(name, trigger="schedule")
            logger.info("split first sync of %s: %d added here", name, len(report.added))
        except SourceBusy:
            logger.debug("split first sync of %s: no part left to take", name)
        except KnowledgeError as exc:
            logger.warning("split first sync of %s failed: %s", name, exc)
        except Exception:
            logger.exception("split first sync of %s failed", name)
        finally:
            self._helping.discard(name)
            if task is not None:
                self._running.discard(task)

    def _refresh_group_jobs(self, wanted: dict[str, int | None]) -> None:
        """One `groups:NAME` job per source with a group directory, every `--groups-every` (knowledge.ingest.groups);
        its first run comes soon after start, so a new replica or source does not wait a whole interval."""
        for name in [n for n, every in self._groups.items() if wanted.get(n) != every]:
            if self.scheduler.get_job(f"groups:{name}"):
                self.scheduler.remove_job(f"groups:{name}")
            del self._groups[name]
        for name, every in wanted.items():
            if every and name not in self._groups:
                first = datetime.now(UTC) + timedelta(seconds=random.uniform(1, 1 + every * self.jitter_fraction))
                self.scheduler.add_job(
                    self._run_groups, IntervalTrigger(seconds=every, jitter=every * self.jitter_fraction or None),
                    args=[name], id=f"groups:{name}", name=f"groups:{name}", coalesce=True, max_instances=1,
                    misfire_grace_time=every, replace_existing=True, next_run_time=first)
                self._groups[name] = every

    async def _run_groups(self, name: str) -> None:
        try:
            report = await self.kb.refresh_groups(name)
            logger.info("group directory of %s: %d groups, %d memberships", name, report.groups, report.memberships)
        except KnowledgeError as exc:  # recorded on the directory; the last good membership is kept
            logger.warning("group directory refresh of %s failed: %s", name, exc)
        except Exception:
            logger.exception("group directory refresh of %s failed", name)

    def _add_job(self, job_id: str, name: str, every: int | None, prune: bool | None) -> None:
        assert every
        self.scheduler.add_job(
            self._run, IntervalTrigger(seconds=every, jitter=max(0.0, every * self.jitter_fraction) or None),
            args=[name, prune, every], id=job_id, name=job_id, coalesce=True, max_instances=1,
            misfire_grace_time=max(1, every), replace_existing=True,
        )

    async def _run(self, name: str, prune: bool | None, every: int) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        self._syncing.add(name)
        try:
            # Jitter delays each firing by up to every × jitter: the same replica's runs are at least
            # every × (1 - jitter) apart, so this gap never skips a replica's own next run.
            gap = every * max(0.5, 1 - 2 * self.jitter_fraction)
            report = await self.kb.sync_source(name, trigger="schedule", prune=prune, unless_ran_within=gap)
            logger.info("scheduled sync of %s: %d added, %d updated, %d deleted, %d failed", name,
                        len(report.added), len(report.updated), len(report.deleted), len(report.failed))
        except SourceBusy:
            logger.debug("skipping scheduled sync of %s: another process is syncing it", name)
        except KnowledgeError as exc:  # recorded as a failed run; the next interval retries
            logger.warning("scheduled sync of %s failed: %s", name, exc)
        except Exception:
            logger.exception("scheduled sync of %s failed", name)
        finally:
            self._syncing.discard(name)
            if task is not None:
                self._running.discard(task)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_seconds)
            try:
                await self.refresh()
            except Exception:
                logger.exception("could not re-read the stored sources")

    def jobs(self) -> list[str]:
        return sorted(job.id for job in self.scheduler.get_jobs())

    async def stop(self, timeout: float = 60.0) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        # No new runs; let the ones already going finish and record themselves (shutting the executor down
        # would cancel them: safe, but the run would show as interrupted), then stop.
        self.scheduler.pause()
        if self._running:
            await asyncio.wait(list(self._running), timeout=timeout)
        self.scheduler.shutdown(wait=False)


async def start_scheduler(kb: KnowledgeBase, *, refresh_seconds: float = 60.0,
                          jitter_fraction: float = 0.1) -> SchedulerHandle:
    """Start scheduled syncs on the running event loop and return a handle (`await handle.stop()`).

    Call from `ragbot run`'s composition root after opening the knowledge base. Jitter spreads each run by up to
    `jitter_fraction` of its interval."""
    scheduler = AsyncIOScheduler(timezone="UTC")
    handle = SchedulerHandle(kb, scheduler, refresh_seconds, jitter_fraction)
    scheduler.start()
    await handle.refresh()
    handle._refresher = asyncio.create_task(handle._refresh_forever())
    return handle


class SchedulerService:
    """The scheduler as a background service with `start()` / `stop()` (the shape `ragbot run`'s composition root
    gives its services). `get_kb` returns the opened knowledge base when `start()` runs (it may not exist yet when
    the service is built)."""

    def __init__(self, get_kb: Callable[[], KnowledgeBase], *, refresh_seconds: float = 60.0) -> None:
        self.get_kb = get_kb
        self.refresh_seconds = refresh_seconds
        self.handle: SchedulerHandle | None = None

    async def start(self) -> None:
        self.handle = await start_scheduler(self.get_kb(), refresh_seconds=self.refresh_seconds)

    async def stop(self) -> None:
        if self.handle is not None:
            await self.handle.stop()
            self.handle = None
