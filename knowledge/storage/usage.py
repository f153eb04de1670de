"""The SQL behind document usage reports: which documents chunks belong to, and which documents were never cited.

Read by the gaps report (`ragbot insights`, `/kb gaps`, the admin page) through `KnowledgeBase`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True)
class DocumentRef:
    id: int
    title: str
    source: str
    url: str | None
    path: str | None
    updated_at: datetime | None
    access: tuple[str, ...] = ()  # principals that may see it

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "title": self.title, "source": self.source, "url": self.url, "path": self.path,
                "updated_at": self.updated_at.isoformat() if self.updated_at else None}


_COLUMNS = "d.id, d.title, s.name AS source, d.url, d.path, d.updated_at, d.access"


def _ref(r: Row[Any]) -> DocumentRef:
    return DocumentRef(r.id, r.title, r.source, r.url, r.path, r.updated_at, tuple(r.access or ()))


async def documents_of_chunks(conn: AsyncConnection, chunk_ids: Sequence[int]) -> dict[int, DocumentRef]:
    """chunk id → its document, for the chunks that still exist."""
    if not chunk_ids:
        return {}
    rows = await conn.execute(
        text(
            f"SELECT c.id AS chunk_id, {_COLUMNS} FROM chunks c JOIN documents d ON d.id = c.document_id "
            "JOIN sources s ON s.id = d.source_id WHERE c.id = ANY(CAST(:ids AS bigint[]))"
        ),
        {"ids": list(chunk_ids)},
    )
    return {int(r.chunk_id): _ref(r) for r in rows}


async def documents_not_in(conn: AsyncConnection, document_ids: Sequence[int], limit: int) -> tuple[int, list[DocumentRef]]:
    """How many documents are not among `document_ids`, and the first `limit` of them (oldest update first)."""
    params = {"ids": list(document_ids), "limit": limit}
    total = (
        await conn.execute(text("SELECT count(*) FROM documents WHERE NOT (id = ANY(CAST(:ids AS bigint[])))"), params)
    ).scalar_one()
    rows = await conn.execute(
        text(
            f"SELECT {_COLUMNS} FROM documents d JOIN sources s ON s.id = d.source_id "
            "WHERE NOT (d.id = ANY(CAST(:ids AS bigint[]))) ORDER BY d.updated_at NULLS FIRST, d.id LIMIT :limit"
        ),
        params,
    )
    return int(total), [_ref(r) for r in rows]
