"""Retrieved text is data on every CLI surface: no escape sequence reaches the terminal, no mention or markup is
interpreted or passed on, and nothing a document says vanishes from what is shown."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import write
from test_cli import ingest_with_failures, ok, ok_json

from bot.chat.sanitize import ZERO_WIDTH_SPACE

ESC = "\x1b"
HOSTILE_NAME = f"{ESC}]0;pwned{ESC}\\timesheets{ESC}[2J.md"
HOSTILE = (
    f"# Timesheets {ESC}]0;owned\x07policy\n\n"
    "<!channel> Everyone must submit timesheets to the payroll portal by Friday noon. "
    f"{ESC}[2J{ESC}[HLate timesheets are paid in the next cycle. "
    "Questions go to @everyone in the payroll channel or <@U024BE7LH>. "
    "![tracking pixel](https://evil.example/pixel.gif) See [the portal](https://phish.example/login).\n"
)


@pytest.fixture
def hostile_db(tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> str:
    url = fresh_database()
    monkeypatch.setenv("DATABASE_URL", url)
    write(tmp_path / "wiki", HOSTILE_NAME, HOSTILE)
    write(tmp_path / "wiki", f"broken{ESC}[31m.pdf", b"%PDF-1.7\nnot a pdf\n")
    ingested = ingest_with_failures(str(tmp_path / "wiki"), "--source", "wiki")  # exit 3: the broken file
    assert_inert(ingested.stdout + ingested.stderr)
    assert "failed broken.pdf" in ingested.stdout  # the escape sequence is gone, the name still recognisable
    return url


def assert_inert(output: str) -> None:
    assert ESC not in output and "\x07" not in output and "\x9b" not in output
    for live in ("<!channel>", "@everyone", "<@U024BE7LH>", "](https://evil.example", "](https://phish.example"):
        assert live not in output, live


def visible(output: str) -> str:
    return " ".join(output.replace(ZERO_WIDTH_SPACE, "").split())


QUESTION = "When must timesheets be submitted to the payroll portal?"


def test_search_table_and_json_carry_no_escape_sequences_or_live_mentions(hostile_db: str) -> None:
    table = ok("search", QUESTION).stdout
    assert_inert(table)
    assert "Everyone must submit timesheets" in visible(table)
    results = ok_json("search", QUESTION)["results"]
    dumped = json.dumps(results, ensure_ascii=False)
    assert_inert(dumped)
    hit = results[0]
    assert hit["document"]["external_id"] == "timesheets.md"  # ESC ] … ESC \\ (a window title) removed whole
    assert hit["document"]["title"] == "Timesheets policy"
    assert "<!channel> Everyone must submit" in hit["chunk"]["text"].replace(ZERO_WIDTH_SPACE, "")


def test_ask_shows_a_sentence_starting_with_a_mention_literally(hostile_db: str) -> None:
    answered = ok("ask", QUESTION)
    assert_inert(answered.stdout)
    shown = visible(answered.stdout)
    assert "<!channel> Everyone must submit timesheets to the payroll portal by Friday noon." in shown
    assert "[1] Timesheets policy" in shown
    answer = ok_json("ask", QUESTION)
    assert_inert(json.dumps(answer, ensure_ascii=False))
    assert "Everyone must submit timesheets" in answer["answer"]
    assert answer["citations"][0]["title"] == "Timesheets policy"


def test_chat_and_status_are_inert_too(hostile_db: str) -> None:
    chatted = ok("chat", input=f"{QUESTION}\n/quit\n")
    assert_inert(chatted.stdout)
    assert "Everyone must submit timesheets" in visible(chatted.stdout)
    assert_inert(ok("status").stdout)
    assert_inert(json.dumps(ok_json("status"), ensure_ascii=False))
