"""The first five minutes, as a new user sees them: readable offline answers, a CLI that starts instantly (nothing
heavy imported by commands that do not need it), a chat that Ctrl-C and Ctrl-D control, help without Python types,
and an ingest of the example handbook that does not complain about its evaluation files.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import HANDBOOK, IN_PROCESS_CLI_ENV, REPO, write
from fakes.anthropic_api import FakeAnthropicAPI
from typer.testing import CliRunner

from bot.cli import app
from knowledge.answer.generators.extractive import HEDGE_NOTE
from knowledge.answer.generators.passages import breadcrumb, units_of
from knowledge.embedding.encoder import get_embedder
from knowledge.eval.evaluation import evaluate_answers, load_jsonl_questions

runner = CliRunner(env=IN_PROCESS_CLI_ENV)  # commands parse in a thread, as the tests' own KBs do
QUESTIONS = load_jsonl_questions(HANDBOOK / "eval.jsonl")


def ok(*args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture
def on_handbook(handbook_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DATABASE_URL", handbook_url)
    return handbook_url


# --- offline answers people can read -----------------------------------------------------------------------------

async def test_the_readme_answer_quotes_the_table_row_with_its_header_under_title_and_section(handbook_kb) -> None:
    answer = await handbook_kb.answer("How many PTO days do I get in my first year?", ["everyone"], "t:pto")
    assert not answer.abstained
    lines = answer.text.splitlines()
    # Issue 39: the fitted decision may hedge this one (`uncertain`); the hedge label then comes first, alone.
    if answer.outcome == "uncertain":
        assert lines[0] == HEDGE_NOTE and lines[1] == ""
        lines = lines[2:]
    # Leads with the best passage under its title and section, one separator, the citation after the breadcrumb.
    assert lines[0] == "**Paid Time Off (PTO) Policy** › How much PTO you earn [1]"
    # The row comes with its header row, as a table of its own, never glued to prose.
    header = lines.index("| Years of service | Annual PTO | Accrual per pay period |")
    assert lines[header + 1] == "|---|---|---|"
    assert lines[header + 2] == "| 0–2 years (including your first year) | 15 days | 0.625 days |"
    for line in lines:
        assert not re.match(r"^\s*>?\s*\[\d+\]", line), line  # no citation marker opening a line
        if "|" in line:
            assert line.startswith("|") and line.endswith("|"), line
    assert " > " not in answer.text
    assert answer.citations[0].external_id == "policies/leave.md"
    assert answer.citations[0].heading == "How much PTO you earn"


async def test_a_list_item_keeps_its_lead_in_and_a_dependent_sentence_its_neighbour() -> None:
    units = units_of(
        "Carry-over rules:\n- You may carry over up to 5 days.\n- Unused days expire on March 31.\n\n"
        "Employees get a laptop. This laptop is refreshed every three years.",
        ordinal=0,
    )
    items = [u for u in units if u.kind == "list"]
    assert [u.lead for u in items] == ["Carry-over rules:", "Carry-over rules:"]
    dependent = next(u for u in units if u.text.startswith("This laptop"))
    assert dependent.lead == "Employees get a laptop."


def test_breadcrumbs_use_one_separator_and_never_repeat_the_title() -> None:
    assert breadcrumb("Office Access & Badges - Northwind Labs Handbook", "Office Access & Badges > Lost badges") == (
        "Office Access & Badges - Northwind Labs Handbook › Lost badges"
    )
    assert breadcrumb("Leave", "Leave > Sick leave > Notes") == "Leave › Sick leave › Notes"


async def test_a_question_nothing_addresses_abstains_and_offers_related_documents(handbook_kb) -> None:
    # A near miss is never answered: declined with related documents, or the closest passages, labelled (issue 31).
    answer = await handbook_kb.answer("Can I bring my dog to the office?", ["everyone"], "t:dog")
    assert answer.outcome in ("uncertain", "decline")
    nearest = answer.related if answer.abstained else answer.citations
    assert "facilities/office-access.html" in [c.external_id for c in nearest]
    if answer.abstained:
        assert answer.citations == [] and "couldn't find" in answer.text
    else:
        assert answer.text.startswith("_These are the closest passages I found")
    declined = await handbook_kb.answer("Who won the 2024 internal hackathon?", ["everyone"], "t:hackathon")
    assert declined.abstained and declined.citations == [] and declined.related


def test_ask_json_abstention_has_related_with_citation_fields_and_citations_carry_the_heading(on_handbook: str) -> None:
    declined = json.loads(ok("ask", "Who won the 2024 internal hackathon?", "--json").stdout)
    assert declined["abstained"] is True and declined["outcome"] == "decline" and declined["citations"] == []
    assert declined["related"]
    fields = {"n", "title", "url", "path", "external_id", "heading", "quotes"}
    assert all(set(r) == fields for r in declined["related"])
    answered = json.loads(ok("ask", "How many sick days do we get per year?", "--json").stdout)
    assert answered["citations"] and all(set(c) == fields for c in answered["citations"])
    assert answered["citations"][0]["heading"]


async def test_offline_answers_hold_the_measured_floor(handbook_kb) -> None:
    """The figures in the README ("Offline answers"); a change that makes answers worse fails here."""
    summary, _ = await evaluate_answers(handbook_kb, QUESTIONS, ["everyone"])
    assert summary["fact_recall"] >= 0.62, summary
    assert summary["right_document"] >= 0.72, summary
    assert summary["no_unrelated_source"] >= 0.8, summary
    assert summary["wrongly_declined"] <= 12, summary
    # near misses are declined or hedged as "uncertain", never answered (issue 31; docs/answers.md)
    assert summary["by_category"]["near_miss"]["declined_or_uncertain"] >= 0.8, summary
    assert summary["off_topic_declined"] == 1.0, summary


def test_eval_answers_prints_the_answer_metrics(on_handbook: str, tmp_path: Path) -> None:
    subset = tmp_path / "eval.jsonl"
    subset.write_text(
        json.dumps({"question": "How often are laptops refreshed?", "relevant": ["it/equipment.html"], "facts": ["36 months"]})
        + "\n" + json.dumps({"question": "Who wrote Pride and Prejudice?", "relevant": [], "kind": "off_topic"}) + "\n",
        encoding="utf-8",
    )
    summary = json.loads(ok("eval", str(subset), "--answers", "--json").stdout)
    assert summary["mode"] == "extractive"
    assert summary["fact_recall"] == 1.0 and summary["right_document"] == 1.0 and summary["off_topic_declined"] == 1.0
    assert summary["misses"] == []


# --- an instant CLI ---------------------------------------------------------------------------------------------

HEAVY_MODULES = ("torch", "sentence_transformers", "transformers", "knowledge.embedding.numpy_encoder", "alembic")


def _modules_after(commands: list[list[str]], database_url: str) -> list[dict[str, bool]]:
    """Run commands one after another in one fresh interpreter and report, after each, which heavy modules had been
    imported so far (one interpreter for all: a module is never unloaded, so a command that imported one shows it
    from then on, and the first report showing it names the command)."""
    code = (
        "import sys, json\n"
        "from bot.cli import app\n"
        f"for args in {commands!r}:\n"
        "    app(args, standalone_mode=False)\n"
        f"    print('MODULES=' + json.dumps({{m: m in sys.modules for m in {HEAVY_MODULES!r}}}), flush=True)\n"
    )
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line.removeprefix("MODULES=")) for line in done.stdout.splitlines() if line.startswith("MODULES=")]
    assert len(reports) == len(commands), done.stdout
    return reports


def test_status_help_and_lexical_search_load_no_model_and_search_never_imports_torch(handbook_url: str) -> None:
    light = [["status"], ["source", "list"], ["db", "--help"], ["search", "carry over", "--mode", "lexical"]]
    *reports, hybrid = _modules_after([*light, ["search", "How often are laptops refreshed?"]], handbook_url)
    for args, loaded in zip(light, reports, strict=True):
        assert not loaded["torch"] and not loaded["sentence_transformers"] and not loaded["transformers"], (args, loaded)
        assert not loaded["knowledge.embedding.numpy_encoder"], (args, loaded)  # no model of any kind
        assert not loaded["alembic"], (args, loaded)  # the schema is current: Alembic is not even imported
    assert not hybrid["torch"] and hybrid["knowledge.embedding.numpy_encoder"], hybrid


def test_the_numpy_encoder_matches_sentence_transformers() -> None:
    embedder = get_embedder("all-MiniLM-L6-v2")
    texts = ["How many PTO days do I get?", "Laptops are refreshed every 36 months (3 years).", "Ünïcödé 日本語", "x"]
    fast = np.array(embedder.light.encode(texts))
    reference = embedder.model.encode(texts, normalize_embeddings=True)
    assert (fast * reference).sum(axis=1).min() > 0.99999
    long_text = "word " * 400
    assert embedder.count_tokens_many([long_text]) == [len(embedder.model.tokenizer(long_text, add_special_tokens=False)["input_ids"])]


# --- help -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "command", [[], ["ask"], ["search"], ["ingest"], ["eval"], ["chat"], ["status"], ["db"], ["db", "upgrade"], ["sync"],
                ["source", "list"]],
)
def test_help_shows_metavars_not_python_types(command: list[str]) -> None:
    out = ok(*command, "--help").stdout
    for leaked in ("<bool>", "<str>", "<list[", "<int", "<path>", "<datetime>", "{"):
        assert leaked not in out, f"{leaked!r} in:\n{out}"
    if command == ["ask"]:
        assert "ask [OPTIONS] QUESTION" in out
        assert re.search(r"--as\s+PRINCIPAL", out)
    if command == ["search"]:
        assert re.search(r"-k\s+N", out) and re.search(r"--updated-after\s+DATE", out)


# --- ingest and plain output ------------------------------------------------------------------------------------

def test_evaluation_files_are_not_documents_and_are_summarised_once(
    tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    folder = tmp_path / "handbook"
    write(folder, "policies/leave.md", (HANDBOOK / "policies" / "leave.md").read_text(encoding="utf-8"))
    write(folder, "eval.jsonl", (HANDBOOK / "eval.jsonl").read_text(encoding="utf-8"))
    write(folder, "conversations.jsonl", '{"turns": []}\n')
    out = ok("ingest", str(folder)).stdout
    assert "warning" not in out.lower() and "skipped eval" not in out
    summary = [line for line in out.splitlines() if "not documents" in line]
    assert len(summary) == 1, out
    assert "2 files are not documents" in summary[0] and "eval.jsonl" in summary[0] and "conversations.jsonl" in summary[0]
    assert ".md" in summary[0]  # and what ragbot does read


def test_piped_output_keeps_every_title_on_one_line(on_handbook: str) -> None:
    out = ok("search", "lost badge", "-k", "3").stdout
    first = out.splitlines()[0]
    assert first.startswith("1. Office Access & Badges - Northwind Labs Handbook › Lost or forgotten badges")
    assert "┃" not in out and "│" not in out  # no table cells to break titles in
    answer = ok("ask", "How many sick days do we get per year?").stdout
    assert any(line.startswith("**Sick Leave Policy**") for line in answer.splitlines()), answer


# --- a chat that behaves ----------------------------------------------------------------------------------------

def _as_a_foreground_job() -> None:
    """In the child, before `ragbot chat` starts: Ctrl-C's SIGINT handled by default, as a shell sets it for the
    command a person runs at the keyboard. A process started in the background by a shell without job control (a
    script's `pytest ... &`) ignores SIGINT, its children inherit that, and Python leaves an ignored SIGINT ignored:
    the chat would never see the Ctrl-C these tests send (both failed so, stuck on "Searching…" and at the prompt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """`ragbot chat` on a real pseudo-terminal, as a person at a keyboard drives it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "chat"], stdin=slave, stdout=slave, stderr=slave, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "120", "TERM": "xterm", **env},
            start_new_session=True, preexec_fn=_as_a_foreground_job,
        )
        os.close(slave)
        self.output = ""

    @property
    def screen(self) -> str:
        """What a person reads: the output without colour and cursor escape sequences."""
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", self.output)

    def expect(self, pattern: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while re.search(pattern, self.screen) is None:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{pattern!r} never appeared in:\n{self.screen}"
            ready, _, _ = select.select([self.master], [], [], min(remaining, 0.5))
            if ready:
                try:
                    self.output += os.read(self.master, 4096).decode("utf-8", "replace")
                except OSError:  # the child closed the terminal
                    assert re.search(pattern, self.screen), f"{pattern!r} never appeared in:\n{self.screen}"

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)  # what Ctrl-C makes the terminal send

    def exit_code(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            os.close(self.master)


def test_ctrl_c_at_the_prompt_leaves_at_once(handbook_url: str) -> None:
    terminal = Terminal({"DATABASE_URL": handbook_url})
    try:
        terminal.expect(r"Ctrl-D or Ctrl-C\) to leave")  # the prompt says how to leave
        terminal.expect(r"you> ")
        terminal.type("half a quest")  # typed, never sent
        time.sleep(0.3)
        terminal.interrupt()
        # No Enter is needed: before, the prompt read in a worker thread kept waiting for one.
        assert terminal.exit_code(timeout=60) == 0
    finally:
        if terminal.process.poll() is None:
            terminal.process.kill()


def test_ctrl_c_while_answering_cancels_that_answer_and_exit_still_works(handbook_url: str) -> None:
    release = threading.Event()
    with FakeAnthropicAPI() as claude:
        # Claude "thinks" until the test lets it go, so the answer is surely running when Ctrl-C comes.
        claude.default = lambda request: (release.wait(60), "Laptops are refreshed every 36 months [1].")[1]
        terminal = Terminal({
            "DATABASE_URL": handbook_url, "ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": claude.url,
            "ANTHROPIC_MAX_RETRIES": "0",
        })
        try:
            terminal.expect(r"you> ")
            terminal.type("How often are laptops refreshed?\n")
            deadline = time.monotonic() + 60
            while not claude.requests:
                assert time.monotonic() < deadline, terminal.output
                time.sleep(0.05)
            terminal.interrupt()
            terminal.expect(r"\(cancelled\)[\s\S]*you> ", timeout=15)
            release.set()
            terminal.type("How often are laptops refreshed?\n")
            terminal.expect(r"ragbot>[\s\S]*36 months[\s\S]*you> ")
            terminal.type("exit\n")
            assert terminal.exit_code(timeout=15) == 0
        finally:
            release.set()
            if terminal.process.poll() is None:
                terminal.process.kill()
