"""Answer, hedge or decline: the decision from evidence that carries over to a knowledge base it was not tuned on.

One cosine threshold tuned on one set does not generalise: a paraphrase shares few words with its document and
scores a low sentence similarity although retrieval found the right document by a wide margin, while a near miss
("pet insurance for dogs" against a life-insurance passage) scores a high one. So the decision reads several
signals, each scale-free or bounded, each from a different side:

- `dense`: the best cosine similarity of any permitted chunk (the dense side's absolute evidence);
- `support`: the best passage-level similarity, a quotable unit (sentence, row with its header, list item with its
  lead-in) of the top documents against the question;
- `coverage`: the idf-weighted share of the question's terms that the top document's passages hold, with the idf
  from the index's own statistics (a term no chunk holds weighs most: the question asks about something absent);
- `margin`: the top document's fused score minus the next document's (fused scores are normalised, 0..1);
- `agreement`: on how many sides (dense, lexical) the top document is also the best one.

Three outcomes (`decide`): `answer` (quote or compose), `uncertain` (the closest passages, labelled as such and
cited), `decline` (with related documents). The thresholds are settings, tuned on examples/handbook only and
reported on a held-out knowledge base (docs/answers.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from knowledge.storage.conversations import TermStat

Outcome = Literal["answer", "uncertain", "decline"]
OUTCOMES: tuple[Outcome, ...] = ("answer", "uncertain", "decline")


@dataclass(frozen=True)
class EvidenceSettings:
    """Where the outcomes split (tuning set: examples/handbook; see docs/answers.md)."""

    # Decline when nothing is even loosely related: the dense side, the best passage and the question's terms
    # all fall short.
    decline_below_similarity: float = 0.25
    decline_below_coverage: float = 0.5
    # Answer when the best passage addresses the question and the top document holds its key terms ...
    answer_support: float = 0.5
    answer_coverage: float = 0.6
    # ... or when the passage alone is a close paraphrase of the question and retrieval is sure of its document
    # (first on both sides, clear of the next document).
    strong_support: float = 0.55
    strong_margin: float = 0.2


@dataclass(frozen=True)
class Evidence:
    dense: float
    support: float
    coverage: float
    margin: float
    agreement: int

    def to_dict(self) -> dict[str, float]:
        return {"dense": round(self.dense, 4), "support": round(self.support, 4), "coverage": round(self.coverage, 4),
                "margin": round(self.margin, 4), "agreement": self.agreement}


def idf(stat: TermStat) -> float:
    """BM25's idf, floored above zero: a term in every chunk still weighs a little."""
    return max(0.05, math.log((stat.n_chunks - stat.df + 0.5) / (stat.df + 0.5) + 1.0))


def coverage(stats: Sequence[TermStat], passage: int = 0) -> float:
    """The idf-weighted share of the question's terms held by passage number `passage` (1.0 for no terms)."""
    total = sum(idf(s) for s in stats)
    if total <= 0:
        return 1.0
    return sum(idf(s) for s in stats if passage < len(s.in_passages) and s.in_passages[passage]) / total


def decide(evidence: Evidence, settings: EvidenceSettings) -> Outcome:
    e, s = evidence, settings
    if (max(e.dense, e.support) < s.decline_below_similarity and e.coverage < s.decline_below_coverage):
        return "decline"
    if e.support >= s.answer_support and e.coverage >= s.answer_coverage:
        return "answer"
    if e.support >= s.strong_support and e.agreement == 2 and e.margin >= s.strong_margin:
        return "answer"
    return "uncertain"
