"""The documentation stays usable: the README is a short manual with the two set-up commands, and no relative link
in README.md or docs/*.md points at a file (or a heading) that is not there. Files move between packages and pages;
this is what notices a link left behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_MAX_LINES = 400

# [text](target) and [text](target "title"); images too. Autolinks (<https://…>) are not relative links.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = ("http://", "https://", "mailto:", "ftp://")


def doc_files() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def _prose_lines(text: str, *, drop_inline_code: bool = True) -> list[str]:
    """The lines outside fenced code blocks (a link shown as code is not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line) if drop_inline_code else line)  # nor is one in inline code
    return lines


def links(path: Path) -> list[str]:
    return [m.group(1) for line in _prose_lines(path.read_text(encoding="utf-8")) for m in _LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in _prose_lines(path.read_text(encoding="utf-8"), drop_inline_code=False):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(path: Path) -> list[str]:
    """Every relative link of `path` whose file, or heading within a Markdown file, does not exist."""
    broken = []
    for target in links(path):
        if target.startswith(_EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


def test_readme_is_a_manual_of_at_most_400_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_gives_the_two_set_up_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make run" in text
    assert "make test" in text


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_to_something_that_exists(path: Path) -> None:
    if path == README:  # the manual links to its pages; none found means the pattern broke, not the README
        assert len(links(path)) >= 10, "README.md: almost no links found; is the link pattern still right?"
    assert broken_links(path) == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    """The checker itself: a missing file, a missing heading and a link in code (ignored)."""
    (tmp_path / "there.md").write_text("# A heading, with `code`\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n[ok](there.md#a-heading-with-code) [self](#page) [web](https://example.com)\n"
        "[gone](missing.md) [no heading](there.md#nowhere)\n"
        "```\n[in code](also-missing.md)\n```\n",
        encoding="utf-8",
    )
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "there.md#nowhere"]
