"""Fitting the answer / `uncertain` / decline decision on a public answerability benchmark (issue 39).

The data: `../shared/data/squad2-calibration/` (8 SQuAD 2.0 articles, 320 paragraphs, 2,917 questions, 1,477 of
them unanswerable), in the shape `ragbot eval --corpus` reads. It is split BY ARTICLE, fixed before anything was
fitted (`FIT_ARTICLES`, `HELD_OUT_ARTICLES`: the articles in alphabetical order, alternately): the model is fitted on
the questions of four articles and reported on the questions of the other four, so no paragraph a reported question
was written against was seen by the fit.

The model (`fit`): a logistic regression of "answerable" on the standardised evidence features
(knowledge.answer.evidence.FEATURES), with a small L2 penalty, by Newton's method (numpy). Its two cut points are
read off the fit articles' own probabilities, by the targets they serve, on every fit article separately:
`answer_at` is the lowest probability at which at most `MAX_UNANSWERABLE_ANSWERED` of each fit article's
unanswerable questions are answered, `decline_below` the highest at which at most `MAX_ANSWERABLE_DECLINED` of each
one's answerable questions are declined. Between them the reply
is `uncertain`. A decline also needs the best chunk's similarity under `dense_floor`, read off the same way (the
highest similarity under which at most `MAX_ANSWERABLE_DECLINED` of each fit article's answerable questions' best
chunks fall): the related model leans on shared words, which a question worded differently from its document
lacks, while the embedding still finds it close (knowledge.answer.evidence.off_topic).
The script that runs it all is scripts/calibrate.py (`make calibrate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from knowledge.answer.evidence import FEATURES, Calibration, Evidence, decide

ARTICLES = ("1973_oil_crisis", "European_Union_law", "French_and_Indian_War", "Huguenot", "Imperialism", "Normans",
            "Scottish_Parliament", "Warsaw")
FIT_ARTICLES = ARTICLES[0::2]  # 1973_oil_crisis, French_and_Indian_War, Imperialism, Scottish_Parliament
HELD_OUT_ARTICLES = ARTICLES[1::2]  # European_Union_law, Huguenot, Normans, Warsaw

# The cut points keep a margin under the targets (unanswerable answered ≤ 20%, answerable declined ≤ 5%),
# because they are read off the fit set and must hold on articles (and knowledge bases) it did not see.
MAX_UNANSWERABLE_ANSWERED = 0.15
MAX_ANSWERABLE_DECLINED = 0.01
L2 = 1.0
# The "related at all" model reads only the evidence of topic: similarities and how much of the question the passages
# hold. The rarity of missing terms is left out: in the benchmark, an off-topic question's terms are still in the
# index (its article is hidden, not absent), so their rarity says the opposite of what it says on a real knowledge
# base, where an off-topic question's terms are in no chunk at all.
RELATED_FEATURES = ("dense", "support", "coverage", "section_coverage", "unit_coverage")


@dataclass(frozen=True)
class Example:
    """One question's evidence and label, as cached by scripts/calibrate.py."""

    article: str
    answerable: bool
    features: Mapping[str, float]
    off_topic: bool = False  # asked with its own article left out of what may be searched


def article_of(record: Mapping[str, object]) -> str:
    """The article a question belongs to: the one of its relevant paragraph, or of the one it was written against."""
    relevant = record.get("relevant") or [record.get("against")]
    assert isinstance(relevant, list) and relevant and isinstance(relevant[0], str), record
    return relevant[0].split("#", 1)[0]


def _matrix(examples: Sequence[Example]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    x = np.array([[e.features[name] for name in FEATURES] for e in examples], dtype=np.float64)
    y = np.array([1.0 if e.answerable else 0.0 for e in examples], dtype=np.float64)
    return x, y


def logistic_regression(x: NDArray[np.float64], y: NDArray[np.float64], l2: float = L2,
                        steps: int = 50) -> tuple[NDArray[np.float64], float]:
    """Weights and bias minimising the log loss plus `l2`/2 · |w|² (the bias is not penalised), by Newton's method."""
    n, d = x.shape
    design = np.hstack([x, np.ones((n, 1))])
    theta = np.zeros(d + 1)
    penalty = np.full(d + 1, l2)
    penalty[-1] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ theta, -60, 60)))
        gradient = design.T @ (p - y) + penalty * theta
        hessian = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if float(np.max(np.abs(step))) < 1e-8:
            break
    return theta[:-1], float(theta[-1])


def fit(examples: Sequence[Example], off_topic: Sequence[Example] = (), *, fitted_on: str = "") -> Calibration:
    """The decision fitted on `examples` (questions asked of the whole benchmark) and `off_topic` (the same
    questions asked with their own article left out); see the module's docstring."""
    x, y = _matrix(examples)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    weights, bias = logistic_regression((x - mean) / scale, y)
    related_weights: dict[str, float] = {}
    related_bias = 0.0
    if off_topic:
        x_off, _ = _matrix(off_topic)
        columns = [FEATURES.index(name) for name in RELATED_FEATURES]
        both = ((np.vstack([x, x_off]) - mean) / scale)[:, columns]
        labels = np.concatenate([np.ones(len(x)), np.zeros(len(x_off))])
        r_weights, r_bias = logistic_regression(both, labels)
        related_weights = {n: round(float(w), 6) for n, w in zip(RELATED_FEATURES, r_weights, strict=True)}
        related_bias = round(r_bias, 6)
    model = Calibration({n: round(float(w), 6) for n, w in zip(FEATURES, weights, strict=True)}, round(bias, 6),
                        {n: round(float(m), 6) for n, m in zip(FEATURES, mean, strict=True)},
                        {n: round(float(s), 6) for n, s in zip(FEATURES, scale, strict=True)}, 1.0, 0.0, fitted_on,
                        {}, related_weights, related_bias)
    probabilities = np.array([model.probability(_evidence(e)) for e in examples])
    related = np.array([model.related_probability(_evidence(e)) for e in examples])
    articles = np.array([e.article for e in examples])
    # Each cut must hold on every fit article, not only on their pool: articles differ (one article's questions
    # share more words with its paragraphs than another's), and so will the next knowledge base.
    answer_at = max(_answer_cut(probabilities[(y == 0) & (articles == a)]) for a in sorted(set(articles)))
    decline_below = min(_decline_cut(related[(y == 1) & (articles == a)]) for a in sorted(set(articles)))
    dense = x[:, FEATURES.index("dense")]
    dense_floor = min(_decline_cut(dense[(y == 1) & (articles == a)]) for a in sorted(set(articles)))
    return Calibration(model.weights, model.bias, model.mean, model.scale, round(answer_at, 6),
                       round(decline_below, 6), fitted_on, {}, related_weights, related_bias, round(dense_floor, 6))


def _answer_cut(unanswerable: NDArray[np.float64]) -> float:
    """The lowest cut at which at most MAX_UNANSWERABLE_ANSWERED of these probabilities reach it."""
    ordered = np.sort(unanswerable)[::-1]
    allowed = int(np.floor(MAX_UNANSWERABLE_ANSWERED * len(ordered)))
    return float(ordered[allowed]) + 1e-6 if allowed < len(ordered) else 0.0


def _decline_cut(answerable: NDArray[np.float64]) -> float:
    """The highest cut below which at most MAX_ANSWERABLE_DECLINED of these probabilities fall."""
    ordered = np.sort(answerable)
    allowed = int(np.floor(MAX_ANSWERABLE_DECLINED * len(ordered)))
    return float(ordered[allowed]) if allowed < len(ordered) else 1.0


def _evidence(example: Example) -> Evidence:
    f = example.features
    return Evidence(f["dense"], f["support"], f["coverage"], f["margin"], int(f["agreement"]),
                    f["section_coverage"], f["missing_rare"], (), f["unit_coverage"], f["unit_missing_rare"],
                    f["negation"], f["answer_type"])


def decisions(model: Calibration, examples: Sequence[Example],
              not_found: Sequence[bool] | None = None) -> dict[str, dict[str, float]]:
    """Outcome shares on each side (answerable, unanswerable, off_topic) of `examples`, as the model decides them
    from the cached evidence; `not_found` marks the questions the specific-words rule caps at `uncertain`."""
    flags = list(not_found) if not_found is not None else [False] * len(examples)
    report: dict[str, dict[str, float]] = {}
    for side in ("answerable", "unanswerable", "off_topic"):
        chosen = [(e, flag) for e, flag in zip(examples, flags, strict=True) if _side(e) == side]
        if not chosen:
            continue
        outcomes = [decide(_evidence(e), model) for e, _ in chosen]
        outcomes = ["uncertain" if flag and o == "answer" else o for o, (_, flag) in zip(outcomes, chosen, strict=True)]
        total = len(outcomes) or 1
        report[side] = {"questions": len(outcomes), **{
            name: round(sum(o == outcome for o in outcomes) / total, 4)
            for name, outcome in (("answered", "answer"), ("uncertain", "uncertain"), ("declined", "decline"))}}
    return report


def _side(example: Example) -> str:
    if example.off_topic:
        return "off_topic"
    return "answerable" if example.answerable else "unanswerable"


def auc(model: Calibration, examples: Sequence[Example]) -> float:
    """The probability that an answerable question scores above an unanswerable one (ties count half)."""
    examples = [e for e in examples if not e.off_topic]
    p = np.array([model.probability(_evidence(e)) for e in examples])
    y = np.array([e.answerable for e in examples])
    positive, negative = p[y], p[~y]
    if not len(positive) or not len(negative):
        return 0.0
    greater = (positive[:, None] > negative[None, :]).sum() + 0.5 * (positive[:, None] == negative[None, :]).sum()
    return round(float(greater) / (len(positive) * len(negative)), 4)
