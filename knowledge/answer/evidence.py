"""Answer, hedge or decline: a decision fitted on a public answerability benchmark, from evidence that carries over.

Three rounds of thresholds tuned by hand on our own examples did not carry over to the next knowledge base, so the
decision is a small fitted model (issue 39): a logistic regression over signals that are bounded or scale-free,
each from a different side of the pipeline, fitted on SQuAD 2.0 articles (whose unanswerable questions were written
to look answerable from a paragraph that does not hold the answer) by `scripts/calibrate.py` (`make calibrate`),
and stored as data in `calibration.json` next to this module, with its report (docs/answers.md):

- `dense`: the best cosine similarity of any permitted chunk (the dense side's absolute evidence);
- `support`: the best passage-level similarity, a quotable unit (sentence, row with its header, list item with its
  lead-in) of the top documents against the question;
- `coverage`: the idf-weighted share of the question's terms that the top document's passages hold, with the idf
  from the index's own statistics (a term no chunk holds weighs most: the question asks about something absent);
- `section_coverage`: the same share held by the best unit's own section (its document title, heading and the
  retrieved chunks under that heading): the question's constraints should be where the answer is, not anywhere;
- `missing_rare`: the normalised idf (0..1, 1 = no chunk holds it) of the rarest question term the best unit's
  section lacks: a name, place, year or code the answer does not mention;
- `margin`: the top document's fused score minus the next document's (fused scores are normalised, 0..1);
- `agreement`: on how many sides (dense, lexical) the top document is also the best one (0..2);
- `unit_coverage`, `unit_missing_rare`: `section_coverage` and `missing_rare` for the best unit alone (the sentence,
  row or list item that would be quoted first): a near miss often borrows its terms from different sentences;
- `negation`: 1 when exactly one of the question and the best unit is negated ("not", "never", "no longer"): "Which
  offices are not open on Saturday?" against "Munich is open on Saturday";
- `answer_type`: whether the best unit holds what the question's form asks for (a year or date for "when", a number
  for "how many/much", a name for "who"): 1 yes, 0 no, 0.5 when the question's form asks for nothing in particular.

`decide` reads two fitted models, each with its cut point: `decline` when the "related" model's probability (what
was found is on the question's topic at all; fitted on questions asked of the benchmark with their own article left
out) is below `decline_below` AND no retrieved chunk reaches the fitted dense floor (`dense_floor`: the similarity
below which almost no answerable benchmark question's best chunk falls). The related model reads shared words
(coverage) as much as similarity, and a question worded differently from its document ("train ticket" for "rail
fares") shares few; the embedding carries the synonym, so a question whose best chunk is as close as an on-topic
question's is not declined: decline means "off-topic", and the rest is `uncertain` at worst. Else `answer` when the "answerable" model's probability is at or above `answer_at`;
else `uncertain` (the closest passages, labelled as such and cited). One rule stands beside the model (issue 39, item 4): a question naming something specific (a capitalised
name, a year, a number, a code) that the answer's document does not hold is `uncertain` at best, and the reply says
which part was not found (`Evidence.not_found`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from knowledge.storage.conversations import TermStat

Outcome = Literal["answer", "uncertain", "decline"]
OUTCOMES: tuple[Outcome, ...] = ("answer", "uncertain", "decline")

FEATURES = ("dense", "support", "coverage", "section_coverage", "missing_rare", "margin", "agreement",
            "unit_coverage", "unit_missing_rare", "negation", "answer_type")
DEFAULT_CALIBRATION = Path(__file__).with_name("calibration.json")


@dataclass(frozen=True)
class Evidence:
    dense: float
    support: float
    coverage: float
    margin: float
    agreement: int
    section_coverage: float = 1.0
    missing_rare: float = 0.0
    # The question's specific words (names, years, numbers, codes) that the answering document does not hold.
    not_found: tuple[str, ...] = ()
    unit_coverage: float = 1.0
    unit_missing_rare: float = 0.0
    negation: float = 0.0
    answer_type: float = 0.5

    def features(self) -> dict[str, float]:
        return {"dense": self.dense, "support": self.support, "coverage": self.coverage,
                "section_coverage": self.section_coverage, "missing_rare": self.missing_rare,
                "margin": self.margin, "agreement": float(self.agreement), "unit_coverage": self.unit_coverage,
                "unit_missing_rare": self.unit_missing_rare, "negation": self.negation,
                "answer_type": self.answer_type}

    def to_dict(self) -> dict[str, object]:
        values: dict[str, object] = {name: round(value, 4) for name, value in self.features().items()}
        values["agreement"] = self.agreement
        if self.not_found:
            values["not_found"] = list(self.not_found)
        return values


@dataclass(frozen=True)
class Calibration:
    """A fitted decision: standardised features → logistic regression → two cut points on its probability."""

    weights: dict[str, float]
    bias: float
    mean: dict[str, float]
    scale: dict[str, float]
    answer_at: float
    decline_below: float
    fitted_on: str = ""
    report: dict[str, object] = field(default_factory=dict)
    # The second model, "related at all": what was found is about the question's topic (answerable or a near miss)
    # rather than about something else (the question's topic is not in the knowledge base). Declines read it.
    related_weights: dict[str, float] = field(default_factory=dict)
    related_bias: float = 0.0
    # A decline also needs the best chunk's similarity below this floor (None: no floor, as fitted before it existed).
    dense_floor: float | None = None

    def probability(self, evidence: Evidence) -> float:
        """The model's probability that the question is answerable from what was found."""
        return self._logistic(evidence, self.weights, self.bias)

    def related_probability(self, evidence: Evidence) -> float:
        """The probability that what was found is on the question's topic (the answer model's, without a second
        model)."""
        if not self.related_weights:
            return self.probability(evidence)
        return self._logistic(evidence, self.related_weights, self.related_bias)

    def _logistic(self, evidence: Evidence, weights: dict[str, float], bias: float) -> float:
        values = evidence.features()
        z = bias + sum(
            weight * (values[name] - self.mean.get(name, 0.0)) / (self.scale.get(name, 1.0) or 1.0)
            for name, weight in weights.items()
        )
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def to_dict(self) -> dict[str, object]:
        return {"features": list(self.weights), "weights": self.weights, "bias": self.bias,
                "related_weights": self.related_weights, "related_bias": self.related_bias, "mean": self.mean,
                "scale": self.scale, "answer_at": self.answer_at, "decline_below": self.decline_below,
                "dense_floor": self.dense_floor, "fitted_on": self.fitted_on, "report": self.report}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Calibration:
        def numbers(key: str) -> dict[str, float]:
            raw = data[key]
            if not isinstance(raw, dict):
                raise ValueError(f"{key} must map feature names to numbers")
            unknown = set(raw) - set(FEATURES)
            if unknown:
                raise ValueError(f"{key} names unknown features {sorted(unknown)}; known: {', '.join(FEATURES)}")
            return {str(k): float(v) for k, v in raw.items()}

        report = data.get("report", {})
        return cls(numbers("weights"), float(str(data["bias"])), numbers("mean"), numbers("scale"),
                   float(str(data["answer_at"])), float(str(data["decline_below"])), str(data.get("fitted_on", "")),
                   report if isinstance(report, dict) else {},
                   numbers("related_weights") if "related_weights" in data else {},
                   float(str(data.get("related_bias", 0.0))),
                   None if data.get("dense_floor") is None else float(str(data["dense_floor"])))

    @classmethod
    def load(cls, path: Path | None = None) -> Calibration:
        """The fitted decision stored at `path` (default: the one fitted on SQuAD 2.0, shipped with the code)."""
        path = path or DEFAULT_CALIBRATION
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a calibration file written by `make calibrate` ({exc}); "
                             "unset ANSWER_CALIBRATION to use the shipped one") from exc


def idf(stat: TermStat) -> float:
    """BM25's idf, floored above zero: a term in every chunk still weighs a little."""
    return max(0.05, math.log((stat.n_chunks - stat.df + 0.5) / (stat.df + 0.5) + 1.0))


def rarity(stat: TermStat) -> float:
    """A term's idf as a share of the idf of a term no chunk holds (0..1): comparable across index sizes."""
    ceiling = math.log((stat.n_chunks + 0.5) / 0.5 + 1.0)
    return min(1.0, idf(stat) / ceiling) if ceiling > 0 else 1.0


def coverage(stats: Sequence[TermStat], passage: int = 0) -> float:
    """The idf-weighted share of the question's terms held by passage number `passage` (1.0 for no terms)."""
    total = sum(idf(s) for s in stats)
    if total <= 0:
        return 1.0
    return sum(idf(s) for s in stats if _holds(s, passage)) / total


def missing_rare(stats: Sequence[TermStat], passage: int) -> float:
    """The rarity of the rarest question term passage number `passage` lacks (0 when it lacks none)."""
    return max((rarity(s) for s in stats if not _holds(s, passage)), default=0.0)


def _holds(stat: TermStat, passage: int) -> bool:
    return passage < len(stat.in_passages) and stat.in_passages[passage]


# A specific word counts as "not found" only when it is this rare in the index (normalised idf): the company's own
# name, capitalised in every question, is in most chunks and says nothing about which office or year is asked.
SPECIFIC_RARITY = 0.5


def absent_specific(stats: Sequence[TermStat], passage: int) -> list[str]:
    """The lexemes of the question's specific words (see `extractive.specific_words`) that passage number
    `passage` lacks, when they are rare in the index."""
    return [s.lexeme for s in stats if not _holds(s, passage) and rarity(s) >= SPECIFIC_RARITY]


def off_topic(evidence: Evidence, calibration: Calibration) -> bool:
    """Nothing found is on the question's topic: the related model is sure, and no chunk is as close as an
    on-topic question's best chunk (a synonym shares no word with its document, but its embedding is close)."""
    if calibration.related_probability(evidence) >= calibration.decline_below:
        return False
    return calibration.dense_floor is None or evidence.dense < calibration.dense_floor


def decide(evidence: Evidence, calibration: Calibration) -> Outcome:
    if off_topic(evidence, calibration):
        return "decline"
    if calibration.probability(evidence) >= calibration.answer_at and not evidence.not_found:
        return "answer"
    return "uncertain"
