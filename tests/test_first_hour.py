"""The first hour, round two (issue 41): what a new user trying ragbot from the terminal runs into.

Questions asked in the terminal count on the admin page and in `ragbot insights`; a sync run with a failed file
names it; empty files are left out and reported; `ingest` exits 3 when a file failed; `--as` takes only known
kinds; over-long questions are refused in one line (terminal and chat); list commands print plain lines when piped;
answers render as Markdown in a terminal and stay Markdown source when piped.
"""

from __future__ import annotations

import getpass
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import write
from rich.console import Console
from test_cli import assert_usage_error, cli, ingest_with_failures, ok, ok_json

from bot.chat.flow import Ask, ChatFlow
from bot.chat.state import BotState
from bot.cli import terminal
from bot.web.admin import render_page
from knowledge import Answer, Citation, FolderSource
from knowledge.ingest.parsing import SUPPORTED_SUFFIXES

PAGES = {
    "travel.md": "# Travel policy\n\nEconomy class is booked for flights under six hours. Hotels are booked through "
                 "the travel desk at least a week ahead.\n",
    "notes/a-rather-long-folder-name-for-the-list/zeppelin.md": "# Zeppelin hangar\n\nThe hangar opens in April.\n",
}


@pytest.fixture
def docs_db(tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    folder = tmp_path / "docs"
    for relative, content in PAGES.items():
        write(folder, relative, content)
    ok("ingest", str(folder), "--source", "docs")
    return folder


# --- item 5: terminal questions are counted; failed files are named -----------------------------------------------

def test_terminal_questions_count_in_insights_attributed_to_the_operator(docs_db: Path) -> None:
    chatted = cli("chat", input="Do we fly economy on short flights?\nWhat is the office wifi password?\nexit\n")
    assert chatted.exit_code == 0, chatted.stderr
    ok("ask", "When does the zeppelin hangar open?")
    report = ok_json("insights", "--since", "1d")
    assert sum(day["questions"] for day in report["daily"]) == 3
    gaps = [q for topic in report["gaps"] for q in topic["questions"]]
    wifi = next(q for q in gaps if "wifi" in q["question"])  # declined: a gap, asked in the terminal, by the operator
    assert wifi["where"] == "terminal" and wifi["asker"] == f"terminal:{getpass.getuser()}"
    assert any(d["citations"] for d in report["most_cited"])  # the answered ones cite documents ("never cited" no more)


def test_a_sync_run_with_a_failed_file_names_it(
    tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    write(tmp_path / "docs", "good.md", "# Good\n\nA page that parses.\n")
    write(tmp_path / "docs", "broken.pdf", b"%PDF-1.7\nnot a pdf\n")
    ingest_with_failures(str(tmp_path / "docs"), "--source", "docs")
    [run] = ok_json("sync-runs")["runs"]
    assert run["status"] == "ok" and run["failed"] == 1
    assert run["error"].startswith("1 file failed: broken.pdf: ")


async def test_the_admin_page_names_the_sync_counts_and_the_failed_file(tmp_path: Path, kb_factory) -> None:
    write(tmp_path / "docs", "good.md", "# Good\n\nA page that parses.\n")
    write(tmp_path / "docs", "broken.pdf", b"%PDF-1.7\nnot a pdf\n")
    kb = await kb_factory()
    assert (await kb.sync(FolderSource(tmp_path / "docs", "docs"))).failed
    page = await render_page(kb, BotState(kb.engine))
    history = page[page.index('id="syncs"'):page.index('id="gaps"')]
    for column in ("added", "updated", "deleted", "unchanged", "failed", "error"):
        assert f"<th>{column}</th>" in history
    assert "<td>ok, 1 failed</td>" in history and "1 file failed: broken.pdf" in history
    assert "+1 ~0" not in history
    assert "counted from Slack, Discord, Teams and the terminal" in page  # every registered platform


# --- item 6: empty files ------------------------------------------------------------------------------------------

def test_an_empty_file_is_left_out_and_reported_and_a_clean_ingest_exits_0(
    tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    write(tmp_path / "docs", "good.md", "# Good\n\nA page that parses.\n")
    write(tmp_path / "docs", "empty.txt", "")
    write(tmp_path / "docs", "blank.md", "  \n\n")
    done = ok("ingest", str(tmp_path / "docs"), "--source", "docs")  # exit 0: nothing failed
    summary = " ".join(done.stdout.split())
    assert "docs: 1 added, 0 updated, 0 unchanged, 0 metadata-only, 0 deleted, 2 skipped, 0 failed" in summary
    assert "empty, left out blank.md, empty.txt" in summary
    report = json.loads(ok("ingest", str(tmp_path / "docs"), "--source", "docs", "--json").stdout)["reports"][0]
    assert report["empty"] == ["blank.md", "empty.txt"]
    assert ok_json("status")["documents"] == 1
    titles = [h["document"]["title"] for h in ok_json("search", "empty")["results"]]
    assert "Empty" not in titles and "Blank" not in titles


def test_ingest_help_names_all_seven_file_types() -> None:
    shown = " ".join(ok("ingest", "--help").stdout.split())
    for suffix in (".md", ".txt", ".html", ".pdf", ".docx", ".csv", ".xlsx"):
        assert suffix in shown
    assert "3" in shown and "failed" in shown
    assert {".md", ".txt", ".html", ".pdf", ".docx", ".csv", ".xlsx"} <= set(SUPPORTED_SUFFIXES)


# --- item 7: inputs ----------------------------------------------------------------------------------------------

def test_an_unknown_principal_kind_is_refused_listing_the_known_ones(docs_db: Path) -> None:
    for command in (["ask", "Do we fly economy?"], ["search", "economy"], ["chat"]):
        assert_usage_error(cli(*command, "--as", "grp:eng", input="exit\n"), "unknown principal kind 'grp:'",
                           "everyone, user:<name>, group:<name>, domain:<name>")
    ok("search", "economy", "--as", "group:eng", "--as", "domain:acme.com", "--as", "everyone")


def test_an_over_long_question_is_one_line_in_ask_and_in_the_chat(docs_db: Path) -> None:
    long = "Do we fly economy? " + "x" * 5000
    assert_usage_error(cli("ask", long), "MAX_QUESTION_CHARS", "limit is 4,000")
    chatted = cli("chat", input=f"{long}\nDo we fly economy on short flights?\nexit\n")
    assert chatted.exit_code == 0
    errors = [line for line in chatted.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "MAX_QUESTION_CHARS" in errors[0], chatted.stderr
    assert "Economy class" in chatted.stdout  # the chat went on to the next question


class _Reply:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def begin(self) -> None:
        self.calls.append(("begin", ""))

    async def open(self) -> None:
        self.calls.append(("open", ""))

    async def end(self) -> None:
        self.calls.append(("end", ""))

    async def deliver(self, answer: Answer, answer_id: int) -> None:
        self.calls.append(("deliver", answer.text))

    async def fail(self, text: str) -> None:
        self.calls.append(("fail", text))


async def test_an_over_long_question_in_chat_gets_the_same_line_and_no_work(kb_factory) -> None:
    kb = await kb_factory(max_question_chars=200)
    flow = ChatFlow(kb, "slack")

    async def audience():  # type: ignore[no-untyped-def]
        raise AssertionError("no work for a refused question: not even its audience")

    reply = _Reply()
    assert await flow.answer(Ask("x" * 201, "slack:T:C:1", "slack:U1", audience), reply) is None
    assert reply.calls == [("fail", "the question is 201 characters long; the limit is 200 (MAX_QUESTION_CHARS): "
                                    "ask something shorter")]


# --- item 8: plain output when piped -----------------------------------------------------------------------------

BOX = set("┃│┏┡━─╇┗┛┓┃")


def test_list_commands_print_plain_untruncated_lines_when_piped(docs_db: Path) -> None:
    long_path = str(docs_db)
    listed = ok("source", "list").stdout
    assert not BOX & set(listed), listed
    lines = listed.splitlines()
    assert lines[0].split("\t") == ["source", "kind", "schedule", "documents", "last run", "where"]
    row = lines[1].split("\t")
    assert row[0] == "docs" and row[1] == "folder" and row[3] == "2" and row[5] == long_path  # never cut
    runs = ok("sync-runs").stdout
    assert not BOX & set(runs) and runs.splitlines()[0].split("\t")[:3] == ["run", "source", "trigger"]
    groups = cli("access", "groups").stdout
    assert not BOX & set(groups)


def test_the_command_table_lists_source_remove_not_the_hidden_spelling() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    table = [line for line in readme.splitlines() if line.startswith("| `")]
    assert any("`source remove NAME`" in line for line in table)
    assert not any("remove-source" in line for line in table)


# --- item 9: Markdown in the terminal ----------------------------------------------------------------------------

def _answer(text: str) -> Answer:
    cite = Citation(1, "Travel policy", None, "travel.md", "travel.md", "docs", "", "")
    return Answer(text=text, citations=[cite], chunks_used=[], abstained=False, mode="extractive")


def _rendered(monkeypatch: pytest.MonkeyPatch, *, is_terminal: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=is_terminal, width=120, color_system=None)
    monkeypatch.setattr(terminal, "console", console)
    terminal.render_answer(_answer("**Travel policy** › Flights [1]\n\n| class | when |\n|---|---|\n"
                                   "| Economy | under six hours |\n\n- book a _week_ ahead\n"))
    return out.getvalue()


def test_answers_render_as_markdown_in_a_terminal_and_stay_source_when_piped(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = _rendered(monkeypatch, is_terminal=True)
    assert "**" not in shown and "|---|" not in shown and "_week_" not in shown
    assert "Travel policy › Flights [1]" in shown and "Economy" in shown and "week" in shown
    piped = _rendered(monkeypatch, is_terminal=False)
    assert "**Travel policy** › Flights [1]" in piped and "|---|---|" in piped and "_week_" in piped
