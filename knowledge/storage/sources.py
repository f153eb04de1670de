"""The SQL of stored sources, their checkpoints and sync runs.

One sync at a time per source is a lease (db.leases, `source:ID`), a row renewed while the run goes on: two
processes on one database, on any hosts and through a transaction-mode pooler, never sync the same source at once,
and a process that dies hands the source over once its lease expires. The unexpired leases tell which runs are live.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from db import leases

# --- sync runs: what is recorded and shown -------------------------------------------------------------------

Trigger = Literal["schedule", "cli", "chat"]
RunStatus = Literal["running", "ok", "failed", "interrupted"]


@dataclass(frozen=True)
class SyncRun:
    """One recorded sync run (table `sync_runs`). `status` is "running" while a process holds the source's lease,
    "interrupted" when the process died mid-run (found by the next run), else "ok" or "failed" (with `error`)."""

    id: int
    source: str
    trigger: str
    status: str
    started_at: datetime
    finished_at: datetime | None
    added: int
    updated: int
    deleted: int
    unchanged: int
    skipped: int
    failed: int
    pruned: bool
    error: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id, "source": self.source, "trigger": self.trigger, "status": self.status,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "added": self.added, "updated": self.updated, "deleted": self.deleted, "unchanged": self.unchanged,
            "skipped": self.skipped, "failed": self.failed, "pruned": self.pruned, "error": self.error,
        }


@dataclass(frozen=True)
class StoredSource:
    id: int
    name: str
    kind: str
    location: str | None
    config: dict[str, Any]
    checkpoint: str | None
    schedule_seconds: int | None
    prune_seconds: int | None
    last_pruned_at: datetime | None
    last_synced_at: datetime | None


_SOURCE_COLUMNS = (
    "id, name, kind, location, config, checkpoint, schedule_seconds, prune_seconds, last_pruned_at, last_synced_at"
)


def _source(row: Any) -> StoredSource:
    config = row.config if isinstance(row.config, dict) else json.loads(row.config or "{}")
    return StoredSource(row.id, row.name, row.kind, row.location, config, row.checkpoint, row.schedule_seconds,
                        row.prune_seconds, row.last_pruned_at, row.last_synced_at)


async def get_source(conn: AsyncConnection, name: str) -> StoredSource | None:
    row = (await conn.execute(text(f"SELECT {_SOURCE_COLUMNS} FROM sources WHERE name = :n"), {"n": name})).first()
    return _source(row) if row else None


async def list_sources(conn: AsyncConnection) -> list[StoredSource]:
    rows = await conn.execute(text(f"SELECT {_SOURCE_COLUMNS} FROM sources ORDER BY name"))
    return [_source(r) for r in rows]


async def save_source(
    conn: AsyncConnection, *, name: str, kind: str, location: str | None, config: dict[str, Any],
    schedule_seconds: int | None, prune_seconds: int | None,
) -> int:
    """Insert a source, or update the settings of an existing one of the same kind (its index is kept). A new
    source counts as just pruned: its first sync lists everything anyway."""
    row = await conn.execute(
        text(
            """
            INSERT INTO sources (name, kind, location, config, schedule_seconds, prune_seconds, last_pruned_at)
            VALUES (:name, :kind, :location, CAST(:config AS jsonb), :schedule, :prune, now())
            ON CONFLICT (name) DO UPDATE SET location = EXCLUDED.location, config = EXCLUDED.config,
                schedule_seconds = EXCLUDED.schedule_seconds, prune_seconds = EXCLUDED.prune_seconds
            WHERE sources.kind = EXCLUDED.kind
            RETURNING id
            """
        ),
        {"name": name, "kind": kind, "location": location, "config": json.dumps(config),
         "schedule": schedule_seconds, "prune": prune_seconds},
    )
    source_id = row.scalar()
    if source_id is None:
        raise ValueError(f"source {name!r} already exists with another kind; pick another name")
    return int(source_id)


async def ensure_folder_config(conn: AsyncConnection, source_id: int, root: str) -> None:
    """A folder indexed with `ragbot ingest` becomes a stored source `ragbot sync NAME` can rebuild."""
    await conn.execute(
        text(
            "UPDATE sources SET config = jsonb_build_object('path', CAST(:root AS text)) "
            "WHERE id = :s AND kind = 'folder' AND config = '{}'::jsonb"
        ),
        {"s": source_id, "root": root},
    )


async def save_checkpoint(conn: AsyncConnection, source_id: int, checkpoint: str) -> None:
    await conn.execute(text("UPDATE sources SET checkpoint = :c WHERE id = :s"), {"c": checkpoint, "s": source_id})


async def mark_pruned(conn: AsyncConnection, source_id: int) -> None:
    await conn.execute(text("UPDATE sources SET last_pruned_at = now() WHERE id = :s"), {"s": source_id})


# --- the per-source lease (db.leases) --------------------------------------------------------------------------


async def syncing_source_ids(conn: AsyncConnection) -> set[int]:
    """Sources some process is syncing right now (it holds the source's unexpired lease)."""
    return {int(name.removeprefix(leases.SOURCE_SYNC)) for name in await leases.held(conn, leases.SOURCE_SYNC)}


# --- sync runs -----------------------------------------------------------------------------------------------

_RUN_COLUMNS = (
    "r.id, s.name AS source, r.trigger, r.status, r.started_at, r.finished_at, r.added, r.updated, "
    "r.metadata_updated, r.deleted, r.unchanged, r.skipped, r.failed, r.pruned, r.error"
)


def _run(row: Any) -> SyncRun:
    return SyncRun(row.id, row.source, row.trigger, row.status, row.started_at, row.finished_at, row.added,
                   row.updated + row.metadata_updated, row.deleted, row.unchanged, row.skipped, row.failed,
                   row.pruned, row.error)


async def ran_within(conn: AsyncConnection, source_id: int, trigger: str, seconds: float, *, pruned: bool) -> bool:
    """Whether a run of this source with this trigger (a pruning one, if `pruned`) started in the last `seconds`,
    by the database's clock (replicas' clocks may differ). Runs whose process died (still "running" or
    "interrupted") do not count: their work is not done. Call while holding the source's lease."""
    return bool((await conn.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM sync_runs WHERE source_id = :s AND trigger = :t "
            "AND status NOT IN ('running', 'interrupted') AND (pruned OR NOT :p) "
            "AND started_at > now() - make_interval(secs => :g))"
        ),
        {"s": source_id, "t": trigger, "p": pruned, "g": seconds},
    )).scalar_one())


async def start_run(conn: AsyncConnection, source_id: int, trigger: str, full: bool) -> int:
    """Record a run as running. Call while holding the source's lease: any other "running" row of this source is
    then a run whose process died, and is marked interrupted."""
    await conn.execute(
        text(
            "UPDATE sync_runs SET status = 'interrupted', finished_at = coalesce(finished_at, now()), "
            "error = coalesce(error, 'the process stopped before the run finished; this run resumed from its "
            "last checkpoint') WHERE source_id = :s AND status = 'running'"
        ),
        {"s": source_id},
    )
    return int((
        await conn.execute(
            text("INSERT INTO sync_runs (source_id, trigger, full_sync) VALUES (:s, :t, :f) RETURNING id"),
            {"s": source_id, "t": trigger, "f": full},
        )
    ).scalar_one())


async def finish_run(
    conn: AsyncConnection, run_id: int, *, status: str, counts: dict[str, int], pruned: bool, error: str | None,
    details: dict[str, Any] | None,
) -> None:
    await conn.execute(
        text(
            """
            UPDATE sync_runs SET status = :status, finished_at = now(), added = :added, updated = :updated,
                metadata_updated = :metadata_updated, deleted = :deleted, unchanged = :unchanged,
                skipped = :skipped, failed = :failed, pruned = :pruned, error = :error,
                details = CAST(:details AS jsonb)
            WHERE id = :id
            """
        ),
        {"id": run_id, "status": status, "pruned": pruned, "error": error,
         "details": json.dumps(details) if details is not None else None, **counts},
    )


async def save_run_counts(conn: AsyncConnection, run_id: int, counts: dict[str, int]) -> None:
    """What a running run has committed so far, so a run whose process is killed is listed with its work, not as
    "no changes" (the status stays "running" until it ends or the next run marks it interrupted)."""
    await conn.execute(
        text(
            "UPDATE sync_runs SET added = :added, updated = :updated, metadata_updated = :metadata_updated, "
            "deleted = :deleted, unchanged = :unchanged, skipped = :skipped, failed = :failed "
            "WHERE id = :id AND status = 'running'"
        ),
        {"id": run_id, **counts},
    )


async def list_runs(conn: AsyncConnection, source: str | None = None, limit: int = 20) -> list[SyncRun]:
    rows = await conn.execute(
        text(
            f"SELECT {_RUN_COLUMNS} FROM sync_runs r JOIN sources s ON s.id = r.source_id "
            "WHERE (CAST(:name AS text) IS NULL OR s.name = :name) ORDER BY r.started_at DESC, r.id DESC LIMIT :n"
        ),
        {"name": source, "n": limit},
    )
    return [_run(r) for r in rows]


async def last_runs(conn: AsyncConnection) -> dict[str, SyncRun]:
    """The newest run of every source, by source name."""
    rows = await conn.execute(
        text(
            f"SELECT DISTINCT ON (r.source_id) {_RUN_COLUMNS} FROM sync_runs r JOIN sources s ON s.id = r.source_id "
            "ORDER BY r.source_id, r.started_at DESC, r.id DESC"
        )
    )
    return {r.source: _run(r) for r in rows}


async def document_counts(conn: AsyncConnection) -> dict[int, int]:
    rows = await conn.execute(text("SELECT source_id, count(*) AS n FROM documents GROUP BY source_id"))
    return {r.source_id: r.n for r in rows}


