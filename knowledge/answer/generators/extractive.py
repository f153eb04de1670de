"""The offline answer: the passage that best answers the question, quoted whole under its title and heading.

Used when no ANTHROPIC_API_KEY is set (or the API fails). It never paraphrases, so it cannot state anything the
documents do not say. How it reads:
- the best unit (a sentence with the one it leans on, a table row with its header, a list item with its lead-in;
  see `passages`) decides the lead document; the units of that document that score close to it are quoted with it,
  grouped under "Title › Section [1]";
- a second document is quoted only when its best unit scores nearly as well as the lead (it adds something);
- when no unit is close enough to the question, nothing is quoted: the answer says so and the nearest documents
  are offered as related. The thresholds were set by measurement on the handbook's answerable, near-miss and
  off-topic questions (README, "Offline answers").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from knowledge.embedding.encoder import Embedder
from knowledge.answer.generators.passages import Unit, breadcrumb, render_units, units_of

OFFLINE_NOTE = "_Quoted from your documents as written (offline mode: set ANTHROPIC_API_KEY for composed answers)._"

# A unit whose cosine similarity to the question is below this does not answer it (measured: README).
MIN_UNIT_SIMILARITY = 0.45
# Other units of the lead document are quoted when they score at least this fraction of the best unit.
SAME_DOCUMENT_RATIO = 0.85
# A second document is quoted when its best unit scores at least this fraction of the best unit.
SECOND_SOURCE_RATIO = 0.95
MAX_UNITS_PER_DOCUMENT = 3

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "a an the is are was were be been to of in on for and or with at by from do does did i my me we our you your "
    "how what when where who which can could should would will it this that there as if about get many much".split()
)


@dataclass(frozen=True)
class Passage:
    """A retrieved chunk, as the answerer numbered it."""

    source_n: int
    title: str
    heading: str
    ordinal: int
    text: str


@dataclass(frozen=True)
class ScoredUnit:
    source_n: int
    passage: Passage
    unit: Unit
    similarity: float  # cosine similarity with the question
    score: float  # similarity plus a bonus for shared question terms


@dataclass
class OfflineAnswer:
    text: str
    sources: list[int] = field(default_factory=list)  # source numbers quoted, in order of appearance
    best_similarity: float = 0.0


def _terms(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def score_units(question: str, passages: Sequence[Passage], embedder: Embedder) -> list[ScoredUnit]:
    """Every unit of the passages, scored against the question, best first."""
    candidates: list[tuple[Passage, Unit]] = []
    seen: set[tuple[int, str]] = set()
    for passage in passages:
        for unit in units_of(passage.text, passage.ordinal):
            key = (passage.source_n, unit.scoring_text())
            if key in seen or len(unit.text) < 3:
                continue  # overlapping chunks repeat sentences
            seen.add(key)
            candidates.append((passage, unit))
    if not candidates:
        return []
    texts = [_context(p, u) for p, u in candidates]
    question_vector, *vectors = embedder.embed([question, *texts])
    question_terms = _terms(question)
    scored = []
    for (passage, unit), vector in zip(candidates, vectors, strict=True):
        similarity = sum(a * b for a, b in zip(question_vector, vector))
        where = f"{passage.title} {passage.heading}"
        overlap = len(question_terms & _terms(unit.scoring_text() + " " + where)) / max(1, len(question_terms))
        scored.append(ScoredUnit(passage.source_n, passage, unit, similarity, similarity + 0.3 * overlap))
    return sorted(scored, key=lambda s: -s.score)


def _context(passage: Passage, unit: Unit) -> str:
    """A unit is embedded with its section's name: "15 days" means something only under "How much PTO you earn"."""
    section = passage.heading.split(" > ")[-1] if passage.heading else ""
    where = f"{passage.title} › {section}" if section else passage.title
    return f"{where}: {unit.scoring_text()}"


def compose(question: str, passages: Sequence[Passage], embedder: Embedder) -> OfflineAnswer | None:
    """The offline answer, or None when nothing retrieved addresses the question."""
    scored = score_units(question, passages, embedder)
    if not scored or scored[0].similarity < MIN_UNIT_SIMILARITY:
        return None
    best = scored[0]
    chosen: dict[int, list[ScoredUnit]] = {best.source_n: [best]}
    for candidate in scored[1:]:
        if candidate.source_n == best.source_n:
            picked = chosen[best.source_n]
            if len(picked) < MAX_UNITS_PER_DOCUMENT and candidate.score >= SAME_DOCUMENT_RATIO * best.score:
                picked.append(candidate)
        elif (
            len(chosen) < 2 and candidate.source_n not in chosen
            and candidate.score >= SECOND_SOURCE_RATIO * best.score and candidate.similarity >= MIN_UNIT_SIMILARITY
        ):
            chosen[candidate.source_n] = [candidate]
    sources = list(chosen)  # the lead document first
    return OfflineAnswer(render(chosen, sources), sources, best.similarity)


def render(chosen: dict[int, list[ScoredUnit]], sources: Sequence[int]) -> str:
    """One block per document and section: a "**Title** › Section [n]" line, then the quoted units."""
    blocks = []
    for number, source_n in enumerate(sources, start=1):
        by_section: dict[str, list[ScoredUnit]] = {}
        for item in sorted(chosen[source_n], key=lambda s: s.unit.position):
            by_section.setdefault(item.passage.heading, []).append(item)
        for heading, items in by_section.items():
            title = items[0].passage.title
            crumb = breadcrumb(title, heading)
            rest = crumb[len(title):] if crumb.startswith(title) else f" › {crumb}"
            blocks.append(f"**{_escape_markdown(title)}**{_escape_markdown(rest)} [{number}]")
            blocks.append(render_units([item.unit for item in items]))
    blocks.append(OFFLINE_NOTE)
    return "\n\n".join(blocks)


def _escape_markdown(text: str) -> str:
    return re.sub(r"([*_`\[\]])", r"\\\1", text)
