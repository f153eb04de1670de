"""Leases: "one process at a time does X", held by a row of table `leases` instead of a session advisory lock.

Why rows: a session advisory lock belongs to one server connection, and behind a pooler in transaction mode
(PgBouncer) a client's session is not a server connection: the lock would stay on whichever connection took it,
and its unlock could run on another. A lease is taken, renewed and released by single statements, each its own
transaction, so it works through any pooler, on any number of hosts.

A lease lasts `seconds`; its holder renews it every third of that while it works. A holder that dies (kill -9, a
lost host) stops renewing, and the next process takes the lease once it has expired: a source is handed over within
`seconds`. A holder that cannot renew in time (its database unreachable, its process paused) is cancelled, so that
two holders never work at once: the one that lost the lease stops. Times are the database's clock (hosts' clocks
may differ).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

logger = logging.getLogger(__name__)

SOURCE_SYNC = "source:"  # + source id: one sync at a time per source
BULK_LOAD = "bulk_load"  # a sync loading an empty index without its vector graph (knowledge.storage.documents)


class LeaseBusy(Exception):
    """Another holder has the lease (and it has not expired)."""


def new_holder() -> str:
    """Who holds a lease: host, process and a fresh id, so two attempts in one process never share a lease."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def try_take(engine: AsyncEngine, name: str, holder: str, seconds: float) -> bool:
    """Take the lease if it is free or expired. One statement: two processes racing for it cannot both win."""
    async with engine.begin() as conn:
        row = (await conn.execute(
            text(
                "INSERT INTO leases (name, holder, expires_at) VALUES (:n, :h, now() + make_interval(secs => :s)) "
                "ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, taken_at = now(), "
                "expires_at = EXCLUDED.expires_at WHERE leases.expires_at < now() RETURNING holder"
            ),
            {"n": name, "h": holder, "s": seconds},
        )).first()
    return row is not None


async def renew(engine: AsyncEngine, name: str, holder: str, seconds: float) -> bool:
    """Extend a held lease; False if it is no longer ours (it expired and someone took it)."""
    async with engine.begin() as conn:
        row = (await conn.execute(
            text("UPDATE leases SET expires_at = now() + make_interval(secs => :s) "
                 "WHERE name = :n AND holder = :h RETURNING name"),
            {"n": name, "h": holder, "s": seconds},
        )).first()
    return row is not None


async def release(engine: AsyncEngine, name: str, holder: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM leases WHERE name = :n AND holder = :h"), {"n": name, "h": holder})


async def held(conn: AsyncConnection, prefix: str) -> dict[str, str]:
    """Unexpired leases whose name starts with `prefix`: name → holder."""
    rows = await conn.execute(
        text("SELECT name, holder FROM leases WHERE starts_with(name, :p) AND expires_at > now()"), {"p": prefix})
    return {row.name: row.holder for row in rows}


@contextlib.asynccontextmanager
async def hold(engine: AsyncEngine, name: str, seconds: float, *, wait: bool = False,
               poll_seconds: float = 0.5) -> AsyncIterator[str]:
    """Hold lease `name` for the block (renewed every seconds/3). Raises LeaseBusy if it is held, unless `wait`
    (then polls until it is free). If the lease cannot be renewed before it expires, the block's task is
    cancelled: another process may take it from then on."""
    holder = new_holder()
    while not await try_take(engine, name, holder, seconds):
        if not wait:
            raise LeaseBusy(name)
        await asyncio.sleep(poll_seconds)
    task = asyncio.current_task()
    lost = asyncio.Event()
    renewer = asyncio.create_task(_keep(engine, name, holder, seconds, task, lost))
    try:
        yield holder
    except asyncio.CancelledError:
        if lost.is_set():
            if task is not None:
                task.uncancel()  # the cancellation was ours, not the caller's: it ends here, as LeaseLost
            raise LeaseLost(f"lost the lease {name!r}: it could not be renewed within {seconds:g} s") from None
        raise
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await renewer
        if not lost.is_set():
            try:
                await release(engine, name, holder)
            except Exception:  # noqa: BLE001 - it expires by itself
                logger.warning("could not release lease %s; it expires within %g s", name, seconds)


class LeaseLost(Exception):
    """The lease could not be renewed in time: the work under it was stopped, another process may take over."""


async def _keep(engine: AsyncEngine, name: str, holder: str, seconds: float, task: asyncio.Task[Any] | None,
                lost: asyncio.Event) -> None:
    renewed = time.monotonic()
    while True:
        await asyncio.sleep(seconds / 3)
        try:
            if await renew(engine, name, holder, seconds):
                renewed = time.monotonic()
                continue
            reason = "another process took it"
        except Exception as error:  # noqa: BLE001 - the database may come back before the lease expires
            if time.monotonic() - renewed < seconds * 0.8:
                logger.warning("could not renew lease %s (%s); retrying", name, type(error).__name__)
                continue
            reason = f"the database did not answer ({type(error).__name__})"
        logger.error("lost lease %s: %s; stopping the work it covered", name, reason)
        lost.set()
        if task is not None:
            task.cancel()
        return
