"""The SQL of split first syncs (table `sync_parts`, migration 0020; the workflow is knowledge.ingest.split).

While a source's first sync is split into parts, every document a part writes carries its access list masked
(each principal prefixed with PENDING, which no asker ever holds), so no search, answer or document lookup shows a
half-finished index; `publish` unmasks the whole source in one transaction once every part is done. A search sees
the source either not at all or whole, the same rule as a document that is either fully old or fully new.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from knowledge.storage.documents import lock_index_for_writing

# Prefixed to every principal of a document written by a part, until the source is published. Askers' principals
# are `everyone`, `user:…`, `group:…`, `domain:…` (knowledge.access): never this.
PENDING = "pending-first-sync:"

_UNMASK = f"ARRAY(SELECT substr(p, {len(PENDING) + 1}) FROM unnest(access) WITH ORDINALITY AS a(p, n) ORDER BY n)"
_MASKED = "EXISTS (SELECT 1 FROM unnest(access) AS a(p) WHERE starts_with(p, :pending))"


def mask(access: Sequence[str]) -> tuple[str, ...]:
    """An access list nobody holds, from which `publish` restores `access` exactly (an empty one stays empty)."""
    return tuple(PENDING + principal for principal in access)


async def planned(conn: AsyncConnection, source_id: int) -> dict[str, bool]:
    """The source's split parts, in order: part → done. Empty when no split sync is under way."""
    rows = await conn.execute(
        text("SELECT part, done_at IS NOT NULL AS done FROM sync_parts WHERE source_id = :s ORDER BY part"),
        {"s": source_id},
    )
    return {row.part: bool(row.done) for row in rows}


async def has_documents(conn: AsyncConnection, source_id: int) -> bool:
    return bool((await conn.execute(
        text("SELECT EXISTS (SELECT 1 FROM documents WHERE source_id = :s)"), {"s": source_id})).scalar_one())


async def plan(conn: AsyncConnection, source_id: int, parts: Sequence[str]) -> None:
    """Record the parts of a split sync (those already recorded are kept, done or not)."""
    await conn.execute(
        text("INSERT INTO sync_parts (source_id, part) SELECT :s, unnest(CAST(:parts AS text[])) "
             "ON CONFLICT DO NOTHING"),
        {"s": source_id, "parts": list(parts)},
    )


async def mark_done(conn: AsyncConnection, source_id: int, part: str) -> None:
    await conn.execute(
        text("UPDATE sync_parts SET done_at = now() WHERE source_id = :s AND part = :p AND done_at IS NULL"),
        {"s": source_id, "p": part},
    )


async def start_helper_run(conn: AsyncConnection, source_id: int, trigger: str) -> int:
    """Record a helper's run of a split sync as running. Unlike sources.start_run it marks no other run interrupted:
    the coordinator's run is live (it holds the source's lease). A helper that dies leaves its run "running"
    until the source's next coordinated run marks it interrupted."""
    return int((await conn.execute(
        text("INSERT INTO sync_runs (source_id, trigger, full_sync) VALUES (:s, :t, false) RETURNING id"),
        {"s": source_id, "t": trigger},
    )).scalar_one())


async def open_split_sources(conn: AsyncConnection) -> list[str]:
    """Names of the sources whose split sync is not published yet: parts to take, or every part done and a
    coordinator needed (the one that planned it may have died)."""
    rows = await conn.execute(
        text("SELECT DISTINCT s.name FROM sync_parts p JOIN sources s ON s.id = p.source_id ORDER BY s.name")
    )
    return [row.name for row in rows]


async def publish(conn: AsyncConnection, source_id: int) -> int:
    """Unmask every document of the source and their chunks, and drop the plan: one transaction, so searches see
    the whole index at once. Returns how many documents were published."""
    await lock_index_for_writing(conn)
    params = {"s": source_id, "pending": PENDING}
    published = await conn.execute(
        text(f"UPDATE documents SET access = {_UNMASK} WHERE source_id = :s AND {_MASKED}"), params
    )
    await conn.execute(text(f"UPDATE chunks SET access = {_UNMASK} WHERE source_id = :s AND {_MASKED}"), params)
    await conn.execute(text("DELETE FROM sync_parts WHERE source_id = :s"), {"s": source_id})
    return int(published.rowcount or 0)
