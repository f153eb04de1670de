"""Structure-aware chunking: split on headings, then paragraphs, then sentences, measured in model tokens.

Every chunk knows its document title and heading breadcrumb. Both are prepended to the text that is embedded and
searched, because a chunk that says "You get 5 days" only means something under "Leave policy > Sick leave".
Consecutive chunks of one section overlap by whole sentences, so an answer that straddles a boundary survives.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from knowledge.ingest.parsing import Block, ParsedDocument

TokenCounter = Callable[[Sequence[str]], list[int]]


@dataclass(frozen=True)
class ChunkDraft:
    ordinal: int
    text: str  # the chunk's own text, as shown in citations
    heading: str  # "Section > Subsection", empty for text before the first heading
    search_text: str  # title + heading + text: what is embedded and what BM25 indexes
    # Tokens of search_text, summed over its parts (prefix, header row, sentences), each counted once: exact for
    # WordPiece tokenizers such as the default model's, which split on whitespace before anything else, since the
    # parts are joined by whitespace; within about a token per part for others.
    token_count: int


@dataclass(frozen=True)
class _Unit:
    text: str
    tokens: int
    separator: str  # what joins it to the unit before: "\n\n" new paragraph, "\n" new line, " " same line


# Chinese and Japanese end sentences with 。！？ (and a closing quote or bracket may follow) and need no space after.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9\"'(\[])"
                           r"|(?<=[。！？])(?![」』”’）)])\s*(?=\S)|(?<=[。！？][」』”’）)])\s*(?=\S)")
# List markers of Chinese and Japanese text: 1、 一、 （1） ① ・ (besides - * + • 1. 1)).
CJK_LIST_MARKER = r"\d+[、．]|[一二三四五六七八九十]+、|[（(]\d+[）)]|[\u2460-\u2473]|・"
_LIST_LINE = re.compile(rf"^\s*([-*+•]|\d+[.)]|\||{CJK_LIST_MARKER})\s*")


def chunk_document(
    document: ParsedDocument, count_tokens: TokenCounter, max_tokens: int = 256, overlap_tokens: int = 40
) -> list[ChunkDraft]:
    drafts: list[ChunkDraft] = []
    for headings, header, blocks in _sections(document.blocks):
        heading = _shorten(" > ".join(headings), MAX_HEADING_CHARS)
        prefix = search_prefix(document.title, heading)
        prefix_tokens = count_tokens([prefix])[0] if prefix else 0
        # Spreadsheet rows: the header row opens every chunk, and rows are whole records, so no overlap.
        header_tokens = count_tokens([header])[0] if header else 0
        budget = max(32, max_tokens - prefix_tokens - header_tokens)
        units = _units(blocks, count_tokens, budget)
        for body, body_tokens in _pack(units, budget, 0 if header else min(overlap_tokens, budget // 2)):
            if header:
                body = f"{header}\n{body}"
            search_text = compose_search_text(document.title, heading, body)
            # The sum of the counted parts rather than a second pass of the tokenizer over the same text.
            tokens = header_tokens + body_tokens + (prefix_tokens if search_text != body else 0)
            drafts.append(ChunkDraft(len(drafts), body, heading, search_text, tokens))
    if not drafts and document.title:
        # A document with a title and no body is still findable by its title.
        drafts.append(ChunkDraft(0, document.title, "", document.title, count_tokens([document.title])[0]))
    return drafts


# Titles and breadcrumbs are repeated in every chunk; a runaway one must not eat the chunk's token budget.
MAX_TITLE_CHARS = 150
MAX_HEADING_CHARS = 200


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def search_prefix(title: str, heading: str) -> str:
    return "\n".join(part for part in (_shorten(title, MAX_TITLE_CHARS), heading) if part)


def compose_search_text(title: str, heading: str, text: str) -> str:
    """What is embedded and indexed for a chunk. Re-embedding after a model change rebuilds it from stored rows."""
    if text == title and not heading:
        return title
    return "\n".join(part for part in (search_prefix(title, heading), text) if part)


def _sections(blocks: Sequence[Block]) -> list[tuple[tuple[str, ...], str, list[Block]]]:
    """Runs of blocks under the same headings (and, for spreadsheet rows, the same header row)."""
    sections: list[tuple[tuple[str, ...], str, list[Block]]] = []
    for block in blocks:
        if sections and sections[-1][0] == block.headings and sections[-1][1] == block.header:
            sections[-1][2].append(block)
        else:
            sections.append((block.headings, block.header, [block]))
    return sections


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of a paragraph; list items and table rows stay one unit each, soft-wrapped lines are joined."""
    return [sentence for sentence, _ in _sentences_with_line_starts(paragraph)]


def _sentences_with_line_starts(paragraph: str) -> list[tuple[str, bool]]:
    lines: list[str] = []
    for line in paragraph.splitlines():
        if not any(ch.isalnum() for ch in line):
            continue  # blank lines, and table rules such as |---|---|
        if lines and not _LIST_LINE.match(line):
            lines[-1] = f"{lines[-1]} {line.strip()}"
        else:
            lines.append(line.strip())
    sentences: list[tuple[str, bool]] = []
    for line in lines:
        parts = [part.strip() for part in _SENTENCE_END.split(line) if part.strip()]
        sentences.extend((part, i == 0) for i, part in enumerate(parts))
    return sentences


def _units(blocks: Sequence[Block], count_tokens: TokenCounter, budget: int) -> list[_Unit]:
    """Sentences with token counts; a sentence longer than the budget is cut into word windows."""
    texts: list[str] = []
    separators: list[str] = []
    for block in blocks:
        for i, (sentence, starts_line) in enumerate(_sentences_with_line_starts(block.text)):
            texts.append(sentence)
            # Spreadsheet rows are lines of one table; other blocks are paragraphs.
            separators.append(("\n" if block.header else "\n\n") if i == 0 else "\n" if starts_line else " ")
    counts = count_tokens(texts) if texts else []
    units: list[_Unit] = []
    for text, tokens, separator in zip(texts, counts, separators, strict=True):
        if tokens <= budget:
            units.append(_Unit(text, tokens, separator))
            continue
        for i, (piece, piece_tokens) in enumerate(_split_to_budget(text, tokens, count_tokens, budget)):
            units.append(_Unit(piece, piece_tokens, separator if i == 0 else " "))
    return units


def _split_to_budget(text: str, tokens: int, count_tokens: TokenCounter, budget: int) -> list[tuple[str, int]]:
    """Halve an over-long sentence until every piece fits: at the space nearest the middle, or mid-text for
    scripts written without spaces (Chinese, Japanese) and for long URLs or base64."""
    if tokens <= budget or len(text) < 2:
        return [(text, tokens)]
    middle = len(text) // 2
    left_space, right_space = text.rfind(" ", 0, middle), text.find(" ", middle)
    candidates = [i for i in (left_space, right_space) if i > 0]
    cut = min(candidates, key=lambda i: abs(i - middle)) if candidates else middle
    halves = [text[:cut].strip(), text[cut:].strip()]
    pieces: list[tuple[str, int]] = []
    for half, half_tokens in zip(halves, count_tokens(halves), strict=True):
        if half:
            pieces.extend(_split_to_budget(half, half_tokens, count_tokens, budget))
    return pieces


def _pack(units: Sequence[_Unit], budget: int, overlap_tokens: int) -> list[tuple[str, int]]:
    """Greedy packing of units into chunks of at most `budget` tokens, with trailing-sentence overlap. Returns
    (text, tokens) per chunk."""
    chunks: list[tuple[str, int]] = []
    current: list[_Unit] = []
    size = 0
    fresh = 0  # units in `current` that no earlier chunk already contains
    for unit in units:
        if current and size + unit.tokens > budget:
            chunks.append((_join(current), size))
            carried: list[_Unit] = []
            carried_size = 0
            for previous in reversed(current):
                if carried_size + previous.tokens > overlap_tokens or carried_size + previous.tokens + unit.tokens > budget:
                    break
                carried.insert(0, previous)
                carried_size += previous.tokens
            current, size, fresh = carried, carried_size, 0
        current.append(unit)
        size += unit.tokens
        fresh += 1
    if current and fresh:
        chunks.append((_join(current), size))
    return chunks


def _join(units: Sequence[_Unit]) -> str:
    return units[0].text + "".join(unit.separator + unit.text for unit in units[1:])
