"""Chunks → quotable units, and units → readable Markdown, for the offline (extractive) answer.

A chunk's text keeps its structure: paragraphs are separated by blank lines, list items and table rows start their
own line (see `knowledge.ingest.chunking`). A unit is the smallest piece that still makes sense on its own:
- a sentence, together with the sentence before it when it leans on it ("This applies to…", or a lead-in ending in
  a colon);
- a table row, together with its table's header row (rendered as a small Markdown table, never glued to prose);
- a list item, together with its lead-in sentence.
Units are scored and quoted whole; units of different sections are never joined into one line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from knowledge.ingest.chunking import CJK_LIST_MARKER, split_sentences

BREADCRUMB_SEPARATOR = " › "

_LIST_ITEM = re.compile(rf"^\s*(?:(?:[-*+•]|\d+[.)])\s+|(?:{CJK_LIST_MARKER})\s*)(?:\[[ xX]\]\s+)?")
# A sentence opening with one of these usually leans on the sentence before it.
_DEPENDENT_START = re.compile(
    r"^(?:this|that|these|those|it|its|they|them|their|such|however|but|also|otherwise|then|instead|therefore|"
    r"so|thus|both|either|neither|in that case|in this case|if not|if so|after that|as a result|for example|"
    r"for these|the above|the same|here|there)\b",
    re.IGNORECASE,
)


def breadcrumb(title: str, heading: str) -> str:
    """"Title › Section › Subsection" with one separator, and without the title repeated as the first heading
    (an HTML page's <h1> is usually its <title>, sometimes with the site name appended)."""
    parts = [p.strip() for p in re.split(r"\s+[>›]\s+", heading) if p.strip()] if heading else []
    title_key = title.strip().casefold()
    while parts and (parts[0].casefold() == title_key or title_key.startswith(parts[0].casefold())):
        parts.pop(0)
    return BREADCRUMB_SEPARATOR.join([title.strip(), *parts]) if title.strip() else BREADCRUMB_SEPARATOR.join(parts)


def section_path(title: str, heading: str) -> str:
    """The heading part of the breadcrumb ("Section › Subsection"), without a repeat of the title."""
    crumb = breadcrumb(title, heading)
    return crumb[len(title.strip()):].removeprefix(BREADCRUMB_SEPARATOR) if crumb.startswith(title.strip()) else crumb


def _cells(line: str) -> list[str] | None:
    """The cells of a table row (`| a | b |` from Markdown, `a | b` from HTML and DOCX tables), else None."""
    stripped = line.strip()
    if stripped.count("|") < (1 if not stripped.startswith("|") else 2):
        return None
    cells = [c.strip() for c in stripped.strip("|").split("|")]
    return cells if len(cells) >= 2 else None


@dataclass(frozen=True)
class Unit:
    """One quotable piece of a chunk.

    kind: "text" (one or two sentences), "list" (an item and its lead-in), "row" (a table row and its header).
    `position` orders units of one document as they appear (chunk ordinal, then place in the chunk).
    """

    kind: str
    text: str  # what is shown (for a row: the row's cells joined by " | ")
    lead: str = ""  # the lead-in sentence of a list item, or the sentence a dependent sentence leans on
    header: tuple[str, ...] = ()  # a row's header cells
    cells: tuple[str, ...] = ()  # a row's cells
    position: tuple[int, int] = (0, 0)

    def scoring_text(self) -> str:
        """What is compared with the question: a row reads as "header: value; …" so it means something alone."""
        if self.kind == "row":
            if self.header and len(self.header) == len(self.cells):
                return "; ".join(f"{h}: {c}" for h, c in zip(self.header, self.cells, strict=False))
            return ", ".join(self.cells)
        return f"{self.lead} {self.text}".strip()


def units_of(text: str, ordinal: int = 0) -> list[Unit]:
    """Split one chunk's text into units, in order."""
    units: list[Unit] = []
    header: tuple[str, ...] | None = None  # the header row of the table being read, if any
    previous_sentence = ""
    lead_in = ""  # the sentence introducing the list being read
    index = 0
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines() if any(ch.isalnum() for ch in line)]
        if not lines:
            continue
        prose: list[str] = []

        def flush_prose() -> None:
            nonlocal previous_sentence, lead_in, index
            if not prose:  # noqa: B023 (the closure runs within this iteration)
                return
            for sentence in split_sentences(" ".join(prose)):  # noqa: B023 (the closure runs within this iteration)
                lean = previous_sentence if (_DEPENDENT_START.match(sentence) or previous_sentence.endswith((":", "："))) else ""
                units.append(Unit("text", sentence, lead=lean, position=(ordinal, index)))
                index += 1
                previous_sentence = sentence
            lead_in = previous_sentence if previous_sentence.endswith((":", "：")) else ""
            prose.clear()  # noqa: B023 (the closure runs within this iteration)

        for line in lines:
            cells = _cells(line)
            if cells is not None and not _LIST_ITEM.match(line):
                flush_prose()
                if header is None or len(cells) != len(header):
                    header = tuple(cells)  # a new table starts with its header row
                else:
                    units.append(Unit("row", " | ".join(cells), header=header, cells=tuple(cells), position=(ordinal, index)))
                    index += 1
                continue
            header = None
            if _LIST_ITEM.match(line):
                flush_prose()
                item = _LIST_ITEM.sub("", line).strip()
                units.append(Unit("list", item, lead=lead_in, position=(ordinal, index)))
                index += 1
            else:
                prose.append(line.strip())
        flush_prose()
        # A table in HTML or DOCX comes one row per paragraph, so a header survives blank lines; prose ends it.
    return units


def render_units(units: Sequence[Unit]) -> str:
    """Markdown for units of one section, in document order: prose as paragraphs, list items as a list under
    their lead-in, table rows as one table under their header row."""
    blocks: list[str] = []
    shown_leads: set[str] = set()
    list_leads = {u.lead for u in units if u.kind == "list" and u.lead}
    i = 0
    # A sentence that is also the lead-in of a quoted list is shown once, above its list.
    ordered, seen = [], set()
    for u in sorted(units, key=lambda u: u.position):
        if (u.kind == "text" and u.text in list_leads) or (u.kind, u.text) in seen:
            continue  # overlapping chunks repeat units: each is shown once
        seen.add((u.kind, u.text))
        ordered.append(u)
    while i < len(ordered):
        unit = ordered[i]
        if unit.kind == "row":
            rows = [unit]
            while i + 1 < len(ordered) and ordered[i + 1].kind == "row" and ordered[i + 1].header == unit.header:
                i += 1
                rows.append(ordered[i])
            header = unit.header
            table = [_row(header), "|" + "|".join("---" for _ in header) + "|"] + [_row(r.cells) for r in rows]
            blocks.append("\n".join(table))
        elif unit.kind == "list":
            items = [unit]
            while i + 1 < len(ordered) and ordered[i + 1].kind == "list" and ordered[i + 1].lead == unit.lead:
                i += 1
                items.append(ordered[i])
            lines = []
            if unit.lead and unit.lead not in shown_leads:
                lines.append(unit.lead)
                lines.append("")
                shown_leads.add(unit.lead)
            lines += [f"- {item.text}" for item in items]
            blocks.append("\n".join(lines))
        else:
            sentences = []
            if unit.lead and unit.lead not in shown_leads and (not blocks or unit.lead not in blocks[-1]):
                sentences.append(unit.lead)
            sentences.append(unit.text)
            # consecutive sentences of the same paragraph read as one paragraph
            while (
                i + 1 < len(ordered) and ordered[i + 1].kind == "text"
                and ordered[i + 1].position == (unit.position[0], ordered[i].position[1] + 1)
            ):
                i += 1
                if ordered[i].text not in sentences:
                    sentences.append(ordered[i].text)
            blocks.append(" ".join(sentences))
        i += 1
    return "\n\n".join(blocks)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
