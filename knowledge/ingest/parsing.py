"""Turn a file's bytes into a structured document: a title and a list of blocks, each under a heading path.

Keeping the heading path is what lets the chunker split on structure and what lets every chunk say where it came
from ("Expenses > Travel > Hotels"). Each format uses the library that already reads it: BeautifulSoup for HTML,
pypdf for PDF, python-docx for Word.
"""

from __future__ import annotations

import codecs
import csv
import io
import logging
import re
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from knowledge.errors import CorruptDocument, LimitExceeded, UnsupportedFormat

# pypdf logs every oddity of a damaged file; the sync reports unreadable files itself.
logging.getLogger("pypdf").setLevel(logging.ERROR)

SUPPORTED_SUFFIXES = (".md", ".markdown", ".txt", ".html", ".htm", ".pdf", ".docx", ".csv", ".xlsx")


@dataclass(frozen=True)
class ParseLimits:
    """Per-format caps, so one small hostile file (a spreadsheet declaring a million rows, a CSV header of 30,000
    columns repeated into every chunk, a zip of a 200 MB XML) costs no more than itself. They are checked while
    reading, never trusted from what the file declares. Each maps to a setting of the same name in upper case."""

    max_table_columns: int = 1000
    max_table_header_chars: int = 4000
    max_spreadsheet_cells: int = 2_000_000
    max_paragraphs: int = 200_000
    max_decompressed_mb: int = 200
    max_zip_ratio: int = 100


def _over(limit: str, setting: str) -> LimitExceeded:
    return LimitExceeded(f"{limit} (setting {setting})")


@dataclass(frozen=True)
class Block:
    """A run of text (a paragraph, list item, table row...) under a heading path.

    `header` is set for spreadsheet rows: the sheet's header row, which the chunker repeats at the top of every chunk
    so a row such as "| Berlin | 12 |" still says what its columns are."""

    headings: tuple[str, ...]
    text: str
    header: str = ""


@dataclass
class ParsedDocument:
    title: str
    blocks: list[Block] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n\n".join(block.text for block in self.blocks)


def parse_document(data: bytes, filename: str, limits: ParseLimits | None = None) -> ParsedDocument:
    """Parse `data` according to `filename`'s suffix. Raises UnsupportedFormat, CorruptDocument or LimitExceeded
    (a CorruptDocument). MemoryError is let through: the caller knows the memory limit it set."""
    suffix = PurePosixPath(filename).suffix.lower()
    parser = _PARSERS.get(suffix)
    if parser is None:
        raise UnsupportedFormat(
            f"unsupported file type {suffix or '(none)'}; ragbot reads {', '.join(SUPPORTED_SUFFIXES)}"
        )
    limits = limits or ParseLimits()
    try:
        if suffix in (".docx", ".xlsx"):
            check_zip(data, limits)
        parsed = parser(data, _title_from_filename(filename), limits)
    except (UnsupportedFormat, CorruptDocument, MemoryError):
        raise
    except Exception as exc:  # each library raises its own zoo of errors on a damaged file
        raise CorruptDocument(f"could not read {suffix} file: {exc}") from exc
    # Postgres text cannot hold NUL characters; they carry no meaning in a document anyway.
    return ParsedDocument(
        parsed.title.replace("\x00", ""),
        [Block(b.headings, b.text.replace("\x00", ""), b.header.replace("\x00", ""))
         for b in parsed.blocks if b.text.replace("\x00", "").strip()],
    )


def check_zip(data: bytes, limits: ParseLimits) -> None:
    """A .docx or .xlsx is a zip: refuse one whose members would inflate past MAX_DECOMPRESSED_MB in all, or a
    member over 1 MB inflating more than MAX_ZIP_RATIO times (a bomb of repeated paragraphs). zipfile never inflates
    a member past its declared size, so checking the declared sizes bounds what parsing can inflate."""
    try:
        members = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except zipfile.BadZipFile as exc:
        raise CorruptDocument(f"could not read the file: not a valid zip container ({exc})") from exc
    total = sum(m.file_size for m in members)
    if total > limits.max_decompressed_mb * 1024 * 1024:
        raise _over(f"inflates to {total / 1024 / 1024:,.0f} MB, over {limits.max_decompressed_mb} MB",
                    "MAX_DECOMPRESSED_MB")
    for member in members:
        if member.file_size > 1024 * 1024 and member.file_size > limits.max_zip_ratio * max(1, member.compress_size):
            raise _over(f"{member.filename} inflates {member.file_size // max(1, member.compress_size):,} times, "
                        f"over {limits.max_zip_ratio}", "MAX_ZIP_RATIO")


@dataclass(frozen=True)
class ParseResult:
    """A parsed file as a parsing worker sends it back (defined here, not in the worker's own module, which runs as
    `__main__` there: the pickle must name a class the parent can import)."""

    document: ParsedDocument
    truncated: bool  # cut to `max_chars` (reported as MAX_DOCUMENT_CHUNKS)


def truncate_blocks(document: ParsedDocument, max_chars: int) -> bool:
    """Cut a parsed document to at most `max_chars` characters of text, so a huge file is not tokenised in full
    (nor sent back from the parsing worker) only to be cut to MAX_DOCUMENT_CHUNKS afterwards. Returns whether
    anything was cut."""
    total = 0
    for index, block in enumerate(document.blocks):
        if total + len(block.text) > max_chars:
            document.blocks[index:] = [Block(block.headings, block.text[: max(0, max_chars - total)], block.header)]
            return True
        total += len(block.text)
    return False


def _title_from_filename(filename: str) -> str:
    stem = PurePosixPath(filename).stem
    return re.sub(r"[-_]+", " ", stem).strip().capitalize() or filename


def _decode(data: bytes) -> str:
    """UTF-8 (with or without BOM), UTF-16 with a BOM, else Windows-1252, the usual legacy encoding."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16")
    if b"\x00" in data[:4096]:
        raise CorruptDocument("file looks binary (contains NUL bytes), not text")
    for encoding in ("utf-8-sig", "cp1252"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
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
# Elements whose text is one block. Text directly inside a container (a <div> of a Confluence export, a <section>)
# becomes a block of its own; table cells join their row.
_HTML_BLOCKS = frozenset(
    ("p", "li", "pre", "blockquote", "tr", "dt", "dd", "figcaption", "caption", "summary", "div", "section",
     "article", "main", "aside", "header", "body", "table", "ul", "ol", "dl", "details", "form", "address")
    + _HTML_HEADINGS
)
_HTML_DROP = ("script", "style", "noscript", "nav", "footer", "template", "svg")


def parse_html(html: str, fallback_title: str) -> ParsedDocument:
    """Walk every text node in document order, grouped by its nearest block element: headings open sections,
    everything else becomes blocks, so no text is lost whatever tags a page uses."""
    # Lazy (each format's library): start-up speed.
    from bs4 import BeautifulSoup, Comment, Tag
    from bs4.element import NavigableString

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(list(_HTML_DROP)):
        tag.decompose()
    title = _clean(soup.title.get_text()) if soup.title else ""
    if soup.title:
        soup.title.decompose()
    root = soup.body or soup

    def block_of(node: NavigableString) -> tuple[Tag | None, Tag | None]:
        """The node's block element, and its table cell when it is in one."""
        cell = None
        for parent in node.parents:
            if parent.name in ("td", "th") and cell is None:
                cell = parent
            elif parent.name in _HTML_BLOCKS or parent is root:
                return parent, cell
        return None, cell

    groups: list[tuple[Tag | None, list[tuple[Tag | None, str]]]] = []
    for node in root.find_all(string=True):
        if isinstance(node, Comment) or not node.strip():
            continue
        block, cell = block_of(node)
        if groups and groups[-1][0] is block:
            groups[-1][1].append((cell, str(node)))
        else:
            groups.append((block, [(cell, str(node))]))

    headings: list[tuple[int, str]] = []
    blocks: list[Block] = []
    for block, parts in groups:
        text = _join_html_parts(parts)
        if not text:
            continue
        name = block.name if block is not None else ""
        if name in _HTML_HEADINGS:
            level = int(name[1])
            if level == 1 and (not title or text == title):
                title = title or text
                continue
            headings = [(lvl, h) for lvl, h in headings if lvl < level] + [(level, text)]
            continue
        blocks.append(Block(tuple(h for _, h in headings), text))
    return ParsedDocument(title or fallback_title, blocks)


def _join_html_parts(parts: Sequence[tuple[object, str]]) -> str:
    """Join a block's text nodes: inline pieces run together, different table cells are separated by ' | '."""
    cells: list[str] = []
    current_cell: object = object()
    for cell, text in parts:
        if cell is not current_cell and cell is not None:
            cells.append("")
            current_cell = cell
        elif not cells:
            cells.append("")
        cells[-1] += text
    return " | ".join(c for c in (_clean(cell) for cell in cells) if c)


def parse_pdf(data: bytes, fallback_title: str) -> ParsedDocument:
    """Headings are the lines set in a larger font than the body text (pypdf reports each run's font size);
    lines repeated on most pages (running headers, footers) and page numbers are dropped."""
    from pypdf import PdfReader  # lazy, as bs4 above

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        raise CorruptDocument("PDF is encrypted; export an unencrypted copy to index it")
    pages: list[list[tuple[str, float]]] = []  # per page: (line, largest font size on it)
    for page in reader.pages:
        fragments: list[tuple[str, float]] = []

        def visit(text: str, _cm: object, tm: list[float], _font: object, size: float) -> None:
            fragments.append((text, round(abs(size * (tm[3] or 1)), 1)))  # noqa: B023 (the closure runs within this iteration)

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


def parse_docx(data: bytes, fallback_title: str, limits: ParseLimits) -> ParsedDocument:
    """Word's built-in Title/Heading N styles give the structure; tables become one block per row."""
    import docx  # lazy, as bs4 above

    document = docx.Document(io.BytesIO(data))
    title = _clean(document.core_properties.title or "")
    headings: list[tuple[int, str]] = []
    blocks: list[Block] = []
    for count, item in enumerate(document.iter_inner_content(), start=1):
        if count > limits.max_paragraphs:
            raise _over(f"more than {limits.max_paragraphs:,} paragraphs and tables", "MAX_PARAGRAPHS")
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


def _table_line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _bounded_rows(rows: Iterable[Sequence[object]], limits: ParseLimits) -> Iterator[list[str]]:
    """Rows as text, refusing a table wider than MAX_TABLE_COLUMNS or larger than MAX_SPREADSHEET_CELLS as it is
    read (an empty row counts as one cell, so a sheet of a million empty rows is bounded too)."""
    cells_seen = 0
    for row in rows:
        if len(row) > limits.max_table_columns:
            raise _over(f"a row of more than {limits.max_table_columns:,} columns", "MAX_TABLE_COLUMNS")
        cells_seen += max(1, len(row))
        if cells_seen > limits.max_spreadsheet_cells:
            raise _over(f"more than {limits.max_spreadsheet_cells:,} cells", "MAX_SPREADSHEET_CELLS")
        yield ["" if value is None else str(value) for value in row]


def _rows_to_blocks(rows: Iterable[list[str]], headings: tuple[str, ...], limits: ParseLimits) -> list[Block]:
    """Spreadsheet rows → one block per row, each carrying the header row (the first non-empty row) so every chunk
    can repeat it. Empty rows and trailing empty cells are dropped. A header longer than MAX_TABLE_HEADER_CHARS is
    refused: it would be repeated into every chunk."""
    cleaned = []
    for row in rows:
        cells = [_clean(cell) for cell in row]
        while cells and not cells[-1]:
            cells.pop()
        if any(cells):
            cleaned.append(cells)
    if not cleaned:
        return []
    header, body = cleaned[0], cleaned[1:]
    header_line = _table_line(header)
    if len(header_line) > limits.max_table_header_chars:
        raise _over(f"a header row of {len(header_line):,} characters, over {limits.max_table_header_chars:,}",
                    "MAX_TABLE_HEADER_CHARS")
    if not body:
        return [Block(headings, header_line)]
    return [Block(headings, _table_line(cells), header_line) for cells in body]


def parse_csv(text: str, fallback_title: str, limits: ParseLimits) -> ParsedDocument:
    """A CSV file: rows read with the csv module (quoted commas and newlines kept), the first row as the header."""
    dialect: type[csv.Dialect]
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    rows = _bounded_rows(csv.reader(io.StringIO(text), dialect), limits)
    return ParsedDocument(fallback_title, _rows_to_blocks(rows, (), limits))


def parse_xlsx(data: bytes, fallback_title: str, limits: ParseLimits) -> ParsedDocument:
    """An Excel workbook (and Google Sheets, exported as one): each sheet is a section named after it, read as rows
    under its own header row."""
    import openpyxl  # lazy, as bs4 above (it imports numpy)

    workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    blocks: list[Block] = []
    try:
        for sheet in workbook.worksheets:
            # The declared dimension (say A1:XFD1048576) is not trusted: without this, every row is padded to it.
            sheet.reset_dimensions()
            rows = _bounded_rows(sheet.iter_rows(values_only=True), limits)
            blocks.extend(_rows_to_blocks(rows, (sheet.title,) if len(workbook.worksheets) > 1 else (), limits))
    finally:
        workbook.close()
    title = _clean(workbook.properties.title or "") if workbook.properties else ""
    return ParsedDocument(title or fallback_title, blocks)


_PARSERS = {
    ".md": lambda data, title, limits: parse_markdown(_decode(data), title),
    ".markdown": lambda data, title, limits: parse_markdown(_decode(data), title),
    ".txt": lambda data, title, limits: parse_plain_text(_decode(data), title),
    ".html": lambda data, title, limits: parse_html(_decode(data), title),
    ".htm": lambda data, title, limits: parse_html(_decode(data), title),
    ".pdf": lambda data, title, limits: parse_pdf(data, title),
    ".docx": lambda data, title, limits: parse_docx(data, title, limits),
    ".csv": lambda data, title, limits: parse_csv(_decode(data), title, limits),
    ".xlsx": lambda data, title, limits: parse_xlsx(data, title, limits),
}
