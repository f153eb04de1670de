"""Reads from hot standbys (DATABASE_REPLICA_URLS), writes on the primary.

`ReadRouter.engine` is an engine like any other, for statements that may read a slightly old copy of the index:
searches, status counts, run history, the insights' document lookups. Its pool opens each new connection on a
standby that answers and is within REPLICA_MAX_LAG_SECONDS of the primary (in turn), else on the primary. Everything
that writes, and every read that must see a write just made (conversation turns, claims, leases), keeps using the
primary's engine: a standby refuses writes, and lags.

Lag is measured without writing anything: every few seconds the watcher samples the primary's WAL position, and a
standby's lag is how long ago the primary first stood at a position the standby has not replayed yet (0 when it has
replayed everything sampled). An idle primary therefore shows no false lag, and a standby cut off from its primary
shows its true age. A standby that lags too far or does not answer is skipped: pooled connections to it are
replaced at their next checkout, and it is used again once it has caught up. `/healthz` and `/metrics` show each
standby's state (bot.server).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import create_engine
from db.settings import redact_url

logger = logging.getLogger(__name__)

PRIMARY = "primary"
# Seconds a standby is given to accept a connection before it counts as not answering.
CONNECT_TIMEOUT_SECONDS = 3


def lsn_number(lsn: str) -> int:
    """'16/B374D848' → a comparable integer (a WAL position is two hex halves)."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def libpq_dsn(url: str) -> str:
    """A SQLAlchemy URL as psycopg's connection string."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass
class Replica:
    """One standby as the watcher last saw it."""

    url: str
    name: str  # the URL without its password: what /healthz and /metrics show
    lag_seconds: float | None = None  # None: not measured yet, or not answering
    error: str | None = "not checked yet"
    checked_at: float = 0.0
    reads: int = 0  # connections opened on it (a test and /metrics can tell the standby served)
    monitor: psycopg.AsyncConnection[Any] | None = field(default=None, repr=False)


class ReadRouter:
    """The read engine over the primary and its standbys, and the watcher measuring their lag."""

    def __init__(self, primary_url: str, replica_urls: list[str], max_lag_seconds: float, *,
                 check_seconds: float | None = None, transaction_pooler: bool | None = None) -> None:
        self.primary_url = primary_url
        self.max_lag_seconds = max_lag_seconds
        # Often enough that a standby falling behind is noticed well within the limit, at most every 5 s.
        self.check_seconds = check_seconds or max(0.5, min(5.0, max_lag_seconds / 4))
        self.replicas = [Replica(url, redact_url(url)) for url in replica_urls]
        self.primary_reads = 0
        self._turn = itertools.count()
        self._samples: deque[tuple[float, int]] = deque()  # (monotonic time, primary WAL position)
        self._primary_monitor: psycopg.AsyncConnection[Any] | None = None
        self._targets: weakref.WeakKeyDictionary[Any, Replica | None] = weakref.WeakKeyDictionary()
        self._watcher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.engine: AsyncEngine = create_engine(primary_url, autocommit=True, transaction_pooler=transaction_pooler,
                                                 async_creator=self._connect)
        self._connect_args: dict[str, Any] = {"prepare_threshold": None} if transaction_pooler else {}
        event.listen(self.engine.sync_engine, "connect", self._remember_target)
        event.listen(self.engine.sync_engine, "checkout", self._check_target)

    # --- which server a new connection goes to ---------------------------------------------------------------

    def usable(self, replica: Replica) -> bool:
        return replica.error is None and replica.lag_seconds is not None and replica.lag_seconds <= self.max_lag_seconds

    def usable_replicas(self) -> list[Replica]:
        return [replica for replica in self.replicas if self.usable(replica)]

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        candidates = self.usable_replicas()
        if candidates:
            start = next(self._turn) % len(candidates)
            for replica in candidates[start:] + candidates[:start]:
                try:
                    conn = await psycopg.AsyncConnection.connect(
                        libpq_dsn(replica.url), connect_timeout=CONNECT_TIMEOUT_SECONDS, **self._connect_args)
                except psycopg.Error as error:
                    self._mark_down(replica, error)
                    continue
                replica.reads += 1
                self._targets[conn] = replica
                return conn
        conn = await psycopg.AsyncConnection.connect(libpq_dsn(self.primary_url), **self._connect_args)
        self.primary_reads += 1
        self._targets[conn] = None
        return conn

    def _remember_target(self, dbapi_connection: Any, connection_record: Any) -> None:
        connection_record.info["replica"] = self._targets.get(dbapi_connection.driver_connection)

    def _check_target(self, dbapi_connection: Any, connection_record: Any, connection_proxy: Any) -> None:
        """A pooled connection to a standby that is now skipped, or to the primary while a standby is usable
        again, is replaced (the pool reconnects through _connect)."""
        replica = connection_record.info.get("replica")
        if (replica is not None and not self.usable(replica)) or (replica is None and self.usable_replicas()):
            raise exc.DisconnectionError("read target changed")

    def _mark_down(self, replica: Replica, error: BaseException) -> None:
        if replica.error is None:
            logger.warning("standby %s is not answering; reading from the primary: %s", replica.name,
                           str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
        replica.error = f"unreachable ({type(error).__name__})"
        replica.lag_seconds = None

    # --- the watcher ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Measure the standbys now and every check_seconds (on the running event loop), until close()."""
        if self.replicas and self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            try:
                await self.check_now()
            except Exception:  # noqa: BLE001 - the watcher must outlive a bad check
                logger.exception("could not measure the standbys' lag")
            await asyncio.sleep(self.check_seconds)

    async def check_now(self) -> None:
        """Sample the primary's WAL position, then each standby's replayed position, and update their lag."""
        async with self._lock:
            now = time.monotonic()
            try:
                if self._primary_monitor is None or self._primary_monitor.closed:
                    self._primary_monitor = await psycopg.AsyncConnection.connect(
                        libpq_dsn(self.primary_url), autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                        prepare_threshold=None)
                cursor = await self._primary_monitor.execute("SELECT pg_current_wal_lsn()::text")
                row = await cursor.fetchone()
                assert row is not None
                self._samples.append((now, lsn_number(row[0])))
            except psycopg.Error as error:
                # Without the primary there is nothing to compare with: the last measurements stand.
                logger.warning("could not read the primary's WAL position: %s", type(error).__name__)
                await self._close(self._primary_monitor)
                self._primary_monitor = None
                return
            keep = max(60.0, 4 * self.max_lag_seconds)
            while len(self._samples) > 1 and self._samples[0][0] < now - keep:
                self._samples.popleft()
            await asyncio.gather(*(self._check(replica) for replica in self.replicas))

    async def _check(self, replica: Replica) -> None:
        try:
            if replica.monitor is None or replica.monitor.closed:
                replica.monitor = await psycopg.AsyncConnection.connect(
                    libpq_dsn(replica.url), autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                    prepare_threshold=None)
            cursor = await replica.monitor.execute(
                "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text")
            row = await cursor.fetchone()
            assert row is not None
            in_recovery, replayed = row
        except psycopg.Error as error:
            self._mark_down(replica, error)
            await self._close(replica.monitor)
            replica.monitor = None
            return
        replica.checked_at = time.monotonic()
        if not in_recovery or replayed is None:
            # A promoted standby has a history of its own: reading from it could show what the primary never had.
            replica.error, replica.lag_seconds = "not a standby (promoted?)", None
            return
        replica.lag_seconds = self.lag_for(lsn_number(replayed), replica.checked_at)
        was_skipped = replica.error is not None
        replica.error = None
        if replica.lag_seconds > self.max_lag_seconds:
            logger.warning("standby %s is %.1f s behind (limit %.0f s); reading from the primary", replica.name,
                           replica.lag_seconds, self.max_lag_seconds)
        elif was_skipped:
            logger.info("standby %s is in sync again (%.1f s behind); reading from it", replica.name,
                        replica.lag_seconds)

    def lag_for(self, replayed: int, now: float) -> float:
        """Seconds since the primary first stood at a WAL position past `replayed` (0 when none was sampled)."""
        for sampled_at, position in self._samples:
            if position > replayed:
                return max(0.0, now - sampled_at)
        return 0.0

    @staticmethod
    async def _close(conn: psycopg.AsyncConnection[Any] | None) -> None:
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
            self._watcher = None
        for conn in [self._primary_monitor, *(replica.monitor for replica in self.replicas)]:
            await self._close(conn)
        await self.engine.dispose()

    # --- what /healthz and /metrics show ---------------------------------------------------------------------

    def states(self) -> dict[str, str]:
        """Each standby: "ok (lag 0.2 s)", "skipped: lag 45.0 s > 30 s" or "skipped: unreachable (...)"."""
        out = {}
        for replica in self.replicas:
            if replica.error is not None:
                out[replica.name] = f"skipped: {replica.error}"
            elif replica.lag_seconds is not None and replica.lag_seconds > self.max_lag_seconds:
                out[replica.name] = f"skipped: lag {replica.lag_seconds:.1f} s > {self.max_lag_seconds:g} s"
            else:
                out[replica.name] = f"ok (lag {replica.lag_seconds or 0.0:.1f} s)"
        return out
