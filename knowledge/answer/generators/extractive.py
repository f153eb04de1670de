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
# When the best unit is not in the document retrieval ranked first, that document's best unit is quoted too (after
# the lead) if it scores at least this fraction of the best unit: retrieval's ranking reads the whole chunk.
TOP_DOCUMENT_RATIO = 0.8

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
    """The content words of a text, lower-cased (Chinese and Japanese: words and character bigrams,
    knowledge.storage.words): every term comparison of the offline answer goes through here (quote selection,
    widening a unit, the rows a question names), so one tokeniser serves them all."""
    return {w for w in tokens(text) if w not in _STOP}


_STOP_WORD = re.compile(r"\b(?:" + "|".join(sorted(_STOP, key=len, reverse=True)) + r")\b", re.IGNORECASE)


_NEGATED_MODAL = {"can": "can", "won": "will", "shan": "shall"}  # "can't", "won't", "shan't"
_CONTRACTION = re.compile(r"\b(\w+?)(n)?['\u2019](t|ve|ll|re|d|m|s)\b", re.IGNORECASE)
_HYPHEN = re.compile(r"(?<=[^\W\d_])-(?=[^\W\d_])")


def _expand(match: re.Match[str]) -> str:
    stem, n, suffix = match.group(1), match.group(2) or "", match.group(3).lower()
    if suffix == "t" and n:
        return _NEGATED_MODAL.get((stem + n).lower(), stem)  # "doesn't" -> "does", "can't" -> "can"
    return stem + n  # "I've" -> "I", "it's" -> "it", "we'll" -> "we"


def content_text(question: str) -> str:
    """The question's own content words, as the evidence weighs them (knowledge.answer.evidence): without the
    offline answer's stop words ("how", "many", "get"), the endings of contractions ("I've", "we'll", "doesn't") and
    the compound a hyphenated word also makes. Postgres's own stop list keeps "many", "much" and "get", and parses
    "I've" into "i" and "ve", and "write-up" into "write-up", "write" and "up"; no chunk of a small knowledge base
    holds "many", "ve" or the compound, so they read as rare terms the document lacks, and the decision hedged or
    declined a plainly answered question (issue 39). The parts of a hyphenated word stay, and are held by a document
    that writes it either way. Chinese and Japanese text is left as it is (the stop words are English)."""
    return _STOP_WORD.sub(" ", _HYPHEN.sub(" ", _CONTRACTION.sub(_expand, question)))


_CASED_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")


def specific_words(question: str) -> list[str]:
    """The words of a question that name something specific: a year, a number or a code (any word with a digit),
    an acronym, or a capitalised word past the first (a name, a place, a product). The evidence checks that the
    answering document holds them (knowledge.answer.evidence, `not_found`)."""
    words = _CASED_WORD.findall(question)
    found: list[str] = []
    for i, word in enumerate(words):
        if word.lower() in _STOP or word in found:
            continue
        has_digit = any(ch.isdigit() for ch in word)
        acronym = len(word) >= 2 and word.isupper()
        if has_digit or acronym or (i > 0 and word[0].isupper()):
            found.append(word)
    return found


_NEGATION = re.compile(r"\b(?:not|no|never|none|nobody|nothing|neither|nor|cannot|without)\b|n't\b", re.IGNORECASE)
_ASKS_TIME = re.compile(r"^\s*(?:when|what\s+(?:year|date|day|month|time|century|decade))\b|\bin\s+what\s+year\b",
                        re.IGNORECASE)
_ASKS_NUMBER = re.compile(r"\bhow\s+(?:many|much|long|old|far|often|big|large|high)\b|\bwhat\s+(?:percentage|"
                          r"number|amount|share|price|rate)\b", re.IGNORECASE)
_ASKS_NAME = re.compile(r"^\s*(?:who|whom|whose)\b", re.IGNORECASE)
_MONTH = re.compile(r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b|\b(?:19|20|1[0-8])\d\d\b|"
                    r"\b\d{1,2}(?:st|nd|rd|th)?\s+century\b|\b\d{1,4}s?\b", re.IGNORECASE)


def negation_mismatch(question: str, unit_text: str) -> float:
    """1.0 when exactly one of the question and the unit is negated ("not", "never", "n't"), else 0.0."""
    return float(bool(_NEGATION.search(question)) != bool(_NEGATION.search(unit_text)))


def answer_type(question: str, unit_text: str) -> float:
    """Whether the unit holds what the question's form asks for: a year, date or century for "when", a number for
    "how many/much", a capitalised name the question does not already hold for "who". 1.0 yes, 0.0 no, 0.5 when
    the question asks for nothing in particular."""
    if _ASKS_TIME.search(question):
        return float(bool(_MONTH.search(unit_text)))
    if _ASKS_NUMBER.search(question):
        return float(any(ch.isdigit() for ch in unit_text) or bool(re.search(
            r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|twelve|twenty|hundred|thousand|million|billion|"
            r"dozen|half|several|few)\b", unit_text, re.IGNORECASE)))
    if _ASKS_NAME.search(question):
        asked = {w.lower() for w in _CASED_WORD.findall(question)}
        return float(any(w[0].isupper() and w.lower() not in asked for w in _CASED_WORD.findall(unit_text)[1:]))
    return 0.5


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
    hedge: bool = False, not_found: Sequence[str] = (),
) -> OfflineAnswer | None:
    """The offline answer (None when no unit was found). Whether to answer at all is decided before, from the
    evidence (knowledge.answer.evidence); `hedge` labels the quote as the closest passages, which may not answer,
    and `not_found` names the parts of the question the documents did not hold."""
    scored = list(scored) if scored is not None else score_units(question, passages, embedder)
    if not scored:
        return None
    best = scored[0]
    chosen: dict[int, list[ScoredUnit]] = {best.source_n: [best]}
    defining = _defining_unit(question, [s for s in scored if s.source_n == best.source_n])
    if defining is not None:
        chosen[best.source_n] = [defining]  # "What is X?": the sentence that defines X, alone
    for candidate in scored[1:]:
        if candidate.source_n == best.source_n:
            picked = chosen[best.source_n]
            repeated = any(
                p.unit.text == candidate.unit.text or (p.unit.kind == "row" and p.unit.header == candidate.unit.header
                                                       and candidate.unit.kind == "row")
                for p in picked
            )  # overlapping chunks repeat units; a row brings its table anyway
            if (defining is None and not repeated and len(picked) < MAX_UNITS_PER_DOCUMENT
                    and candidate.score >= best.score - SAME_DOCUMENT_GAP):
                picked.append(candidate)
        elif (
            not hedge and len(chosen) < 2 and candidate.source_n not in chosen
            and candidate.score >= SECOND_SOURCE_RATIO * best.score and candidate.similarity >= MIN_UNIT_SIMILARITY
        ):
            chosen[candidate.source_n] = [candidate]
    first = next((s for s in scored if s.source_n == 1), None)  # sources are numbered in retrieval's order
    if first is not None and 1 not in chosen and first.score >= TOP_DOCUMENT_RATIO * best.score:
        chosen[1] = [first]  # retrieval's first document is quoted too when its best unit is nearly as good
    stale = _older_version(scored, best, chosen)
    if stale is not None:
        current, older = stale
        if current.source_n not in chosen:
            chosen = {current.source_n: [current], **chosen}
        chosen[older.source_n] = [older]
    for source_n in chosen:
        chosen[source_n] = whole_units(question, chosen[source_n], [s for s in scored if s.source_n == source_n])
    sources = list(chosen)  # the lead document first
    notes: list[str] = []
    if stale is not None:
        current, older = stale
        sources = [current.source_n] + [n for n in sources if n != current.source_n]
        notes.append(version_note(current, older, sources))
    return OfflineAnswer(render(chosen, sources, hedge=hedge, not_found=not_found, notes=notes,
                                later=[stale[1].source_n] if stale else ()), sources, best.similarity)


# --- the whole unit that answers ---------------------------------------------------------------------------------

# A table of at most this many rows is quoted whole once one of its rows answers and the question singles out no
# row: "How many PTO days?" asks for the table. A question naming a row ("for managers", a part number) gets that
# row with its header, plus at most MATCHING_ROWS rows naming the same terms.
SMALL_TABLE_ROWS = 8
MATCHING_ROWS = 3
# A list of at most this many items is quoted whole, under its lead-in, once one of its items answers.
SMALL_LIST_ITEMS = 8
# The steps of a procedure ("How do I…?") are quoted whole up to this many items or sentences.
MAX_STEPS = 15
_FIGURE = re.compile(r"\$?\d[\d,.:]*%?|\b(?:19|20)\d\d\b")
_PROCEDURE = re.compile(
    r"^\s*(?:how\s+(?:do|can|should|would|to|does)\b|what\s+(?:are\s+)?the\s+steps\b|steps?\s+(?:to|for)\b)|"
    r"\b(?:procedure|process|steps|instructions)\b", re.IGNORECASE)


def is_procedure(question: str) -> bool:
    """A question asking how to do something: its answer is a sequence of steps, quoted whole."""
    return bool(_PROCEDURE.search(question))


def _is_question(unit: Unit) -> bool:
    """An FAQ's question line ("**How do I reset my password?**", "Q: …?"): it names the answer, it is not one."""
    return unit.kind == "text" and unit.text.rstrip("*_ ").endswith("?")


def whole_units(question: str, picked: list[ScoredUnit], document: Sequence[ScoredUnit]) -> list[ScoredUnit]:
    """Widen the picked units of one document to the unit that answers: an FAQ question to the answer under it
    (without the question), a procedure to its steps (the section's list, or its paragraphs), a table row to its
    header and the rows the question names (a small table whole when it names none), a list item to its list
    under its lead-in, and any unit stating a figure the question asks about (an amount, a year, a number) that the
    pick left out."""
    result: list[ScoredUnit] = []
    have: set[tuple[str, str]] = set()

    def add(item: ScoredUnit) -> None:
        key = (item.passage.heading, item.unit.scoring_text())
        if key not in have:
            have.add(key)
            result.append(item)

    ordered = _distinct(sorted(document, key=lambda s: (s.passage.ordinal, s.unit.position)))
    question_terms = _terms(question)
    procedure = is_procedure(question)
    for item in picked:
        if _is_question(item.unit):
            answer = _faq_answer(item, ordered)
            if answer:
                for unit in answer:
                    add(unit)
                continue
        add(item)
        if procedure and item.unit.kind != "row":
            for step in _section_steps(item, ordered):
                add(step)
        elif item.unit.kind == "row":
            rows = _distinct([s for s in document if s.unit.kind == "row" and s.unit.header == item.unit.header])
            named = _named_rows(question_terms, item, rows)
            for row in named if named or len(rows) > SMALL_TABLE_ROWS else rows:
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


def _faq_answer(question_unit: ScoredUnit, ordered: Sequence[ScoredUnit]) -> list[ScoredUnit]:
    """The units after an FAQ question line, in the same section, up to the next question line."""
    heading = question_unit.passage.heading
    start = next((i for i, s in enumerate(ordered) if s.unit.text == question_unit.unit.text
                  and s.passage.heading == heading), None)
    if start is None:
        return []
    answer: list[ScoredUnit] = []
    for unit in ordered[start + 1:]:
        if unit.passage.heading != heading or _is_question(unit.unit) or len(answer) >= MAX_STEPS:
            break
        answer.append(unit)
    return answer


def _section_steps(item: ScoredUnit, ordered: Sequence[ScoredUnit]) -> list[ScoredUnit]:
    """The steps of the section the picked unit is in: its list items (with their lead-in), or, without a list, its
    sentences, in order, up to the next heading."""
    section = [s for s in ordered if s.passage.heading == item.passage.heading and not _is_question(s.unit)]
    steps = [s for s in section if s.unit.kind == "list"]
    return (steps or [s for s in section if s.unit.kind == "text"])[:MAX_STEPS]


def _named_rows(question_terms: set[str], picked: ScoredUnit, rows: Sequence[ScoredUnit]) -> list[ScoredUnit]:
    """The rows a question singles out: those holding the question's most telling terms (a term in fewer rows
    tells more; header words and terms in most rows tell nothing), at most MATCHING_ROWS, the picked row first when
    it is one of them. Empty when the question names no row."""
    header_terms = _terms(" ".join(picked.unit.header))
    cells = {id(row): _terms(" ".join(row.unit.cells)) - header_terms for row in rows}
    in_rows = {term: sum(term in cells[id(row)] for row in rows) for term in question_terms}
    telling = {term for term, count in in_rows.items() if 0 < count <= max(1, len(rows) // 2)}
    if not telling:
        return []
    weight = {id(row): sum(1.0 / in_rows[t] for t in telling & cells[id(row)]) for row in rows}
    top = max(weight.values())
    named = [row for row in rows if weight[id(row)] >= top > 0]
    named.sort(key=lambda row: row.unit.text != picked.unit.text)
    return named[:MATCHING_ROWS]


_DEFINITION_QUESTION = re.compile(
    r"^\s*(?:what\s+(?:is|are|does)\s+(?:an?\s+|the\s+)?(?P<a>.+?)(?:\s+mean|\s+stand\s+for)?|define\s+(?P<b>.+?)|"
    r"what\s+is\s+meant\s+by\s+(?P<c>.+?))\s*\??\s*$", re.IGNORECASE)
_DEFINES = re.compile(r"\b(?:is|are|means|refers\s+to|stands\s+for|is\s+defined\s+as)\b", re.IGNORECASE)


def _defining_unit(question: str, document: Sequence[ScoredUnit]) -> ScoredUnit | None:
    """For "What is X?" / "What does X mean?": the sentence of the document that defines X ("X is …", "X means …"),
    when there is one."""
    match = _DEFINITION_QUESTION.match(question)
    if not match:
        return None
    subject = _terms(match.group("a") or match.group("b") or match.group("c") or "")
    if not subject or len(subject) > 4:
        return None
    for item in document:
        if item.unit.kind != "text":
            continue
        verb = _DEFINES.search(item.unit.text)
        if verb and verb.start() <= 80 and subject <= _terms(item.unit.text[: verb.start()]):
            return item
    return None


# --- the current version -------------------------------------------------------------------------------------------

# Another document's unit is read as a version of the same statement when it scores at least this share of the best
# unit's score and states a different figure.
VERSION_RATIO = 0.85
_YEAR = re.compile(r"\b(?:19|20)\d\d\b")
_EFFECTIVE = re.compile(r"\b(?:effective|as of|valid from|from|starting|since|updated|revised)\b[^.\n]{0,30}?"
                        r"\b((?:19|20)\d\d)\b", re.IGNORECASE)
_REPLACES = re.compile(r"\b(?:supersedes?|superseded|replaces?|no longer|instead of|previously|was changed)\b",
                       re.IGNORECASE)
_NOTES = re.compile(r"\b(?:meeting|minutes|notes|proposals?|proposed|draft|discussion|agenda)\b", re.IGNORECASE)


def currency(passages: Sequence[Passage]) -> tuple[int, int, int]:
    """How current a document reads, higher is newer: whether it says it replaces something ("supersedes",
    "replaces", "no longer"), whether it is a settled document rather than notes of a meeting or a proposal, and
    its year (of its title, else of an effective date in its text, else 0)."""
    title = passages[0].title if passages else ""
    text = " ".join(p.text for p in passages)
    years = [int(y) for y in _YEAR.findall(title)] or [int(y) for y in _EFFECTIVE.findall(text)]
    settled = not _NOTES.search(f"{title} {' '.join(p.heading for p in passages)}")
    return int(bool(_REPLACES.search(text))), int(settled), max(years, default=0)


def _older_version(
    scored: Sequence[ScoredUnit], best: ScoredUnit, chosen: dict[int, list[ScoredUnit]],
) -> tuple[ScoredUnit, ScoredUnit] | None:
    """(the current document's unit, the older document's unit) when two documents state the same kind of fact
    differently, else None."""
    rival = next((s for s in scored if s.source_n != best.source_n and s.score >= VERSION_RATIO * best.score
                  and s.similarity >= MIN_UNIT_SIMILARITY), None)
    if rival is None:
        return None
    figures = set(_FIGURE.findall(best.unit.scoring_text())), set(_FIGURE.findall(rival.unit.scoring_text()))
    if not figures[0] or not figures[1] or figures[0] == figures[1]:
        return None

    def of(source_n: int) -> tuple[int, int, int]:
        seen = {s.passage.ordinal: s.passage for s in scored if s.source_n == source_n}
        return currency([seen[k] for k in sorted(seen)])

    best_currency, rival_currency = of(best.source_n), of(rival.source_n)
    if best_currency == rival_currency:
        return None
    return (best, rival) if best_currency > rival_currency else (rival, best)


def version_note(current: ScoredUnit, older: ScoredUnit, sources: Sequence[int]) -> str:
    """The line that says an older document differs, naming both, in citation numbers."""
    numbers = {n: i for i, n in enumerate(sources, start=1)}
    return (f"_Note: {_escape_markdown(older.passage.title)} [{numbers[older.source_n]}] states this differently; "
            f"{_escape_markdown(current.passage.title)} [{numbers[current.source_n]}], quoted first, is the current "
            "version._")


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


def not_found_note(words: Sequence[str]) -> str:
    """Which part of the question the documents did not hold: "Not found in these documents: “Tokyo”."."""
    return "_Not found in these documents: " + ", ".join(f"“{_escape_markdown(w)}”" for w in words) + "._"


def render(
    chosen: dict[int, list[ScoredUnit]], sources: Sequence[int], *, hedge: bool = False,
    not_found: Sequence[str] = (), notes: Sequence[str] = (), later: Sequence[int] = (),
) -> str:
    """One block per document and section: a "**Title** › Section [n]" line, then the quoted units (after a label
    saying they may not answer, for a hedge, and naming what the documents did not hold); `notes` follow."""
    blocks = [HEDGE_NOTE] if hedge else []
    if not_found:
        blocks.append(not_found_note(not_found))
    for number, source_n in enumerate(sources, start=1):
        if source_n in later:
            blocks.extend(notes)  # the older version comes after the note that says it is older
            notes = ()
        by_section: dict[str, list[ScoredUnit]] = {}
        for item in sorted(chosen[source_n], key=lambda s: (s.passage.ordinal, s.unit.position)):
            by_section.setdefault(item.passage.heading, []).append(item)
        for heading, items in by_section.items():
            title = items[0].passage.title
            crumb = breadcrumb(title, heading)
            rest = crumb[len(title):] if crumb.startswith(title) else f" › {crumb}"
            blocks.append(f"**{_escape_markdown(title)}**{_escape_markdown(rest)} [{number}]")
            blocks.append(render_units([item.unit for item in items]))
    blocks.extend(notes)
    blocks.append(OFFLINE_NOTE)
    return "\n\n".join(blocks)


def _escape_markdown(text: str) -> str:
    return re.sub(r"([*_`\[\]])", r"\\\1", text)
