"""One file never costs more than itself (issue 30): small hostile files built here, in a folder with ordinary
ones. Each is skipped with a "skipped: <file>: <limit> (setting NAME)" line, and every other file is committed."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import openpyxl
from conftest import write

from knowledge.search.retrieval import SearchFilters
from knowledge.sources.folder import FolderSource

NORMAL = {
    "handbook.md": "# Handbook\n\nThe office opens at eight and the kitchen closes at six.\n",
    "rooms.csv": "room,seats\nAtlas,8\nBorealis,12\n",
    "notes.txt": "Parking permits are renewed every January at the front desk.\n",
}


def _rezip(data: bytes, replace: dict[str, bytes]) -> bytes:
    """The same zip container with some members' bytes replaced (what a hostile producer would write)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, replace.get(info.filename, source.read(info.filename)))
    return out.getvalue()


def wide_dimension_xlsx() -> bytes:
    """A 2-cell workbook whose sheet declares the dimension A1:XFD1048576 (16,384 columns by 1,048,576 rows)."""
    workbook = openpyxl.Workbook()
    workbook.active.append(["city", "office"])
    workbook.active.append(["Berlin", "Mitte"])
    buffer = io.BytesIO()
    workbook.save(buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as z:
        sheet = z.read("xl/worksheets/sheet1.xml")
    assert b'<dimension ref="A1:B2"/>' in sheet
    return _rezip(buffer.getvalue(), {"xl/worksheets/sheet1.xml": sheet.replace(
        b'<dimension ref="A1:B2"/>', b'<dimension ref="A1:XFD1048576"/>')})


def huge_header_csv(columns: int = 30_000) -> bytes:
    header = ",".join(f"column_{i}" for i in range(columns))
    rows = "\n".join(",".join(str(r) for _ in range(5)) for r in range(20))
    return (header + "\n" + rows + "\n").encode()


def bomb_paras_docx(megabytes: int = 40) -> bytes:
    """A .docx whose document.xml is `megabytes` MB of one huge paragraph repeated (it zips to a few hundred KB)."""
    import docx

    buffer = io.BytesIO()
    docx.Document().save(buffer)
    paragraph = b"<w:p><w:r><w:t>" + b"lorem ipsum " * 8000 + b"</w:t></w:r></w:p>"
    body = paragraph * (megabytes * 1024 * 1024 // len(paragraph))
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as z:
        xml = z.read("word/document.xml")
    start = xml.index(b"<w:body>") + len(b"<w:body>")
    return _rezip(buffer.getvalue(), {"word/document.xml": xml[:start] + body + xml[start:]})


def hostile_folder(root: Path) -> Path:
    for name, content in NORMAL.items():
        write(root, name, content)
    write(root, "wide_dimension.xlsx", wide_dimension_xlsx())
    write(root, "huge_header.csv", huge_header_csv())
    write(root, "bomb_paras.docx", bomb_paras_docx())
    with open(root / "sparse.txt", "wb") as handle:  # 3 GB on paper, nothing on disk
        handle.truncate(3 * 1024 ** 3)
    return root


async def test_a_folder_of_hostile_files_commits_every_other_file_and_reports_each(kb_factory, tmp_path):
    kb = await kb_factory(parse_workers=2, max_table_columns=1000)  # the default: parsed in workers
    docs = hostile_folder(tmp_path / "docs")
    assert (docs / "bomb_paras.docx").stat().st_size < 1024 * 1024
    report = await kb.sync(FolderSource(docs))

    assert sorted(report.added) == ["handbook.md", "notes.txt", "rooms.csv", "wide_dimension.xlsx"]
    lines = report.over_limit_lines()
    assert len(lines) == 3, lines
    assert any(l.startswith("skipped: huge_header.csv: a row of more than 1,000 columns")
               and l.endswith("(setting MAX_TABLE_COLUMNS)") for l in lines)  # noqa: E741 (a one-letter name in a short expression)
    assert any(l.startswith("skipped: bomb_paras.docx: word/document.xml inflates")
               and l.endswith("(setting MAX_ZIP_RATIO)") for l in lines)  # noqa: E741 (a one-letter name in a short expression)
    assert "skipped: sparse.txt: 3,072.0 MB, over 50 MB (setting MAX_FILE_MB)" in lines
    assert not report.failed
    hits = (await kb.search("which office is in Berlin", SearchFilters(), k=3)).hits
    assert any(h.external_id == "wide_dimension.xlsx" and "Mitte" in h.text for h in hits)

    runs = await kb.sync_runs()
    assert runs[0].skipped == 3


async def test_the_caps_name_their_setting_when_a_file_is_within_the_zip_ratio(kb_factory, tmp_path):
    """Variants: a header long but not wide, a workbook with more cells than allowed, a docx over its paragraphs
    or its inflated size; lowering one setting changes which file is skipped."""
    docs = tmp_path / "docs"
    write(docs, "long_header.csv", ",".join("a much longer column title " * 6 + str(i) for i in range(30)) + "\n1,2\n")
    write(docs, "bomb_paras.docx", bomb_paras_docx(2))
    write(docs, "sheet/wide_dimension.xlsx", wide_dimension_xlsx())
    kb = await kb_factory(parse_workers=2, max_decompressed_mb=1)
    report = await kb.sync(FolderSource(docs))
    reasons = dict(report.over_limit)
    assert reasons["long_header.csv"].endswith("over 4,000 (setting MAX_TABLE_HEADER_CHARS)")
    assert reasons["bomb_paras.docx"].endswith("over 1 MB (setting MAX_DECOMPRESSED_MB)")
    assert report.added == ["sheet/wide_dimension.xlsx"]

    few_cells = await kb_factory(parse_workers=2, max_spreadsheet_cells=3)
    report = await few_cells.sync(FolderSource(docs / "sheet"))
    assert dict(report.over_limit) == {"wide_dimension.xlsx": "more than 3 cells (setting MAX_SPREADSHEET_CELLS)"}


async def test_a_parse_past_its_deadline_or_its_memory_is_killed_and_the_next_file_still_parses(kb_factory, tmp_path):
    docs = tmp_path / "docs"
    cells = "".join(f"<td>cell {i}</td>" for i in range(20))
    write(docs, "slow.html", "<html><body><table>" + f"<tr>{cells}</tr>" * 30_000 + "</table></body></html>")
    write(docs, "after.md", NORMAL["handbook.md"])
    kb = await kb_factory(parse_workers=2, parse_timeout_seconds=0.5)
    report = await kb.sync(FolderSource(docs))
    assert dict(report.over_limit) == {"slow.html": "took longer than 0.5 s to parse (setting PARSE_TIMEOUT_SECONDS)"}
    assert report.added == ["after.md"]

    hungry = await kb_factory(parse_workers=2, parse_memory_mb=256, parse_timeout_seconds=120)
    write(tmp_path / "big", "big.txt", ("word " * 9 + "\n\n") * 950_000)  # 45 MB of paragraphs, far more as objects
    write(tmp_path / "big", "after.md", NORMAL["handbook.md"])
    report = await hungry.sync(FolderSource(tmp_path / "big"))
    assert dict(report.over_limit) == {"big.txt": "needs more than 256 MB of memory to parse (setting PARSE_MEMORY_MB)"}
    assert report.added == ["after.md"]


def _running(pid: int) -> bool:
    """True while the process exists and is not a zombie (an orphan nobody has reaped yet has still exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_parse_workers_exit_when_the_process_that_started_them_is_killed():
    """A sync killed with SIGKILL leaves no parsing workers behind: each worker exits when its stdin closes,
    and only the process that started it held the other end."""
    import os
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parent.parent
    script = (
        "import asyncio\n"
        "from knowledge.ingest.isolation import ParsePool\n"
        "from knowledge.ingest.parsing import ParseLimits\n"
        "async def main():\n"
        "    pool = ParsePool(ParseLimits(), workers=2, timeout_seconds=60, memory_mb=1024)\n"
        "    await asyncio.gather(*(pool.parse(b'# T\\n\\nSome text.', f'{n}.md', 10_000) for n in range(4)))\n"
        "    print(' '.join(map(str, pool.idle_worker_pids)), flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=repo, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        assert parent.stdout is not None
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2 and all(_running(pid) for pid in workers)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_running(pid) for pid in workers):
        time.sleep(0.2)
    alive = [pid for pid in workers if _running(pid)]
    for pid in alive:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert alive == []
