"""The SQL that writes the index: sources, documents with their chunks, the embedding cache, index metadata.

Replacing a document's chunks happens in one transaction, so a search never sees the document with zero or
doubled chunks. BM25 statistics need little code here: triggers on `chunks` keep them exact (see the migrations),
and several writers may write at once (`write_documents`, migration 0009).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db import leases, locks
from db.engine import BinaryArray
from db.models import BM25_SPARSE_DIM
from knowledge.errors import SourceConflict
from knowledge.storage.sources import SyncRun
from knowledge.storage.words import lexical_text

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
    embedding: np.ndarray  # float32, sent to Postgres as a binary vector (see db.engine)
    search_text: str


def as_vector(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """An embedding as the store takes it: a float32 NumPy array, which psycopg sends as a binary `vector`."""
    return np.asarray(values, dtype=np.float32)


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
        return int(inserted)
    row = (
        await conn.execute(text("SELECT id, kind, location FROM sources WHERE name = :name"), {"name": name})
    ).one()
    if row.kind != kind or (location and row.location and row.location != location):
        raise SourceConflict(name, row.kind, row.location)
    return int(row.id)


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
    # Its chunks went with it (the cascade, counted out of the BM25 statistics by the delete trigger): its emptied
    # partition (migration 0019) goes too. Dropping a partition locks `chunks` until this transaction commits.
    await conn.execute(text(f"DROP TABLE IF EXISTS {partition_name(source_id)}"))
    return documents, chunks


def partition_name(source_id: int) -> str:
    """The partition of `chunks` that holds a source's chunks (migration 0019: created with the source)."""
    return f"chunks_p{int(source_id)}"


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
    await lock_index_for_writing(conn)
    return await _update_metadata(conn, document_id, url=url, path=path, author=author, updated_at=updated_at,
                                  access=access)


async def _update_metadata(
    conn: AsyncConnection, document_id: int, *, url: str | None, path: str | None, author: str | None,
    updated_at: datetime | None, access: Sequence[str],
) -> bool:
    params = {"id": document_id, "url": url, "path": path, "author": author, "updated_at": updated_at,
              "access": list(access)}
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


@dataclass(frozen=True)
class DocumentWrite:
    """One document to upsert with its complete list of chunks (see `write_documents`)."""

    external_id: str
    title: str
    url: str | None
    path: str | None
    author: str | None
    updated_at: datetime | None
    content_hash: str
    access: Sequence[str]
    chunks: Sequence[ChunkRow]
    version: str | None = None  # the source's cheap version of what was indexed


async def write_documents(
    engine: AsyncEngine, source_id: int, documents: Sequence[DocumentWrite], text_search_config: str
) -> list[WriteOutcome]:
    """Upsert documents and swap their chunks, a whole batch in one transaction (after a short one that adds new
    words to the vocabulary): a search sees each document with its old chunks or its new ones, never none or both.

    Several calls may run at once on different connections (the indexer runs STORE_WRITERS of them): each holds the
    writers' lock shared and a lock per document, so they queue only on a document both write and, at the end, on
    the statistics row (migration 0009). The expensive part, tokenising and inserting into the GIN and HNSW
    indexes, runs side by side.

    What happened is decided here, under the documents' locks, not from what the sync read earlier: when two syncs
    of one folder run at once, only the one that really inserted a document reports it added, and the other finds
    the same content already there ("unchanged") instead of rewriting it.

    Why batches: per statement, Postgres' fixed costs (a round trip, planning, the BM25 statistics trigger) are
    larger than the work for one small document; `bench/ingest.py` measures the store path."""
    if not documents:
        return []
    ids = [d.external_id for d in documents]
    if len(set(ids)) != len(ids):
        raise ValueError("a batch of document writes names one document twice")
    search_texts = [c.search_text for d in documents for c in d.chunks]
    tsvectors: list[str] = []
    if search_texts:
        async with engine.begin() as conn:
            tsvectors = await _tokenise_adding_new_words(conn, search_texts, text_search_config)
    chunk_tsvectors: dict[str, list[str]] = {}  # each document's, in the order of its chunks
    start = 0
    for d in documents:
        chunk_tsvectors[d.external_id] = tsvectors[start : start + len(d.chunks)]
        start += len(d.chunks)
    async with engine.begin() as conn:
        await _lock_documents_for_writing(conn, source_id, ids)
        existing = {
            r.external_id: r
            for r in await conn.execute(
                text("SELECT id, external_id, content_hash FROM documents "
                     "WHERE source_id = :s AND external_id = ANY(:e)"),
                {"s": source_id, "e": ids},
            )
        }
        outcomes: dict[str, WriteOutcome] = {}
        to_write = []
        for d in documents:
            old = existing.get(d.external_id)
            if old is not None and old.content_hash == d.content_hash:
                changed = await _update_metadata(
                    conn, old.id, url=d.url, path=d.path, author=d.author, updated_at=d.updated_at, access=d.access
                )
                await set_document_version(conn, old.id, d.version)
                outcomes[d.external_id] = WriteOutcome(old.id, "metadata_updated" if changed else "unchanged")
            else:
                to_write.append(d)
        if to_write:
            document_ids = await _upsert_documents(conn, source_id, to_write)
            replaced = [document_ids[d.external_id] for d in to_write if d.external_id in existing]
            old_chunks = list((await conn.execute(
                text("SELECT id FROM chunks WHERE document_id = ANY(:ids) AND source_id = :s"),
                {"ids": replaced, "s": source_id}
            )).scalars()) if replaced else []
            await _insert_chunks(conn, source_id, [
                (document_ids[d.external_id], d.chunks, chunk_tsvectors[d.external_id]) for d in to_write
            ])
            # After the insert, not before: the delete trigger takes the statistics row, on which concurrent writers
            # queue, so deleting first would make this insert wait for the other writers' commits.
            if old_chunks:
                # by source too: only its partition is read (migration 0019)
                await conn.execute(text("DELETE FROM chunks WHERE id = ANY(:ids) AND source_id = :s"),
                                   {"ids": old_chunks, "s": source_id})
            for d in to_write:
                outcomes[d.external_id] = WriteOutcome(
                    document_ids[d.external_id], "added" if d.external_id not in existing else "updated"
                )
    return [outcomes[d.external_id] for d in documents]


async def _lock_documents_for_writing(conn: AsyncConnection, source_id: int, external_ids: Sequence[str]) -> None:
    """The writers' lock, shared, then each document's lock in one order (sorted keys), so two writers that share
    documents wait for each other instead of deadlocking. Held until the transaction ends."""
    await conn.execute(text("SELECT pg_advisory_xact_lock_shared(:key)"), {"key": locks.INDEX_WRITERS})
    await conn.execute(
        text(
            "SELECT pg_advisory_xact_lock(:class, k) FROM ("
            "  SELECT DISTINCT hashtext(CAST(:s AS text) || '/' || e) AS k FROM unnest(CAST(:e AS text[])) e"
            "  ORDER BY 1) keys"
        ),
        {"class": locks.DOCUMENT_WRITE_CLASS, "s": source_id, "e": list(external_ids)},
    )


# Each chunk's text tokenised (its tsvector, returned as text for the write's INSERT, which so tokenises nothing), and
# the batch's new words added to the vocabulary (df 0), in a short transaction before the write: the write's INSERT
# then only reads lexeme ids, and holds no vocabulary row while it inserts into the indexes (migration 0009). Words
# already there are filtered out by an ordinary read first, so the upsert touches only new rows, in sorted order:
# two writers adding the same new word wait a moment for each other instead of deadlocking. A word added here for a
# write that then fails stays with df 0, which searches ignore.
_TOKENISE_ADDING_NEW_WORDS = """
WITH v AS MATERIALIZED (
    SELECT x.i, to_tsvector(CAST(:config AS regconfig), x.body) AS tsv
    FROM unnest(CAST(:texts AS text[])) WITH ORDINALITY AS x(body, i)
),
added AS (
    INSERT INTO lexemes (lexeme, df)
    SELECT w.lexeme, 0
    FROM (SELECT DISTINCT t.lexeme FROM v, unnest(tsvector_to_array(v.tsv)) AS t(lexeme)) w
    WHERE NOT EXISTS (SELECT 1 FROM lexemes l WHERE l.lexeme = w.lexeme)
    ORDER BY w.lexeme
    ON CONFLICT (lexeme) DO NOTHING
)
SELECT CAST(tsv AS text) FROM v ORDER BY i
"""


async def _tokenise_adding_new_words(
    conn: AsyncConnection, search_texts: Sequence[str], text_search_config: str
) -> list[str]:
    await conn.execute(text("SET LOCAL work_mem = '64MB'"))
    rows = await conn.execute(text(_TOKENISE_ADDING_NEW_WORDS),
                              {"texts": BinaryArray([lexical_text(t) for t in search_texts]),
                               "config": text_search_config})
    return list(rows.scalars())


async def _upsert_documents(
    conn: AsyncConnection, source_id: int, documents: Sequence[DocumentWrite]
) -> dict[str, int]:
    rows = await conn.execute(
        text(
            """
            INSERT INTO documents (source_id, external_id, title, url, path, author, updated_at, content_hash, access,
                                   version)
            SELECT :source_id, u.external_id, u.title, u.url, u.path, u.author, u.updated_at, u.content_hash,
                   ARRAY(SELECT jsonb_array_elements_text(u.access)), u.version
            FROM unnest(CAST(:external_ids AS text[]), CAST(:titles AS text[]), CAST(:urls AS text[]),
                        CAST(:paths AS text[]), CAST(:authors AS text[]), CAST(:updated AS timestamptz[]),
                        CAST(:hashes AS text[]), CAST(:accesses AS jsonb[]), CAST(:versions AS text[]))
                 AS u(external_id, title, url, path, author, updated_at, content_hash, access, version)
            ON CONFLICT (source_id, external_id) DO UPDATE SET
                title = EXCLUDED.title, url = EXCLUDED.url, path = EXCLUDED.path, author = EXCLUDED.author,
                updated_at = EXCLUDED.updated_at, content_hash = EXCLUDED.content_hash,
                access = EXCLUDED.access, version = EXCLUDED.version, indexed_at = now()
            RETURNING id, external_id
            """
        ),
        {
            "source_id": source_id,
            "external_ids": [d.external_id for d in documents], "titles": [d.title for d in documents],
            "urls": [d.url for d in documents], "paths": [d.path for d in documents],
            "authors": [d.author for d in documents], "updated": [d.updated_at for d in documents],
            "hashes": [d.content_hash for d in documents],
            "accesses": [json.dumps(list(d.access)) for d in documents],
            "versions": [d.version for d in documents],
        },
    )
    return {r.external_id: r.id for r in rows}


# Set (for the transaction) by `write_documents`, which adds its batch's document frequencies itself, right after
# its INSERT (whose statistics trigger has then taken the corpus_stats row): the trigger leaves lexemes alone. Any
# other insert into chunks has it off, and the trigger counts them (migration 0009).
DF_COUNTED_BY_WRITER = "ragbot.df_counted_by_writer"

# The chunks of a batch in one INSERT. Each chunk's BM25 weights are computed right here, from its lexemes and
# the avgdl the index is weighted with, so the row is written once (before migration 0006 a trigger updated every
# new row a second time, which also inserted it a second time into every index). The statement only reads the
# vocabulary (for the lexeme ids of the weights): new words were added before (`_tokenise_adding_new_words`), and
# the statement trigger counts N and the total length at the end, after taking the statistics row (migration 0009);
# the statement returns the batch's document frequencies, which the writer adds after it. So two writers run this
# statement side by side and queue only for its end.
_INSERT_CHUNKS = """
WITH u AS MATERIALIZED (
    SELECT u.*
    FROM unnest(CAST(:document_ids AS bigint[]), CAST(:ordinals AS integer[]), CAST(:texts AS text[]),
                CAST(:headings AS text[]), CAST(:token_counts AS integer[]), CAST(:hashes AS text[]),
                CAST(:embeddings AS vector[]), CAST(CAST(:tsvectors AS text[]) AS tsvector[])) WITH ORDINALITY
         AS u(document_id, ordinal, text, heading, token_count, content_hash, embedding, tsv, i)
),
terms AS MATERIALIZED (
    SELECT u.i, t.lexeme, coalesce(array_length(t.positions, 1), 1)::float8 AS tf
    FROM u, unnest(u.tsv) t
),
lengths AS MATERIALIZED (
    SELECT i, sum(tf)::integer AS len FROM terms GROUP BY i
),
vocabulary AS MATERIALIZED (
    -- The batch's lexemes: their ids (for the weights) and how many of its chunks hold each (their df increments).
    SELECT l.id, l.lexeme, b.n
    FROM (SELECT lexeme, count(*)::integer AS n FROM terms GROUP BY lexeme) b
    JOIN lexemes l ON l.lexeme = b.lexeme
),
s AS (
    SELECT k1, b,
           CASE WHEN weights_avgdl > 0 THEN weights_avgdl
                ELSE (total_len + (SELECT coalesce(sum(len), 0) FROM lengths))::float8
                     / greatest(n_chunks + (SELECT count(*) FROM u), 1) END AS avgdl
    FROM corpus_stats WHERE id = 1
),
weights AS (
    SELECT t.i,
           ('{' || string_agg(v.id || ':' || (t.tf * (s.k1 + 1)
                                              / (t.tf + s.k1 * (1 - s.b + s.b * n.len / greatest(s.avgdl, 1.0)))),
                              ',') || '}/{sparse_dim}')::sparsevec AS bm25  -- sparsevec sorts them
    FROM terms t
    JOIN vocabulary v ON v.lexeme = t.lexeme
    JOIN lengths n ON n.i = t.i
    CROSS JOIN s
    GROUP BY t.i
),
tiers AS (
    -- The lexemes each chunk repeats, by tier of term frequency, as bm25_tf_tiers(tsv) gives them (migration 0010),
    -- from the counts above instead of a second pass over the tsvector.
    SELECT t.i, array_to_tsvector(array_agg(t.lexeme || '#' || bm25_tf_tier(t.tf::integer))) AS tf_tiers
    FROM terms t
    WHERE t.tf >= 2
    GROUP BY t.i
),
inserted AS (
    INSERT INTO chunks (document_id, ordinal, text, heading, token_count, content_hash, embedding, tsv, lexical_len,
                        bm25, bm25_avgdl, tf_tiers, access, source_id, doc_updated_at)
    SELECT u.document_id, u.ordinal, u.text, u.heading, u.token_count, u.content_hash, u.embedding, u.tsv,
           coalesce(n.len, 0), coalesce(w.bm25, '{}/{sparse_dim}'::sparsevec), (SELECT avgdl FROM s),
           coalesce(ti.tf_tiers, ''::tsvector), d.access, :source_id, d.updated_at
    FROM u
    JOIN documents d ON d.id = u.document_id
    LEFT JOIN lengths n ON n.i = u.i
    LEFT JOIN weights w ON w.i = u.i
    LEFT JOIN tiers ti ON ti.i = u.i
)
-- The batch's document frequencies, added to the vocabulary by the writer after this statement (see _insert_chunks).
SELECT array_agg(id) AS ids, array_agg(n) AS counts FROM vocabulary
"""

# After the INSERT, whose statistics trigger took the corpus_stats row: the batch's document frequencies.
_ADD_DOCUMENT_FREQUENCIES = """
UPDATE lexemes l SET df = l.df + c.n
FROM unnest(CAST(:ids AS integer[]), CAST(:counts AS integer[])) AS c(id, n)
WHERE l.id = c.id
"""


async def _insert_chunks(
    conn: AsyncConnection, source_id: int, documents: Sequence[tuple[int, Sequence[ChunkRow], Sequence[str]]]
) -> None:
    """Insert the chunks of (document id, chunks, each chunk's tsvector as text) and count them in the statistics:
    N and the total length by the trigger, which takes the statistics row first, then document frequencies."""
    rows = [(document_id, c, lexemes) for document_id, chunks, tsvectors in documents
            for c, lexemes in zip(chunks, tsvectors, strict=True)]
    if not rows:
        return
    # A batch's (chunk, lexeme) pairs are sorted and grouped in memory rather than spilled to disk.
    await conn.execute(text("SET LOCAL work_mem = '64MB'"))
    # The planner cannot see how large the statement's CTEs are (it guesses 200 lexemes for ~35,000) and joins the
    # terms to the vocabulary by sorting ~230,000 strings; a hash join does the same in about a third of the time.
    await conn.execute(text("SET LOCAL enable_mergejoin = off"))
    await conn.execute(text(f"SELECT set_config('{DF_COUNTED_BY_WRITER}', 'on', true)"))
    counted = (await conn.execute(
        text(_INSERT_CHUNKS.replace("{sparse_dim}", str(BM25_SPARSE_DIM))),
        {
            "source_id": source_id,
            "document_ids": [i for i, _, _ in rows], "ordinals": [c.ordinal for _, c, _ in rows],
            "texts": BinaryArray(c.text for _, c, _ in rows), "headings": BinaryArray(c.heading for _, c, _ in rows),
            "token_counts": [c.token_count for _, c, _ in rows],
            "hashes": BinaryArray(c.content_hash for _, c, _ in rows),
            "embeddings": BinaryArray(c.embedding for _, c, _ in rows),
            "tsvectors": BinaryArray(lexemes for _, _, lexemes in rows),
        },
    )).one()
    if counted.ids:
        await conn.execute(text(_ADD_DOCUMENT_FREQUENCIES), {"ids": counted.ids, "counts": counted.counts})


# Re-weighting after avgdl drift: how far it may drift before chunks are re-weighted, and how many chunks one
# short transaction re-weights.
REWEIGHT_DRIFT = 0.10
REWEIGHT_BATCH = 2000
REWEIGHT_PENDING = "bm25_reweight_pending"  # kb_meta key: "1" from moving the target until every chunk follows it


async def reweight_bm25(engine: AsyncEngine, *, batch: int = REWEIGHT_BATCH, force: bool = False) -> int:
    """When avgdl has drifted more than 10% from the value chunks are weighted with, move the target to the current
    avgdl and re-weight every chunk weighted with another value, `batch` chunks per transaction. Returns how many
    chunks were re-weighted. Each batch takes the writers' lock only for itself, so a sync waits one batch at
    most, and searches meanwhile see weights computed with avgdl values within the drift bound. Idempotent and
    resumable: an interrupted run leaves stale chunks that the next call finishes."""
    async with engine.begin() as conn:
        await lock_index_for_writing(conn)
        s = (await conn.execute(text("SELECT n_chunks, total_len, weights_avgdl FROM corpus_stats WHERE id = 1"))).one()
        if s.n_chunks == 0 or s.total_len == 0:
            return 0
        avgdl = s.total_len / s.n_chunks
        drifted = s.weights_avgdl <= 0 or abs(avgdl - s.weights_avgdl) / s.weights_avgdl > REWEIGHT_DRIFT
        if drifted or force:
            await conn.execute(text("UPDATE corpus_stats SET weights_avgdl = :a WHERE id = 1"), {"a": avgdl})
            await set_meta(conn, REWEIGHT_PENDING, "1")
        elif await get_meta(conn, REWEIGHT_PENDING) != "1":
            return 0  # nothing moved and no earlier run was interrupted: no need to look at the chunks
    reweighted, after = 0, 0
    while True:
        async with engine.begin() as conn:
            await lock_index_for_writing(conn)
            row = (await conn.execute(
                text(
                    """
                    WITH s AS (SELECT weights_avgdl AS avgdl, k1, b FROM corpus_stats WHERE id = 1),
                    todo AS (
                        SELECT c.id FROM chunks c, s WHERE c.id > :after
                        AND c.bm25_avgdl IS DISTINCT FROM s.avgdl ORDER BY c.id LIMIT :batch
                    ),
                    done AS (
                        UPDATE chunks c SET bm25 = bm25_document_vector(c.tsv, c.lexical_len, s.avgdl, s.k1, s.b),
                                            bm25_avgdl = s.avgdl
                        FROM s WHERE c.id IN (SELECT id FROM todo)
                        RETURNING c.id
                    )
                    SELECT count(*) AS n, max(id) AS last FROM done
                    """
                ),
                {"after": after, "batch": batch},
            )).one()
        if not row.n:
            async with engine.begin() as conn:
                await set_meta(conn, REWEIGHT_PENDING, "0")
            return reweighted
        reweighted += row.n
        after = row.last


async def lock_index_for_writing(conn: AsyncConnection) -> None:
    """The index to this transaction alone, until it ends: no chunk writer (`write_documents` holds the lock
    shared) runs beside it. For what changes many chunks or the statistics at once: deleting documents, moving the
    weights' avgdl, starting a bulk load. Searches never take this lock."""
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


async def cached_embeddings(conn: AsyncConnection, model: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
    if not hashes:
        return {}
    rows = await conn.execute(
        text("SELECT content_hash, embedding FROM embedding_cache WHERE model = :model AND content_hash = ANY(:hashes)"),
        {"model": model, "hashes": list(set(hashes))},
    )
    return {r.content_hash: r.embedding.to_numpy() for r in rows}  # a pgvector.Vector (see db.engine)


async def cache_embeddings(conn: AsyncConnection, model: str, entries: dict[str, np.ndarray]) -> None:
    if not entries:
        return
    await conn.execute(
        text(
            """
            INSERT INTO embedding_cache (model, content_hash, embedding)
            SELECT :model, h, e FROM unnest(CAST(:hashes AS text[]), CAST(:embeddings AS vector[])) AS u(h, e)
            ON CONFLICT DO NOTHING
            """
        ),
        {"model": model, "hashes": BinaryArray(entries), "embeddings": BinaryArray(entries.values())},
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
    return f"chunks_embedding_hnsw_half_{dimension}"


async def drop_vector_indexes(conn: AsyncConnection, keep: str | None = None) -> None:
    existing = await conn.execute(
        text("SELECT indexname FROM pg_indexes WHERE tablename = 'chunks' AND indexname LIKE 'chunks_embedding_hnsw_%'")
    )
    for (name,) in existing.all():
        if name != keep:
            await conn.execute(text(f'DROP INDEX IF EXISTS "{name}"'))


def vector_index_sql(dimension: int) -> str:
    """The HNSW index is an expression index on `embedding::halfvec(dim)`, so one untyped column can serve any
    model. The graph holds half-precision vectors while the column keeps full precision for the scores: measured at
    100k chunks (bench/search.py --levers), the index is 43% smaller (112 against 195 MB, so more of it stays in
    memory), builds a little faster (24.8 against 27.8 s) and searches as fast at the same recall@10 (1.0)."""
    return (
        f"CREATE INDEX IF NOT EXISTS {vector_index_name(dimension)} ON chunks "
        f"USING hnsw ((embedding::halfvec({int(dimension)})) halfvec_cosine_ops)"
    )


# Building the HNSW graph in memory is several times faster than spilling it; Postgres' default is 64 MB. The
# half-precision graph takes about 1.2 kB per chunk (112 MB at 100k), so the build gets 1.5 kB per chunk, between
# INDEX_BUILD_MEMORY_MIN_MB and INDEX_BUILD_MEMORY_MAX_MB (1.4 GB for a million chunks, measured: a 492 s build).
# Set for the building transaction only.
INDEX_BUILD_MEMORY_MIN_MB = 512
INDEX_BUILD_MEMORY_MAX_MB = 2048
INDEX_BUILD_BYTES_PER_CHUNK = 1536


def index_build_memory(chunks: int) -> str:
    wanted_mb = chunks * INDEX_BUILD_BYTES_PER_CHUNK // 2**20
    return f"{min(max(INDEX_BUILD_MEMORY_MIN_MB, wanted_mb), INDEX_BUILD_MEMORY_MAX_MB)}MB"


async def vector_index_exists(conn: AsyncConnection, dimension: int) -> bool:
    return bool((await conn.execute(
        text("SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE tablename = 'chunks' AND indexname = :name)"),
        {"name": vector_index_name(dimension)},
    )).scalar())


async def ensure_vector_index(conn: AsyncConnection, dimension: int) -> None:
    """Create the vector index for this dimension; indexes built for another dimension (or the full-precision
    index of databases before migration 0007) are dropped."""
    await drop_vector_indexes(conn, keep=vector_index_name(dimension))
    if await vector_index_exists(conn, dimension):
        return  # CREATE INDEX IF NOT EXISTS would still wait for every writer before finding out
    chunks = (await conn.execute(text("SELECT count(*) FROM chunks"))).scalar_one()
    await conn.execute(text(f"SET LOCAL maintenance_work_mem = '{index_build_memory(chunks)}'"))
    # Postgres gives an index build parallel workers (up to max_parallel_maintenance_workers) only from a table of
    # 8 MB (min_parallel_table_scan_size), about 5,600 chunks; the graph of a smaller first sync is built by one
    # process. Building it with the workers is worth it from far fewer: 5,000 chunks in 1.6–2.0 s against 2.4–2.5.
    await conn.execute(text("SET LOCAL min_parallel_table_scan_size = 0"))
    await conn.execute(text(vector_index_sql(dimension)))


@asynccontextmanager
async def bulk_load(engine: AsyncEngine, lease_seconds: float = 60.0) -> AsyncIterator[bool]:
    """Around a sync: when the index holds no chunks, write them without the HNSW graph and build it once at the
    end. Yields whether it did.

    Why: inserting a chunk into the graph costs about 1.5–3 ms on this machine's CPU, building the graph afterwards
    about 0.3 ms per chunk (bench/ingest.py), and a first sync is the one that writes a whole corpus. Searches in
    the meantime are exact scans (correct, slower). A lease (db.leases, `bulk_load`, renewed while the load goes
    on) marks the load in progress: if the process dies mid-load, its lease expires, and the next sync (this
    function, not loading) finds the graph missing and builds it. A lease rather than a session advisory lock, so
    that it also holds behind a transaction-mode pooler."""
    async with AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(leases.hold(engine, leases.BULK_LOAD, lease_seconds))
        except leases.LeaseBusy:
            yield False  # another process is bulk loading: it builds the graph when it ends
            return
        dimension = await _claim_bulk_load(engine)
        if dimension is None:
            await stack.aclose()
            yield False
            return
        try:
            yield True
        finally:
            async with engine.begin() as conn:
                await ensure_vector_index(conn, dimension)
            async with engine.connect() as conn:  # fresh planner statistics for the searches to come
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text("ANALYZE chunks"))


async def _claim_bulk_load(engine: AsyncEngine) -> int | None:
    """The vector dimension when the index is empty (its graph then dropped); None otherwise, after building a graph
    that a killed load left missing. Call holding the bulk-load lease."""
    async with engine.begin() as conn:
        await lock_index_for_writing(conn)
        dimension = int(await get_meta(conn, "embedding_dimension") or 0)  # set with the model's vector index
        empty = (await conn.execute(text("SELECT NOT EXISTS (SELECT 1 FROM chunks)"))).scalar()
        if dimension and empty:
            # The table first, then its graph: dropping a partitioned index locks each partition's index, and a
            # source being added attaches its partition holding the default one; taking the whole table here first
            # (it is empty, so nothing waits long) orders the two instead of letting them deadlock.
            await conn.execute(text("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE"))
            await drop_vector_indexes(conn)
            return dimension
        if dimension:
            await ensure_vector_index(conn, dimension)  # missing after a load that was killed
    return None


async def chunks_for_reembedding(conn: AsyncConnection, after_id: int, limit: int) -> list[tuple[int, str, str, str]]:
    rows = await conn.execute(
        text(
            "SELECT c.id, d.title, c.heading, c.text FROM chunks c JOIN documents d ON d.id = c.document_id "
            "WHERE c.id > :after ORDER BY c.id LIMIT :limit"
        ),
        {"after": after_id, "limit": limit},
    )
    return [(r.id, r.title, r.heading, r.text) for r in rows]


async def set_chunk_embeddings(conn: AsyncConnection, ids: Sequence[int], embeddings: Sequence[np.ndarray]) -> None:
    await conn.execute(
        text(
            "UPDATE chunks c SET embedding = u.e "
            "FROM unnest(CAST(:ids AS bigint[]), CAST(:es AS vector[])) AS u(id, e) WHERE c.id = u.id"
        ),
        {"ids": list(ids), "es": BinaryArray(embeddings)},
    )


async def source_names(conn: AsyncConnection) -> list[str]:
    return list((await conn.execute(text("SELECT name FROM sources ORDER BY name"))).scalars())


@dataclass(frozen=True)
class SourceStatus:
    """A source's counts as `ragbot status` and `/kb status` show them; `last_run` and `running` are filled in by
    `KnowledgeBase.status` from the recorded runs (knowledge.storage.sources)."""

    name: str
    kind: str
    location: str | None
    documents: int
    chunks: int
    last_synced_at: datetime | None
    last_run: SyncRun | None = None
    running: bool = False


@dataclass(frozen=True)
class IndexCounts:
    documents: int
    chunks: int
    total_length: int
    vocabulary: int
    embedding_model: str | None
    embedding_dimension: str | None


async def source_counts(conn: AsyncConnection) -> list[SourceStatus]:
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
    return [SourceStatus(r.name, r.kind, r.location, r.documents, r.chunks, r.last_synced_at) for r in rows]


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
