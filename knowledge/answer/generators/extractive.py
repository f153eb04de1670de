"""The offline answer: the passage that best answers the question, quoted whole under its title and heading.

Used when no ANTHROPIC_API_KEY is set (or the API fails). It never paraphrases, so it cannot state anything the
documents do not say. How it reads:
- the best unit (a sentence with the one it leans on, a table row with its header, a list item with its lead-in;
  see `passages`) decides the lead document; the units of that document that score close to it are quoted with it,
  grouped under "Title › Section [1]";
- a second document is quoted only when its best unit scores nearly as well as the lead (it adds something);
- a picked unit is widened to the unit that answers (`whole_units`): a small table whole with its header, a short
  list whole under its lead-in, and any unit stating a figure the question names;
- whether to quote at all, and whether as an answer or as the closest passages, is decided before, from the
  evidence (knowledge.answer.evidence; docs/answers.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from knowledge.answer.generators.passages import Unit, breadcrumb, render_units, units_of
from knowledge.embedding.encoder import Embedder
from knowledge.storage.words import tokens

OFFLINE_NOTE = "_Quoted from your documents as written (offline mode: set ANTHROPIC_API_KEY for composed answers)._"

# A second document is quoted only when its best unit is at least this similar to the question (whether to answer at
# all is decided by knowledge.answer.evidence).
MIN_UNIT_SIMILARITY = 0.45
# Other units of the lead document are quoted when they score within this of the best unit (a best unit far ahead
# of the rest still leaves room for the table row or list that holds the figure).
SAME_DOCUMENT_GAP = 0.25
# A second document is quoted when its best unit scores at least this fraction of the best unit.
SECOND_SOURCE_RATIO = 0.95
MAX_UNITS_PER_DOCUMENT = 4

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
    """Lower-cased words (Chinese and Japanese: words and character bigrams, knowledge.storage.words)."""
    return {w for w in tokens(text) if w not in _STOP}


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
        similarity = sum(a * b for a, b in zip(question_vector, vector, strict=False))
        where = f"{passage.title} {passage.heading}"
        overlap = len(question_terms & _terms(unit.scoring_text() + " " + where)) / max(1, len(question_terms))
        scored.append(ScoredUnit(passage.source_n, passage, unit, similarity, similarity + 0.3 * overlap))
    return sorted(scored, key=lambda s: -s.score)


def _context(passage: Passage, unit: Unit) -> str:
    """A unit is embedded with its section's name: "15 days" means something only under "How much PTO you earn"."""
    section = passage.heading.split(" > ")[-1] if passage.heading else ""
    where = f"{passage.title} › {section}" if section else passage.title
    return f"{where}: {unit.scoring_text()}"


def compose(
    question: str, passages: Sequence[Passage], embedder: Embedder, *, scored: Sequence[ScoredUnit] | None = None,
    hedge: bool = False,
) -> OfflineAnswer | None:
    """The offline answer (None when no unit was found). Whether to answer at all is decided before, from the
    evidence (knowledge.answer.evidence); `hedge` labels the quote as the closest passages, which may not answer."""
    scored = list(scored) if scored is not None else score_units(question, passages, embedder)
    if not scored:
        return None
    best = scored[0]
    chosen: dict[int, list[ScoredUnit]] = {best.source_n: [best]}
    for candidate in scored[1:]:
        if candidate.source_n == best.source_n:
            picked = chosen[best.source_n]
            repeated = any(
                p.unit.text == candidate.unit.text or (p.unit.kind == "row" and p.unit.header == candidate.unit.header
                                                       and candidate.unit.kind == "row")
                for p in picked
            )  # overlapping chunks repeat units; a row brings its table anyway
            if not repeated and len(picked) < MAX_UNITS_PER_DOCUMENT and candidate.score >= best.score - SAME_DOCUMENT_GAP:
                picked.append(candidate)
        elif (
            not hedge and len(chosen) < 2 and candidate.source_n not in chosen
            and candidate.score >= SECOND_SOURCE_RATIO * best.score and candidate.similarity >= MIN_UNIT_SIMILARITY
        ):
            chosen[candidate.source_n] = [candidate]
    for source_n in chosen:
        chosen[source_n] = whole_units(question, chosen[source_n], [s for s in scored if s.source_n == source_n])
    sources = list(chosen)  # the lead document first
    return OfflineAnswer(render(chosen, sources, hedge=hedge), sources, best.similarity)


# A table of at most this many rows is quoted whole once one of its rows answers: "How many PTO days?" asks for
# the table, and a row without its neighbours hides the figure the asker's own case needs.
SMALL_TABLE_ROWS = 8
# A list of at most this many items is quoted whole, under its lead-in, once one of its items answers.
SMALL_LIST_ITEMS = 8
_FIGURE = re.compile(r"\$?\d[\d,.:]*%?|\b(?:19|20)\d\d\b")


def whole_units(question: str, picked: list[ScoredUnit], document: Sequence[ScoredUnit]) -> list[ScoredUnit]:
    """Widen the picked units of one document to the unit that answers: every row of a small table (of a large
    one, the rows the question names), every item of a short list, and any unit stating a figure the question asks
    about (an amount, a year, a number) that the pick left out."""
    result = list(picked)
    have = {(s.passage.heading, s.unit.scoring_text()) for s in result}

    def add(item: ScoredUnit) -> None:
        key = (item.passage.heading, item.unit.scoring_text())
        if key not in have:
            have.add(key)
            result.append(item)

    question_terms = _terms(question)
    for item in list(picked):
        if item.unit.kind == "row":
            rows = _distinct([s for s in document if s.unit.kind == "row" and s.unit.header == item.unit.header])
            if len(rows) <= SMALL_TABLE_ROWS:
                for row in rows:
                    add(row)
            else:
                for row in rows:
                    if question_terms & _terms(" ".join(row.unit.cells)):
                        add(row)
        elif item.unit.kind == "text" and item.unit.text.endswith(":"):
            # a lead-in is quoted with the list it introduces
            items = _distinct([s for s in document if s.unit.kind == "list" and s.unit.lead == item.unit.text])
            if len(items) <= SMALL_LIST_ITEMS:
                for entry in items:
                    add(entry)
        elif item.unit.kind == "list" and item.unit.lead:
            items = _distinct([s for s in document if s.unit.kind == "list" and s.unit.lead == item.unit.lead])
            if len(items) <= SMALL_LIST_ITEMS:
                for entry in items:
                    add(entry)
    shown = " ".join(s.unit.scoring_text() for s in result)
    titles = " ".join({s.passage.title for s in document})
    for figure in _FIGURE.findall(question):
        if figure not in shown and figure not in titles:  # "401" of "401(k)" names the topic, it asks no figure
            holder = next((s for s in document if figure in s.unit.scoring_text()), None)
            if holder is not None:
                add(holder)
    return result


def _distinct(items: Sequence[ScoredUnit]) -> list[ScoredUnit]:
    """One of each unit (overlapping chunks repeat rows and items)."""
    seen: set[str] = set()
    out = []
    for item in items:
        if item.unit.text not in seen:
            seen.add(item.unit.text)
            out.append(item)
    return out


HEDGE_NOTE = "_These are the closest passages I found; they may not answer your question._"


def render(chosen: dict[int, list[ScoredUnit]], sources: Sequence[int], *, hedge: bool = False) -> str:
    """One block per document and section: a "**Title** › Section [n]" line, then the quoted units (after a label
    saying they may not answer, for a hedge)."""
    blocks = [HEDGE_NOTE] if hedge else []
    for number, source_n in enumerate(sources, start=1):
        by_section: dict[str, list[ScoredUnit]] = {}
        for item in sorted(chosen[source_n], key=lambda s: (s.passage.ordinal, s.unit.position)):
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
