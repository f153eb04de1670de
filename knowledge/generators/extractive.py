"""The offline answer: the most relevant sentences of the retrieved chunks, quoted with citations.

Used when no ANTHROPIC_API_KEY is set (or the API fails). It never paraphrases, so it cannot state anything the
documents do not say; it is labelled as excerpts so nobody mistakes it for a composed answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from knowledge.chunking import split_sentences
from knowledge.embedding import Embedder

EXCERPTS_HEADER = "Excerpts from the knowledge base (offline mode: quoted, not summarised):"

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "a an the is are was were be been to of in on for and or with at by from do does did i my me we our you your "
    "how what when where who which can could should would will it this that there as if about get".split()
)


@dataclass(frozen=True)
class Excerpt:
    source_n: int
    sentence: str
    score: float


def _terms(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def best_sentences(
    question: str, passages: list[tuple[int, str]], embedder: Embedder, limit: int = 3
) -> list[Excerpt]:
    """Score every sentence of the passages ([(source number, text)]) by similarity to the question."""
    candidates: list[tuple[int, str]] = []
    for n, text in passages:
        for sentence in split_sentences(text):
            if len(sentence) >= 20 and sentence not in {c[1] for c in candidates}:
                candidates.append((n, sentence))
    if not candidates:
        return []
    question_vector, *sentence_vectors = embedder.embed([question] + [s for _, s in candidates])
    question_terms = _terms(question)
    scored = []
    for (n, sentence), vector in zip(candidates, sentence_vectors, strict=True):
        similarity = sum(a * b for a, b in zip(question_vector, vector))
        overlap = len(question_terms & _terms(sentence)) / max(1, len(question_terms))
        scored.append(Excerpt(n, sentence, similarity + 0.3 * overlap))
    ranked = sorted(scored, key=lambda e: -e.score)
    # Only sentences close to the best one: a weak third sentence dilutes the answer more than it adds.
    best = [e for e in ranked[:limit] if e.score >= 0.7 * ranked[0].score]
    # Quote in source order, so excerpts from one document read in sequence.
    position = {pair: i for i, pair in enumerate(candidates)}
    return sorted(best, key=lambda e: position[(e.source_n, e.sentence)])


def format_excerpts(excerpts: list[Excerpt], numbering: dict[int, int]) -> str:
    """Quote each sentence as it is, followed by its citation number (source number mapped through
    `numbering`). The quotes are never rewritten afterwards, so a "[1]" inside a document stays as written."""
    lines = [EXCERPTS_HEADER, ""]
    lines += [f"> {e.sentence} [{numbering[e.source_n]}]" for e in excerpts]
    return "\n".join(lines)
