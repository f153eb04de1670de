"""The SQL of group directories (issue 33): who is in which group, per source, and how fresh that is.

A refresh replaces a source's edges in one transaction under a per-source advisory lock (two replicas refreshing
at once serialise instead of interleaving their deletes and inserts). A failed refresh only records its error:
the last good membership stays, and the resolver (knowledge.access) stops trusting it one TTL after
`refreshed_at`. A refresh that could not list some groups (`kept`) keeps those groups' previous edges with the
time they were last listed (`directory_members.refreshed_at`; NULL means "with the directory"), so only those
groups expire, one TTL after that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from db import locks


@dataclass(frozen=True)
class DirectoryState:
    source_id: int
    source: str
    kind: str
    refreshed_at: datetime | None
    attempted_at: datetime | None
    error: str | None
    groups: int
    memberships: int
    api_calls: int
    domains: tuple[str, ...]
    generation: int
    skipped: tuple[str, ...] = ()  # groups the last refresh could not list, with why (they keep their last members)


@dataclass(frozen=True)
class Edge:
    """`member` is directly in `group`; `refreshed_at` set when the group's members were last listed before the
    directory's last refresh (a group that refresh skipped), None when listed by it."""

    group: str
    member: str
    refreshed_at: datetime | None = None


_STATE = (
    "d.source_id, s.name AS source, s.kind, d.refreshed_at, d.attempted_at, d.error, d.groups, d.memberships, "
    "d.api_calls, d.domains, d.generation, d.skipped"
)


def _state(row: Any) -> DirectoryState:
    return DirectoryState(row.source_id, row.source, row.kind, row.refreshed_at, row.attempted_at, row.error,
                          row.groups, row.memberships, row.api_calls, tuple(row.domains or ()), row.generation,
                          tuple(row.skipped or ()))


async def replace_membership(
    conn: AsyncConnection, source_id: int, edges: Iterable[tuple[str, str]], *, domains: Sequence[str] = (),
    api_calls: int = 0, kept: Sequence[str] = (), skipped: Sequence[str] = (),
) -> DirectoryState:
    """Store a successful refresh: exactly these (group principal, member) edges, refreshed now, plus the previous
    edges of the `kept` groups (which this refresh could not list; `skipped` says why), stamped with when they were
    last listed so that they expire on their own."""
    await conn.execute(text("SELECT pg_advisory_xact_lock(:k, :s)"),
                       {"k": locks.DIRECTORY_REFRESH_CLASS, "s": source_id})
    kept_groups = sorted(set(kept))
    unique = sorted(set(edges) - {e for e in set(edges) if e[0] in kept_groups})
    if kept_groups:
        await conn.execute(
            text(
                "UPDATE directory_members m SET refreshed_at = coalesce(m.refreshed_at, d.refreshed_at) "
                "FROM directory_state d WHERE d.source_id = m.source_id AND m.source_id = :s "
                "AND m.group_principal = ANY(CAST(:kept AS text[]))"
            ),
            {"s": source_id, "kept": kept_groups},
        )
    await conn.execute(
        text("DELETE FROM directory_members WHERE source_id = :s AND NOT (group_principal = ANY(CAST(:kept AS text[])) "
             "AND refreshed_at IS NOT NULL)"),
        {"s": source_id, "kept": kept_groups},
    )
    if unique:
        await conn.execute(
            text(
                "INSERT INTO directory_members (source_id, group_principal, member) "
                "SELECT :s, g, m FROM unnest(CAST(:groups AS text[]), CAST(:members AS text[])) AS u(g, m)"
            ),
            {"s": source_id, "groups": [g for g, _ in unique], "members": [m for _, m in unique]},
        )
    row = (
        await conn.execute(
            text(
                """
                INSERT INTO directory_state (source_id, refreshed_at, attempted_at, error, groups, memberships,
                                             api_calls, domains, generation, skipped)
                SELECT :s, now(), now(), NULL, count(DISTINCT group_principal), count(*), :calls,
                       CAST(:domains AS text[]), 1, CAST(:skipped AS text[])
                FROM directory_members WHERE source_id = :s
                ON CONFLICT (source_id) DO UPDATE SET refreshed_at = now(), attempted_at = now(), error = NULL,
                    groups = EXCLUDED.groups, memberships = EXCLUDED.memberships, api_calls = EXCLUDED.api_calls,
                    domains = EXCLUDED.domains, generation = directory_state.generation + 1,
                    skipped = EXCLUDED.skipped
                RETURNING source_id
                """
            ),
            {"s": source_id, "calls": api_calls, "domains": sorted(set(domains)), "skipped": list(skipped)},
        )
    ).scalar_one()
    states = await list_states(conn, row)
    return states[0]


async def record_failure(conn: AsyncConnection, source_id: int, error: str) -> None:
    """A refresh that failed: the stored membership is kept (its `refreshed_at` does not move)."""
    await conn.execute(
        text(
            """
            INSERT INTO directory_state (source_id, attempted_at, error) VALUES (:s, now(), :e)
            ON CONFLICT (source_id) DO UPDATE SET attempted_at = now(), error = EXCLUDED.error,
                generation = directory_state.generation + 1
            """
        ),
        {"s": source_id, "e": error[:2000]},
    )


async def list_states(conn: AsyncConnection, source_id: int | None = None) -> list[DirectoryState]:
    rows = await conn.execute(
        text(
            f"SELECT {_STATE} FROM directory_state d JOIN sources s ON s.id = d.source_id "
            "WHERE CAST(:s AS integer) IS NULL OR d.source_id = :s ORDER BY s.name"
        ),
        {"s": source_id},
    )
    return [_state(r) for r in rows]


async def generations(conn: AsyncConnection) -> dict[int, int]:
    """source id → generation: one cheap read that tells the resolver whether any directory changed."""
    rows = await conn.execute(text("SELECT source_id, generation FROM directory_state"))
    return {r.source_id: r.generation for r in rows}


async def load_edges(conn: AsyncConnection) -> dict[int, list[Edge]]:
    """Every source's edges."""
    rows = await conn.execute(text("SELECT source_id, group_principal, member, refreshed_at FROM directory_members"))
    edges: dict[int, list[Edge]] = {}
    for r in rows:
        edges.setdefault(r.source_id, []).append(Edge(r.group_principal, r.member, r.refreshed_at))
    return edges


async def document_group_principals(conn: AsyncConnection, source_id: int) -> list[str]:
    """The `group:` principals the source's indexed documents carry (the groups whose members matter)."""
    rows = await conn.execute(
        text(
            "SELECT DISTINCT p FROM documents d, unnest(d.access) AS p "
            "WHERE d.source_id = :s AND p LIKE 'group:%' ORDER BY p"
        ),
        {"s": source_id},
    )
    return [r.p for r in rows]


@dataclass(frozen=True)
class DocumentAccess:
    source: str
    external_id: str
    title: str | None
    url: str | None
    path: str | None
    access: tuple[str, ...]


def like_literal(value: str) -> str:
    """`value` matched literally inside a LIKE/ILIKE pattern (ESCAPE '\\'): `%`, `_` and `\\` lose their meaning, so
    `/kb access @me %` names no document instead of every one."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def find_documents(
    conn: AsyncConnection, ref: str, limit: int = 10, *, visible_to: Sequence[str] | None = None,
) -> list[DocumentAccess]:
    """Documents named by `ref`: an exact external id, URL or `SOURCE:EXTERNAL_ID`, else an exact title, else a
    title containing it (case-insensitive, `ref` taken literally). `visible_to`: only documents these principals
    may see (a chat admin's own access): a title they may not read is never named to them, however they ask."""
    params: dict[str, object] = {"ref": ref, "like": like_literal(ref), "n": limit}
    visible = ""
    if visible_to is not None:
        visible = " AND d.access && CAST(:visible AS text[])"
        params["visible"] = list(visible_to)
    queries = (
        "d.external_id = :ref OR d.url = :ref OR s.name || ':' || d.external_id = :ref",
        "lower(d.title) = lower(:ref)",
        "d.title ILIKE '%' || :like || '%' ESCAPE '\\'",
    )
    for where in queries:
        rows = (
            await conn.execute(
                text(
                    "SELECT s.name AS source, d.external_id, d.title, d.url, d.path, d.access FROM documents d "
                    f"JOIN sources s ON s.id = d.source_id WHERE ({where}){visible} "
                    "ORDER BY s.name, d.external_id LIMIT :n"
                ),
                params,
            )
        ).all()
        if rows:
            return [DocumentAccess(r.source, r.external_id, r.title, r.url, r.path, tuple(r.access or ()))
                    for r in rows]
    return []
