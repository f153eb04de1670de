"""Fusion: the dense and the BM25 candidates of one search merged into one ranked list.

The two retrievers run as separate statements (BM25 while the question is embedded, HNSW as soon as the vector is
ready), so their lists meet here, in a few microseconds of Python, instead of in a third statement that would wait
for both.

FUSION picks the formula. "adaptive" (default) is a convex combination of min-max normalised scores in which the
BM25 side is scaled by its confidence: the best lexical score as a fraction of the score an average-length chunk
containing every question term once would get (capped at 1). A question that shares its key terms with a document
keeps BM25's full say; a paraphrase whose only lexical matches are incidental words does not let those matches
outrank the dense side. "convex" (no scaling) and "rrf" (reciprocal rank fusion) are there to compare; the README
has the measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """A chunk one retriever found: cosine similarity for the dense side, BM25 score for the lexical side."""

    id: int
    document_id: int
    score: float


@dataclass(frozen=True)
class LexicalCandidates:
    candidates: list[Candidate]
    # The BM25 score of an average-length chunk holding once every question term the asker can find: the yardstick
    # of the lexical side's confidence.
    full_match_score: float


@dataclass(frozen=True)
class Fused:
    id: int
    document_id: int
    score: float
    dense_score: float | None
    lexical_score: float | None


@dataclass(frozen=True)
class _Ranked:
    score: float
    rank: int  # 1 = best
    norm: float  # min-max normalised score, 0..1


def _ranked(candidates: Sequence[Candidate]) -> dict[int, _Ranked]:
    if not candidates:
        return {}
    low = min(c.score for c in candidates)
    high = max(c.score for c in candidates)
    order = sorted(candidates, key=lambda c: (-c.score, c.id))
    return {
        c.id: _Ranked(c.score, rank, (c.score - low) / (high - low) if high > low else 1.0)
        for rank, c in enumerate(order, start=1)
    }


@dataclass(frozen=True)
class Fusion:
    method: str  # "adaptive", "convex" or "rrf" (FUSION)
    dense_weight: float
    rrf_k: int
    per_document: int  # at most this many chunks of one document
    limit: int

    def fuse(self, dense: Sequence[Candidate] | None, lexical: LexicalCandidates | None) -> list[Fused]:
        """The best `limit` chunks, best first (ties by id), at most `per_document` from any one document. With one
        side only (a dense or a lexical search), its own score ranks."""
        documents = {c.id: c.document_id for side in (dense or [], lexical.candidates if lexical else []) for c in side}
        d = _ranked(dense or [])
        l = _ranked(lexical.candidates) if lexical else {}  # noqa: E741 (a one-letter name in a short expression)
        confidence = self._confidence(lexical)
        fused = []
        for chunk_id, document_id in documents.items():
            dense_hit, lexical_hit = d.get(chunk_id), l.get(chunk_id)
            if dense is None:
                assert lexical_hit is not None  # one side only: every candidate came from it
                score = lexical_hit.score
            elif lexical is None:
                assert dense_hit is not None
                score = dense_hit.score
            else:
                score = self._combined(dense_hit, lexical_hit, confidence)
            fused.append(Fused(chunk_id, document_id, score, dense_hit.score if dense_hit else None,
                               lexical_hit.score if lexical_hit else None))
        fused.sort(key=lambda f: (-f.score, f.id))
        chosen: list[Fused] = []
        per_document: dict[int, int] = {}
        for f in fused:
            if per_document.get(f.document_id, 0) < self.per_document:
                per_document[f.document_id] = per_document.get(f.document_id, 0) + 1
                chosen.append(f)
                if len(chosen) == self.limit:
                    break
        return chosen

    @staticmethod
    def _confidence(lexical: LexicalCandidates | None) -> float:
        """How fully the best lexical match covers the question's terms (0..1); 0 when no term can be found."""
        if not lexical or not lexical.candidates or lexical.full_match_score <= 0:
            return 0.0
        return min(1.0, max(c.score for c in lexical.candidates) / lexical.full_match_score)

    def _combined(self, dense: _Ranked | None, lexical: _Ranked | None, confidence: float) -> float:
        dense_weight, lexical_weight = self.dense_weight, 1.0 - self.dense_weight
        if self.method == "rrf":
            return ((dense_weight / (self.rrf_k + dense.rank) if dense else 0.0)
                    + (lexical_weight / (self.rrf_k + lexical.rank) if lexical else 0.0))
        if self.method == "convex":
            confidence = 1.0
        return ((dense_weight * dense.norm if dense else 0.0)
                + (lexical_weight * lexical.norm * confidence if lexical else 0.0))


@dataclass(frozen=True)
class Reading:
    """One reading of a question (multi-query retrieval): what is searched and how much its ranking counts."""

    query: str
    weight: float = 1.0


# Reciprocal rank fusion's k for readings: small, so a reading's first hit counts clearly more than its second (with
# the usual 60, a generic passage second in every reading outranked the answer first in two of three; chosen on
# examples/handbook/conversations.jsonl).
READINGS_RRF_K = 5


def fuse_readings(rankings: Sequence[tuple[float, Sequence[int]]], rrf_k: int, limit: int) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of several readings' rankings (chunk ids, best first), each with its weight: a chunk
    scores the weighted sum of 1 / (rrf_k + rank) over the readings that found it. Ranks, not scores, because the
    readings' scores are not on one scale (a longer query scores higher BM25). Best `limit` first, ties by id."""
    scores: dict[int, float] = {}
    for weight, ranking in rankings:
        for rank, chunk_id in enumerate(ranking, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + weight / (rrf_k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:limit]
