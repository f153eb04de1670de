"""Hybrid retrieval: pgvector HNSW (dense) + Okapi BM25 (lexical), each filtered by access, fused (knowledge.search.fusion).

BM25 is computed inside Postgres with nothing beyond pgvector: the question is tokenised and stemmed by the same
text search configuration as the chunks; its terms' idf (from the `lexemes` table and the corpus size) form a sparse
query vector; each chunk stores its document-side BM25 weights as a sparse vector; their inner product is the
BM25 score. Candidates come from the GIN index with OR semantics over the question's terms, because long
questions rarely contain every term; in a large corpus, from the rarest terms' postings plus the chunks holding two
or three of the other terms together (see SearchTuning's candidate_postings and together_postings).

A search is two statements: BM25's candidates (sent before the question is embedded, so Postgres works on them
while the model does) and the HNSW search (sent the moment the vector is ready). Each returns with its candidates
what their hits show (text, document), so the fused list needs no further round trip. Both candidate lists are
filtered by the asker's principals inside their index scans (pgvector's iterative scan keeps a filtered HNSW
search returning enough rows). The statements, and the knobs that tune them (`SearchTuning`), are in
knowledge/storage/search.py; this module decides what to run and fuses what comes back.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

import numpy as np
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.engine import HNSW_EF_SEARCH
from knowledge.access import EVERYONE
from knowledge.embedding.encoder import Embedder, resolve_model_path
from knowledge.search.fusion import (
    READINGS_RRF_K,
    Candidate,
    Fused,
    Fusion,
    LexicalCandidates,
    Reading,
    fuse_readings,
)
from knowledge.settings import KnowledgeSettings
from knowledge.storage import search as search_store
from knowledge.storage.documents import as_vector
from knowledge.storage.search import EVERY_TERM, SearchTuning

__all__ = ["MODES", "Mode", "Reading", "Retriever", "SearchFilters", "SearchHit", "SearchResults", "SearchTuning",
           "collapse_near_duplicates", "ef_search_for", "rerank"]

Mode = Literal["hybrid", "dense", "lexical"]
MODES: tuple[Mode, ...] = ("hybrid", "dense", "lexical")


def ef_search_for(n_chunks: int, tuning: SearchTuning = SearchTuning()) -> int:  # noqa: B008 (a frozen value)
    """The HNSW search list for a corpus of `n_chunks` (see SearchTuning.chunks_per_ef_search)."""
    return max(HNSW_EF_SEARCH, min(tuning.max_ef_search, n_chunks // tuning.chunks_per_ef_search))


@dataclass(frozen=True)
class SearchFilters:
    """Who is asking and what to search. The asker always sees documents shared with `everyone`."""

    principals: tuple[str, ...] = (EVERYONE,)
    sources: tuple[str, ...] | None = None
    updated_after: datetime | None = None

    def principal_list(self) -> list[str]:
        return sorted(set(self.principals) | {EVERYONE})


@dataclass(frozen=True)
class SearchHit:
    rank: int
    score: float
    chunk_id: int
    text: str
    heading: str
    ordinal: int
    document_id: int
    external_id: str
    title: str
    url: str | None
    path: str | None
    source: str
    dense_score: float | None  # cosine similarity, when the chunk was among the dense candidates
    lexical_score: float | None  # BM25 score, when the chunk was among the BM25 candidates

    def to_dict(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "score": round(self.score, 6),
            "document": {"id": self.document_id, "external_id": self.external_id, "title": self.title,
                         "url": self.url, "path": self.path, "source": self.source},
            "chunk": {"id": self.chunk_id, "text": self.text, "heading": self.heading},
        }


@dataclass
class SearchResults:
    hits: list[SearchHit]
    best_similarity: float | None  # best cosine similarity of any permitted chunk: the abstention signal
    timings: dict[str, float] = field(default_factory=dict)


class Retriever:
    def __init__(self, engine: AsyncEngine, embedder: Embedder, settings: KnowledgeSettings,
                 tuning: SearchTuning | None = None) -> None:
        # The searches' own pool, in autocommit (db.engine.create_engine(url, autocommit=True)): a statement is one
        # round trip, without a BEGIN before it, and no rollback ever drops what psycopg has prepared.
        self.engine = engine
        self._reads = engine.execution_options(isolation_level="AUTOCOMMIT")  # the same, if given a shared engine
        self.embedder = embedder
        self.settings = settings
        self.tuning = tuning or SearchTuning()  # the search statements' knobs (knowledge.storage.search)
        self._query_vectors: dict[str, np.ndarray] = {}
        self._corpus = search_store.CorpusLayout(0, {})  # the graphs' sizes, read again once it expires:
        self._corpus_until = 0.0  # time.monotonic() when the corpus size is read again

    async def query_vector(self, query: str) -> np.ndarray:
        if query not in self._query_vectors:
            if len(self._query_vectors) > 512:
                self._query_vectors.clear()
            (vector,) = await self.embedder.embed_async([query])
            self._query_vectors[query] = as_vector(vector)
        return self._query_vectors[query]

    async def _lexical_candidates(
        self, params: dict[str, object], shown: dict[int, Any], among_permitted: bool = False
    ) -> LexicalCandidates:
        async with self._reads.connect() as conn:
            principals = params["principals"]
            assert isinstance(principals, list)
            share = (await self._corpus_layout(conn)).visible_share(principals)
            rows = await search_store.lexical_rows(conn, params, among_permitted=among_permitted,
                                                   narrow=share <= self.tuning.narrow_reader_share)
        shown.update((r.id, r) for r in rows)
        return LexicalCandidates([Candidate(r.id, r.document_id, float(r.score)) for r in rows],
                                 float(rows[0].full_match_score) if rows else 0.0)

    async def _dense_candidates(self, params: dict[str, object], shown: dict[int, Any]) -> list[Candidate]:
        async with self._reads.connect() as conn:
            sources = params["sources"]
            assert sources is None or isinstance(sources, list)
            settings = {"hnsw.ef_search": await self._ef_search_for_corpus(conn, sources)}
            rows = await search_store.dense_rows(conn, self.embedder.dimension, params, settings=settings)
            if await self._index_scan_fell_short(conn, len(rows), params):
                # Not reported in the timings: whether the index scan fell short depends on chunks the asker may
                # not see crowding it, which is not theirs to learn.
                rows = await search_store.dense_rows(conn, self.embedder.dimension, params, exact=True)
        shown.update((r.id, r) for r in rows)
        return [Candidate(r.id, r.document_id, float(r.score)) for r in rows]

    async def _ef_search_for_corpus(self, conn: AsyncConnection, sources: Sequence[str] | None = None) -> str:
        """ef_search_for the size of the largest HNSW graph a search of `sources` (None: every source) walks: the
        corpus's when `chunks` is one table; the largest searched partition's when it is partitioned by source, since
        each partition has its own graph and is searched with the one setting. (From the corpus size, a search of ten
        partitions of 100k chunks walked each with the search list of a million-chunk graph: 800 instead of 200.)
        The sizes are read at most once a tuning.corpus_size_ttl_s."""
        return str(ef_search_for((await self._corpus_layout(conn)).largest_graph(sources), self.tuning))

    async def _corpus_layout(self, conn: AsyncConnection) -> search_store.CorpusLayout:
        """The corpus's size, partitions and access statistics, read again once a tuning.corpus_size_ttl_s (the two
        sides of a search may both read it when it expires: harmless)."""
        if time.monotonic() >= self._corpus_until:
            self._corpus = await search_store.corpus_layout(conn)
            self._corpus_until = time.monotonic() + self.tuning.corpus_size_ttl_s
        return self._corpus

    async def _index_scan_fell_short(self, conn: AsyncConnection, found: int, params: dict[str, object]) -> bool:
        """Did the HNSW scan return fewer candidates than the asker may see? It can, when the rows it visits first
        are ones the filter rejects (other people's chunks) or dead rows of a large deletion not yet vacuumed:
        pgvector stops after hnsw.max_scan_tuples. Only then is the permitted set counted (at most n rows)."""
        limit = params["n"]
        assert isinstance(limit, int)
        if found >= limit:
            return False
        return await search_store.permitted_count(conn, params) > found

    @staticmethod
    def _hits(chosen: Sequence[Fused], shown: dict[int, Any]) -> list[SearchHit]:
        hits = []
        for f in chosen:
            r = shown[f.id]
            hits.append(SearchHit(0, f.score, f.id, r.text, r.heading, r.ordinal, r.document_id, r.external_id,
                                  r.title, r.url, r.path, r.source, f.dense_score, f.lexical_score))
        return hits

    async def search(
        self,
        query: str,
        filters: SearchFilters,
        *,
        k: int = 10,
        mode: Mode = "hybrid",
        max_per_document: int | None = None,
        candidates: int | None = None,
    ) -> SearchResults:
        if not query.strip():
            raise ValueError("the question is empty")
        timings: dict[str, float] = {}
        fusion = Fusion(self.settings.fusion, self.settings.fusion_dense_weight, self.settings.rrf_k,
                        per_document=max_per_document or self.settings.max_chunks_per_document,
                        limit=k * 2 + 5)  # room for near-duplicates that get collapsed below
        params: dict[str, object] = {
            "query": query,
            "config": self.settings.text_search_config,
            "embedding": None,
            "principals": filters.principal_list(),
            "sources": list(filters.sources) if filters.sources else None,
            "updated_after": filters.updated_after,
            "n": max(candidates or self.settings.candidates_per_retriever, k),
            **self.tuning.params(),
        }
        started = time.perf_counter()
        # BM25 runs in Postgres (another process) while the question is embedded here, and the HNSW search starts as
        # soon as the vector is ready, whether BM25 has finished or not: on a 2-core machine the work overlaps
        # instead of queueing (bench/search.py measures it).
        # Each candidate comes with what its hit shows (text, document), read by the statement that checked access.
        shown: dict[int, Any] = {}  # a candidate's row (a named tuple) by chunk id

        async def lexical_side() -> LexicalCandidates:
            found = await self._lexical_candidates(params, shown)
            timings["lexical_ms"] = (time.perf_counter() - started) * 1000
            return found

        lexical_task = asyncio.create_task(lexical_side()) if mode != "dense" else None
        dense: list[Candidate] | None = None
        try:
            if mode != "lexical":
                params["embedding"] = await self.query_vector(query)
                timings["embed_ms"] = (time.perf_counter() - started) * 1000
                dense = await self._dense_candidates(params, shown)
                timings["dense_ms"] = (time.perf_counter() - started) * 1000
            lexical = await lexical_task if lexical_task is not None else None
        except BaseException:
            if lexical_task is not None:
                lexical_task.cancel()
                await asyncio.gather(lexical_task, return_exceptions=True)
            raise
        chosen = fusion.fuse(dense, lexical)
        if mode == "lexical" and len(chosen) < k:
            every_term = {**params, "rare_corpus": EVERY_TERM}
            chosen = fusion.fuse(None, await self._lexical_candidates(every_term, shown, among_permitted=True))
        hits = self._hits(chosen, shown)
        best = max((c.score for c in dense), default=None) if dense is not None else None
        if self.settings.rerank_model and mode == "hybrid":
            started = time.perf_counter()
            hits = await rerank(self.settings.rerank_model, query, hits[: self.settings.rerank_candidates])
            timings["rerank_ms"] = (time.perf_counter() - started) * 1000
        hits = [replace(hit, rank=i + 1) for i, hit in enumerate(collapse_near_duplicates(hits, limit=k))]
        return SearchResults(hits, best, timings)

    async def search_readings(
        self, readings: Sequence[Reading], filters: SearchFilters, *, k: int = 10, mode: Mode = "hybrid",
        max_per_document: int | None = None,
    ) -> SearchResults:
        """Multi-query retrieval: each reading of a question (a follow-up alone, with the turn before, rewritten,
        translated) searched, and the rankings fused by weighted reciprocal rank (`fuse_readings`), so a conversation
        no longer bets on one rewrite. One reading is a plain `search`. A fused hit keeps its best score of any
        reading (the evidence's margin reads scores on the fusion's 0..1 scale); the abstention signal is the best
        similarity of any reading."""
        if len(readings) == 1:
            return await self.search(readings[0].query, filters, k=k, mode=mode, max_per_document=max_per_document)
        # One after the other: each search already overlaps its own embedding and SQL.
        each = [await self.search(r.query, filters, k=max(k, 20), mode=mode, max_per_document=max_per_document)
                for r in readings]
        best: dict[int, SearchHit] = {}
        for found in each:
            for hit in found.hits:
                kept = best.get(hit.chunk_id)
                if kept is None or hit.score > kept.score:
                    best[hit.chunk_id] = hit
        # Documents are fused on their own rankings (a document ranks where its best chunk ranks in each reading), so
        # two readings that find one document through different chunks both vote for it; its chunks follow in
        # their own fused order.
        weights = [r.weight for r in readings]
        documents = fuse_readings([(w, list(dict.fromkeys(h.document_id for h in found.hits)))
                                   for w, found in zip(weights, each, strict=True)], READINGS_RRF_K, len(best))
        chunk_scores = dict(fuse_readings([(w, [h.chunk_id for h in found.hits])
                                           for w, found in zip(weights, each, strict=True)], READINGS_RRF_K, len(best)))
        per_document_limit = max_per_document or self.settings.max_chunks_per_document
        by_document: dict[int, list[SearchHit]] = {}
        for hit in sorted(best.values(), key=lambda h: (-chunk_scores[h.chunk_id], h.chunk_id)):
            by_document.setdefault(hit.document_id, []).append(hit)
        hits: list[SearchHit] = []
        for document_id, _ in documents:
            for hit in by_document[document_id][:per_document_limit]:
                if len(hits) < k:
                    hits.append(replace(hit, rank=len(hits) + 1))
        similarities = [found.best_similarity for found in each if found.best_similarity is not None]
        timings: dict[str, float] = {}
        for found in each:
            for key, value in found.timings.items():
                timings[key] = timings.get(key, 0.0) + value
        return SearchResults(hits, max(similarities) if similarities else None, timings)


_WORD = re.compile(r"\w+")


def collapse_near_duplicates(
    hits: Sequence[SearchHit], threshold: float = 0.9, limit: int | None = None
) -> list[SearchHit]:
    """Drop a hit whose set of words overlaps a better hit's by `threshold` (Jaccard): the same paragraph pasted into two
    pages, or two overlapping chunks, should not take two of the k places. Stops once `limit` hits are kept."""
    kept: list[tuple[SearchHit, frozenset[str]]] = []
    for hit in hits:
        words = frozenset(_WORD.findall(hit.text.lower()))
        if any(_jaccard_at_least(words, other, threshold) for _, other in kept):
            continue
        kept.append((hit, words))
        if limit is not None and len(kept) == limit:
            break
    return [hit for hit, _ in kept]


def _jaccard_at_least(a: frozenset[str], b: frozenset[str], threshold: float) -> bool:
    if not a or not b:
        return False
    # |a ∩ b| / |a ∪ b| is at most the smaller set's size over the larger's: most pairs are ruled out by that alone
    # (a search collapses up to 25 hits, each against every hit kept before it).
    if min(len(a), len(b)) < threshold * max(len(a), len(b)):
        return False
    shared = len(a & b)
    return shared >= threshold * (len(a) + len(b) - shared)


_cross_encoders: dict[str, object] = {}


async def rerank(model_name: str, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]:
    """Re-order hits by a cross-encoder's relevance score (RERANK_MODEL, a local model; off by default)."""
    if not hits:
        return []

    def _score() -> list[float]:
        from sentence_transformers import CrossEncoder  # here, not at the top: it loads torch (seconds)

        if model_name not in _cross_encoders:
            _cross_encoders[model_name] = CrossEncoder(resolve_model_path(model_name), device="cpu")
        model = _cross_encoders[model_name]
        return [float(s) for s in model.predict([(query, h.text) for h in hits], show_progress_bar=False)]  # type: ignore[attr-defined]  # sentence-transformers' CrossEncoder is untyped here

    scores = await asyncio.to_thread(_score)
    order = sorted(range(len(hits)), key=lambda i: -scores[i])
    return [replace(hits[i], score=scores[i]) for i in order]
