"""Turn a file's bytes into a structured document: a title and a list of blocks, each under a heading path.

Keeping the heading path is what lets the chunker split on structure and what lets every chunk say where it came
from ("Expenses > Travel > Hotels"). Each format uses the library that already reads it: BeautifulSoup for HTML,
pypdf for PDF, python-docx for Word.
"""

from __future__ import annotations

import io
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import PurePosixPath

# pypdf logs every oddity of a damaged file; the sync reports unreadable files itself.
logging.getLogger("pypdf").setLevel(logging.ERROR)

SUPPORTED_SUFFIXES = (".md", ".markdown", ".txt", ".html", ".htm", ".pdf", ".docx")


class UnsupportedFormat(ValueError):
    """The file's type is not one ragbot reads."""


class CorruptDocument(ValueError):
    """The file claims a supported type but could not be read."""


@dataclass(frozen=True)
class Block:
    """A run of text (a paragraph, list item, table row...) under a heading path."""

    headings: tuple[str, ...]
    text: str


@dataclass
class ParsedDocument:
    title: str
    blocks: list[Block] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n\n".join(block.text for block in self.blocks)


def parse_document(data: bytes, filename: str) -> ParsedDocument:
    """Parse `data` according to `filename`'s suffix. Raises UnsupportedFormat or CorruptDocument."""
    suffix = PurePosixPath(filename).suffix.lower()
    fallback_title = _title_from_filename(filename)
    try:
        if suffix in (".md", ".markdown"):
            return parse_markdown(_decode(data), fallback_title)
        if suffix == ".txt":
            return parse_plain_text(_decode(data), fallback_title)
        if suffix in (".html", ".htm"):
            return parse_html(_decode(data), fallback_title)
        if suffix == ".pdf":
            return parse_pdf(data, fallback_title)
        if suffix == ".docx":
            return parse_docx(data, fallback_title)
    except (UnsupportedFormat, CorruptDocument):
        raise
    except Exception as exc:  # each library raises its own zoo of errors on a damaged file
        raise CorruptDocument(f"could not read {suffix} file: {exc}") from exc
    raise UnsupportedFormat(f"unsupported file type {suffix or '(none)'}; ragbot reads {', '.join(SUPPORTED_SUFFIXES)}")


def _title_from_filename(filename: str) -> str:
    stem = PurePosixPath(filename).stem
    return re.sub(r"[-_]+", " ", stem).strip().capitalize() or filename


def _decode(data: bytes) -> str:
    if b"\x00" in data[:4096]:
        raise CorruptDocument("file looks binary (contains NUL bytes), not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _clean(text: str) -> str:
    return re.sub(r"[ \t\r\f\v]+", " ", text).strip()


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_MD_FENCE = re.compile(r"^\s*(```|~~~)")


def parse_markdown(text: str, fallback_title: str) -> ParsedDocument:
    """Headings start sections; blank lines end paragraphs; fenced code stays one block."""
    title = ""
    headings: list[tuple[int, str]] = []
    blocks: list[Block] = []
    paragraph: list[str] = []
    in_fence = False

    def flush() -> None:
        if paragraph:
            body = "\n".join(paragraph).strip()
            if body:
                blocks.append(Block(tuple(h for _, h in headings), body))
            paragraph.clear()

    for line in text.splitlines():
        if _MD_FENCE.match(line):
            in_fence = not in_fence
            paragraph.append(line)
            continue
        heading = None if in_fence else _MD_HEADING.match(line)
        if heading:
            flush()
            level, name = len(heading.group(1)), _strip_markdown(heading.group(2))
            if level == 1 and not title:
                title = name
                continue
            headings = [(lvl, h) for lvl, h in headings if lvl < level] + [(level, name)]
        elif not line.strip() and not in_fence:
            flush()
        else:
            paragraph.append(line.rstrip())
    flush()
    return ParsedDocument(title or fallback_title, blocks)


def _strip_markdown(text: str) -> str:
    return re.sub(r"[*_`]+", "", text).strip()


def parse_plain_text(text: str, fallback_title: str) -> ParsedDocument:
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    return ParsedDocument(fallback_title, [Block((), p) for p in paragraphs])


_HTML_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
_HTML_TEXT_BLOCKS = ("p", "li", "pre", "blockquote", "tr", "dt", "dd", "figcaption")


def parse_html(html: str, fallback_title: str) -> ParsedDocument:
    """Walk the body in document order: headings open sections, block elements become blocks."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "noscript", "nav", "footer", "header", "template"]):
        tag.decompose()
    title = _clean(soup.title.get_text()) if soup.title else ""
    if soup.title:
        soup.title.decompose()
    headings: list[tuple[int, str]] = []
    blocks: list[Block] = []
    root = soup.body or soup
    for element in root.find_all(list(_HTML_HEADINGS) + list(_HTML_TEXT_BLOCKS)):
        if element.find_parent(list(_HTML_TEXT_BLOCKS)) is not None:
            continue  # nested: the outer block already holds this text
        if element.name in _HTML_HEADINGS:
            level, name = int(element.name[1]), _clean(element.get_text(" "))
            if level == 1 and not title:
                title = name
                continue
            if level == 1 and name == title:
                continue
            headings = [(lvl, h) for lvl, h in headings if lvl < level] + [(level, name)]
            continue
        if element.name == "tr":
            text = " | ".join(_clean(cell.get_text(" ")) for cell in element.find_all(["th", "td"]))
        else:
            text = _clean(element.get_text(" "))
        if text:
            blocks.append(Block(tuple(h for _, h in headings), text))
    if not blocks:  # a page with bare text and no block elements
        text = _clean(root.get_text(" "))
        if text:
            blocks.append(Block((), text))
    return ParsedDocument(title or fallback_title, blocks)


def parse_pdf(data: bytes, fallback_title: str) -> ParsedDocument:
    """Headings are the lines set in a larger font than the body text (pypdf reports each run's font size);
    lines repeated on most pages (running headers, footers) and page numbers are dropped."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        raise CorruptDocument("PDF is encrypted; export an unencrypted copy to index it")
    pages: list[list[tuple[str, float]]] = []  # per page: (line, largest font size on it)
    for page in reader.pages:
        fragments: list[tuple[str, float]] = []

        def visit(text: str, _cm: object, tm: list[float], _font: object, size: float) -> None:
            fragments.append((text, round(abs(size * (tm[3] or 1)), 1)))

        page.extract_text(visitor_text=visit)
        lines: list[tuple[str, float]] = []
        line, line_size = "", 0.0
        for fragment, size in fragments + [("\n", 0.0)]:
            if fragment.strip():
                line_size = max(line_size, size)
            line += fragment
            if fragment.endswith("\n"):
                for part in line.splitlines():
                    if part.strip():
                        lines.append((_clean(part), line_size))
                line, line_size = "", 0.0
        pages.append(lines)

    if not any(pages):
        raise CorruptDocument("PDF has no extractable text (scanned images need OCR first)")
    repeated = _repeated_lines([[text for text, _ in page] for page in pages])
    weight: Counter[float] = Counter()  # font size -> characters of body text set in it
    for text, size in (entry for page in pages for entry in page):
        if text not in repeated:
            weight[size] += len(text)
    body_size = weight.most_common(1)[0][0] if weight else 0.0
    heading_sizes = sorted({size for page in pages for _, size in page if body_size and size >= body_size * 1.15},
                           reverse=True)
    meta_title = _clean((reader.metadata.title if reader.metadata else None) or "")
    title = meta_title
    headings: list[tuple[int, str]] = []
    blocks: list[Block] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            blocks.append(Block(tuple(h for _, h in headings), "\n".join(paragraph)))
            paragraph.clear()

    for line, size in (entry for page in pages for entry in page):
        if line in repeated or _PAGE_NUMBER.match(line) or not any(ch.isalnum() for ch in line):
            continue
        if size in heading_sizes:
            flush()
            level = heading_sizes.index(size) + 1
            if not title:
                title = line
                continue
            if line == title:
                continue
            headings = [(lvl, h) for lvl, h in headings if lvl < level] + [(level, line)]
        else:
            paragraph.append(line)
    flush()
    return ParsedDocument(title or fallback_title, blocks)


_PAGE_NUMBER = re.compile(r"^(page\s*)?\d+(\s*(of|/)\s*\d+)?$", re.IGNORECASE)


def _repeated_lines(pages: list[list[str]]) -> set[str]:
    """Lines on at least half the pages (and at least two): running headers and footers."""
    if len(pages) < 2:
        return set()
    counts = Counter(line for page in pages for line in set(page))
    return {line for line, n in counts.items() if n >= max(2, len(pages) / 2)}


def parse_docx(data: bytes, fallback_title: str) -> ParsedDocument:
    """Word's built-in Title/Heading N styles give the structure; tables become one block per row."""
    import docx

    document = docx.Document(io.BytesIO(data))
    title = _clean(document.core_properties.title or "")
    headings: list[tuple[int, str]] = []
    blocks: list[Block] = []
    for item in document.iter_inner_content():
        if isinstance(item, docx.table.Table):
            for row in item.rows:
                cells = [_clean(cell.text) for cell in row.cells]
                text = " | ".join(dict.fromkeys(c for c in cells if c))  # merged cells repeat their text
                if text:
                    blocks.append(Block(tuple(h for _, h in headings), text))
            continue
        text = _clean(item.text)
        if not text:
            continue
        style = (item.style.name if item.style is not None else "") or ""
        if style == "Title":
            title = title or text
            continue
        match = re.match(r"Heading (\d)", style)
        if match:
            level = int(match.group(1))
            if level == 1 and not title:
                title = text
                continue
            headings = [(lvl, h) for lvl, h in headings if lvl < level] + [(level, text)]
            continue
        blocks.append(Block(tuple(h for _, h in headings), text))
    return ParsedDocument(title or fallback_title, blocks)
