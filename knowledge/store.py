"""The SQL that writes the index: sources, documents with their chunks, the embedding cache, index metadata.

Replacing a document's chunks happens in one transaction, so a search never sees the document with zero or
doubled chunks. BM25 statistics need no code here: triggers on `chunks` keep them exact (see the migration).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db import locks
from knowledge.errors import SourceConflict

__all__ = ["SourceConflict"]  # re-exported: raised by ensure_source


@dataclass(frozen=True)
class StoredDocument:
    id: int
    content_hash: str
    title: str
    url: str | None
    path: str | None
    author: str | None
    updated_at: datetime | None
    access: tuple[str, ...]
    chunks: int = 0
    version: str | None = None  # the source's cheap version of what was indexed (see Indexer.stored_version)


@dataclass(frozen=True)
class WriteOutcome:
    document_id: int
    outcome: Literal["added", "updated", "metadata_updated", "unchanged"]


@dataclass(frozen=True)
class ChunkRow:
    ordinal: int
    text: str
    heading: str
    token_count: int
    content_hash: str
    embedding: str  # pgvector text form "[0.1,0.2,...]"
    search_text: str


def vector_literal(values: Sequence[float]) -> str:
    return "[" + ",".join(f"{v:.7g}" for v in values) + "]"


async def ensure_source(conn: AsyncConnection, name: str, kind: str, location: str | None) -> int:
    # ON CONFLICT: two first syncs of one source at once must both get its id, not a unique violation.
    inserted = (
        await conn.execute(
            text("INSERT INTO sources (name, kind, location) VALUES (:name, :kind, :location) "
                 "ON CONFLICT (name) DO NOTHING RETURNING id"),
            {"name": name, "kind": kind, "location": location},
        )
    ).scalar()
    if inserted is not None:
        return inserted
    row = (
        await conn.execute(text("SELECT id, kind, location FROM sources WHERE name = :name"), {"name": name})
    ).one()
    if row.kind != kind or (location and row.location and row.location != location):
        raise SourceConflict(name, row.kind, row.location)
    return row.id


async def delete_source(conn: AsyncConnection, name: str) -> tuple[int, int] | None:
    """Delete a source and everything indexed from it. Returns how many (documents, chunks) went, None if there is
    no such source."""
    await lock_index_for_writing(conn)
    source_id = await source_id_by_name(conn, name)
    if source_id is None:
        return None
    documents, chunks = (
        await conn.execute(
            text("SELECT (SELECT count(*) FROM documents WHERE source_id = :s), "
                 "(SELECT count(*) FROM chunks WHERE source_id = :s)"),
            {"s": source_id},
        )
    ).one()
    await conn.execute(text("DELETE FROM sources WHERE id = :s"), {"s": source_id})
    return documents, chunks


async def vacuum_chunks(engine: AsyncEngine) -> None:
    """VACUUM (ANALYZE) the chunks table: removes deleted rows from the HNSW and GIN indexes and refreshes the
    planner's statistics. VACUUM cannot run inside a transaction, hence its own autocommit connection."""
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM (ANALYZE) chunks"))


async def folder_source_roots(conn: AsyncConnection) -> list[tuple[str, str]]:
    rows = await conn.execute(text("SELECT name, location FROM sources WHERE kind = 'folder' AND location IS NOT NULL"))
    return [(r.name, r.location) for r in rows]


async def source_id_by_name(conn: AsyncConnection, name: str) -> int | None:
    return (await conn.execute(text("SELECT id FROM sources WHERE name = :n"), {"n": name})).scalar()


async def stored_documents(conn: AsyncConnection, source_id: int) -> dict[str, StoredDocument]:
    rows = await conn.execute(
        text(
            "SELECT id, external_id, content_hash, title, url, path, author, updated_at, access, version, "
            "(SELECT count(*) FROM chunks c WHERE c.document_id = d.id) AS chunks "
            "FROM documents d WHERE source_id = :s"
        ),
        {"s": source_id},
    )
    return {
        r.external_id: StoredDocument(
            r.id, r.content_hash, r.title, r.url, r.path, r.author, r.updated_at, tuple(r.access), r.chunks,
            r.version,
        )
        for r in rows
    }


async def set_document_version(conn: AsyncConnection, document_id: int, version: str | None) -> None:
    """The content was fetched and found identical: remember the new version so it is not fetched again."""
    await conn.execute(
        text("UPDATE documents SET version = :v WHERE id = :id AND version IS DISTINCT FROM :v"),
        {"v": version, "id": document_id},
    )


async def update_document_metadata(
    conn: AsyncConnection, document_id: int, *, url: str | None, path: str | None, author: str | None,
    updated_at: datetime | None, access: Sequence[str],
) -> bool:
    """Metadata changed but the content did not: no re-chunking, but chunks take the new access list. Returns
    whether anything changed (False when a concurrent sync already wrote the same metadata)."""
    params = {"id": document_id, "url": url, "path": path, "author": author, "updated_at": updated_at,
              "access": list(access)}
    await lock_index_for_writing(conn)
    changed = await conn.execute(
        text(
            "UPDATE documents SET url = :url, path = :path, author = :author, updated_at = :updated_at, "
            "access = :access, indexed_at = now() WHERE id = :id AND (url, path, author, updated_at, access) "
            "IS DISTINCT FROM (CAST(:url AS text), CAST(:path AS text), CAST(:author AS text), "
            "CAST(:updated_at AS timestamptz), CAST(:access AS text[]))"
        ),
        params,
    )
    if changed.rowcount == 0:
        return False
    await conn.execute(
        text("UPDATE chunks SET access = :access, doc_updated_at = :updated_at WHERE document_id = :id"), params
    )
    return True


async def replace_document(
    conn: AsyncConnection, *, source_id: int, external_id: str, title: str, url: str | None, path: str | None,
    author: str | None, updated_at: datetime | None, content_hash: str, access: Sequence[str],
    chunks: Sequence[ChunkRow], text_search_config: str, version: str | None = None,
) -> WriteOutcome:
    """Upsert the document and swap its chunks. Call inside a transaction.

    What happened is decided here, under the writers' lock, not from what the sync read earlier: when two syncs
    of one folder run at once, only the one that really inserted a document reports it added, and the other finds
    the same content already there ("unchanged") instead of rewriting it."""
    await lock_index_for_writing(conn)
    existing = (
        await conn.execute(
            text("SELECT id, content_hash FROM documents WHERE source_id = :s AND external_id = :e"),
            {"s": source_id, "e": external_id},
        )
    ).first()
    if existing is not None and existing.content_hash == content_hash:
        changed = await update_document_metadata(
            conn, existing.id, url=url, path=path, author=author, updated_at=updated_at, access=access
        )
        await set_document_version(conn, existing.id, version)
        return WriteOutcome(existing.id, "metadata_updated" if changed else "unchanged")
    document_id = (
        await conn.execute(
            text(
                """
                INSERT INTO documents (source_id, external_id, title, url, path, author, updated_at, content_hash,
                                       access, version)
                VALUES (:source_id, :external_id, :title, :url, :path, :author, :updated_at, :content_hash, :access,
                        :version)
                ON CONFLICT (source_id, external_id) DO UPDATE SET
                    title = EXCLUDED.title, url = EXCLUDED.url, path = EXCLUDED.path, author = EXCLUDED.author,
                    updated_at = EXCLUDED.updated_at, content_hash = EXCLUDED.content_hash,
                    access = EXCLUDED.access, version = EXCLUDED.version, indexed_at = now()
                RETURNING id
                """
            ),
            {"source_id": source_id, "external_id": external_id, "title": title, "url": url, "path": path,
             "author": author, "updated_at": updated_at, "content_hash": content_hash, "access": list(access),
             "version": version},
        )
    ).scalar_one()
    await conn.execute(text("DELETE FROM chunks WHERE document_id = :id"), {"id": document_id})
    if chunks:
        # One statement for all chunks: the BM25 statistics trigger then runs once per document, not per chunk.
        await conn.execute(
            text(
                """
                INSERT INTO chunks (document_id, ordinal, text, heading, token_count, content_hash, embedding, tsv,
                                    lexical_len, access, source_id, doc_updated_at)
                SELECT :document_id, u.ordinal, u.text, u.heading, u.token_count, u.content_hash,
                       u.embedding::vector, v.tsv, tsvector_length_in_tokens(v.tsv), :access, :source_id,
                       :updated_at
                FROM unnest(CAST(:ordinals AS integer[]), CAST(:texts AS text[]), CAST(:headings AS text[]),
                            CAST(:token_counts AS integer[]), CAST(:hashes AS text[]),
                            CAST(:embeddings AS text[]), CAST(:search_texts AS text[]))
                     AS u(ordinal, text, heading, token_count, content_hash, embedding, search_text)
                CROSS JOIN LATERAL (SELECT to_tsvector(CAST(:config AS regconfig), u.search_text) AS tsv) v
                """
            ),
            {
                "document_id": document_id, "access": list(access), "source_id": source_id,
                "updated_at": updated_at, "config": text_search_config,
                "ordinals": [c.ordinal for c in chunks], "texts": [c.text for c in chunks],
                "headings": [c.heading for c in chunks], "token_counts": [c.token_count for c in chunks],
                "hashes": [c.content_hash for c in chunks], "embeddings": [c.embedding for c in chunks],
                "search_texts": [c.search_text for c in chunks],
            },
        )
    return WriteOutcome(document_id, "added" if existing is None else "updated")


async def lock_index_for_writing(conn: AsyncConnection) -> None:
    """Serialise writers until the transaction ends. The BM25 triggers lock vocabulary rows and the statistics
    row in an order that two concurrent syncs could interleave into a deadlock; one writer at a time cannot.
    Searches never take this lock."""
    await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": locks.INDEX_WRITERS})


async def lock_embedding_space(conn: AsyncConnection) -> None:
    """One process at a time checks or switches the embedding model (until the transaction ends)."""
    await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": locks.EMBEDDING_SPACE})


async def delete_documents_not_in(
    conn: AsyncConnection, source_id: int, keep: Sequence[str], prefix: str = "", protect: Sequence[str] = ()
) -> list[str]:
    """Delete the source's documents under `prefix` (all when "") whose external id is not in `keep`, except those
    under a `protect` prefix (a folder that could not be listed)."""
    await lock_index_for_writing(conn)
    rows = await conn.execute(
        text(
            "DELETE FROM documents WHERE source_id = :s AND left(external_id, length(:prefix)) = :prefix "
            "AND external_id <> ALL(:keep) "
            "AND NOT EXISTS (SELECT 1 FROM unnest(CAST(:protect AS text[])) p "
            "                WHERE left(external_id, length(p)) = p) "
            "RETURNING external_id"
        ),
        {"s": source_id, "keep": list(keep), "prefix": prefix, "protect": list(protect)},
    )
    return sorted(r.external_id for r in rows)


async def delete_documents(conn: AsyncConnection, source_id: int, external_ids: Sequence[str]) -> list[str]:
    """Delete these documents of the source. Returns the ids that were really there (and are now gone)."""
    if not external_ids:
        return []
    await lock_index_for_writing(conn)
    rows = await conn.execute(
        text("DELETE FROM documents WHERE source_id = :s AND external_id = ANY(:ids) RETURNING external_id"),
        {"s": source_id, "ids": list(external_ids)},
    )
    return sorted(r.external_id for r in rows)


async def cached_embeddings(conn: AsyncConnection, model: str, hashes: Sequence[str]) -> dict[str, str]:
    if not hashes:
        return {}
    rows = await conn.execute(
        text(
            "SELECT content_hash, embedding::text AS embedding FROM embedding_cache "
            "WHERE model = :model AND content_hash = ANY(:hashes)"
        ),
        {"model": model, "hashes": list(set(hashes))},
    )
    return {r.content_hash: r.embedding for r in rows}


async def cache_embeddings(conn: AsyncConnection, model: str, entries: dict[str, str]) -> None:
    if not entries:
        return
    await conn.execute(
        text(
            """
            INSERT INTO embedding_cache (model, content_hash, embedding)
            SELECT :model, h, e::vector FROM unnest(CAST(:hashes AS text[]), CAST(:embeddings AS text[])) AS u(h, e)
            ON CONFLICT DO NOTHING
            """
        ),
        {"model": model, "hashes": list(entries), "embeddings": list(entries.values())},
    )


async def mark_source_synced(conn: AsyncConnection, source_id: int) -> None:
    await conn.execute(text("UPDATE sources SET last_synced_at = now() WHERE id = :s"), {"s": source_id})


async def get_meta(conn: AsyncConnection, key: str) -> str | None:
    return (await conn.execute(text("SELECT value FROM kb_meta WHERE key = :k"), {"k": key})).scalar()


async def set_meta(conn: AsyncConnection, key: str, value: str) -> None:
    await conn.execute(
        text("INSERT INTO kb_meta (key, value) VALUES (:k, :v) ON CONFLICT (key) DO UPDATE SET value = :v"),
        {"k": key, "v": value},
    )


def vector_index_name(dimension: int) -> str:
    return f"chunks_embedding_hnsw_{dimension}"


async def drop_vector_indexes(conn: AsyncConnection, keep: str | None = None) -> None:
    existing = await conn.execute(
        text("SELECT indexname FROM pg_indexes WHERE tablename = 'chunks' AND indexname LIKE 'chunks_embedding_hnsw_%'")
    )
    for (name,) in existing.all():
        if name != keep:
            await conn.execute(text(f'DROP INDEX IF EXISTS "{name}"'))


async def ensure_vector_index(conn: AsyncConnection, dimension: int) -> None:
    """The HNSW index is an expression index on `embedding::vector(dim)`, so one untyped column can serve any
    model; indexes built for another dimension are dropped."""
    await drop_vector_indexes(conn, keep=vector_index_name(dimension))
    await conn.execute(
        text(
            f"CREATE INDEX IF NOT EXISTS {vector_index_name(dimension)} ON chunks "
            f"USING hnsw ((embedding::vector({int(dimension)})) vector_cosine_ops)"
        )
    )


async def chunks_for_reembedding(conn: AsyncConnection, after_id: int, limit: int) -> list[tuple[int, str, str, str]]:
    rows = await conn.execute(
        text(
            "SELECT c.id, d.title, c.heading, c.text FROM chunks c JOIN documents d ON d.id = c.document_id "
            "WHERE c.id > :after ORDER BY c.id LIMIT :limit"
        ),
        {"after": after_id, "limit": limit},
    )
    return [(r.id, r.title, r.heading, r.text) for r in rows]


async def set_chunk_embeddings(conn: AsyncConnection, ids: Sequence[int], embeddings: Sequence[str]) -> None:
    await conn.execute(
        text(
            "UPDATE chunks c SET embedding = u.e::vector "
            "FROM unnest(CAST(:ids AS bigint[]), CAST(:es AS text[])) AS u(id, e) WHERE c.id = u.id"
        ),
        {"ids": list(ids), "es": list(embeddings)},
    )


async def source_names(conn: AsyncConnection) -> list[str]:
    return list((await conn.execute(text("SELECT name FROM sources ORDER BY name"))).scalars())


@dataclass(frozen=True)
class SourceCounts:
    name: str
    kind: str
    location: str | None
    documents: int
    chunks: int
    last_synced_at: datetime | None


@dataclass(frozen=True)
class IndexCounts:
    documents: int
    chunks: int
    total_length: int
    vocabulary: int
    embedding_model: str | None
    embedding_dimension: str | None


async def source_counts(conn: AsyncConnection) -> list[SourceCounts]:
    rows = await conn.execute(
        text(
            """
            SELECT s.name, s.kind, s.location, s.last_synced_at,
                   (SELECT count(*) FROM documents d WHERE d.source_id = s.id) AS documents,
                   (SELECT count(*) FROM chunks c WHERE c.source_id = s.id) AS chunks
            FROM sources s ORDER BY s.name
            """
        )
    )
    return [SourceCounts(r.name, r.kind, r.location, r.documents, r.chunks, r.last_synced_at) for r in rows]


async def index_counts(conn: AsyncConnection) -> IndexCounts:
    row = (
        await conn.execute(
            text(
                "SELECT n_chunks, total_len, (SELECT count(*) FROM lexemes WHERE df > 0) AS vocabulary, "
                "(SELECT count(*) FROM documents) AS documents, "
                "(SELECT value FROM kb_meta WHERE key = 'embedding_model') AS model, "
                "(SELECT value FROM kb_meta WHERE key = 'embedding_dimension') AS dimension "
                "FROM corpus_stats WHERE id = 1"
            )
        )
    ).one()
    return IndexCounts(row.documents, row.n_chunks, row.total_len, row.vocabulary, row.model, row.dimension)
