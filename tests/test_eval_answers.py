"""`ragbot eval FILE --answers` as a person measuring the bot sees it: `--corpus` indexes its documents as an eval
source and the questions are answered from them alone; the report splits answerable and unanswerable questions,
counts the three outcomes (answer, uncertain, decline) and gives a balanced score in which hedging everywhere is
worth 0.5; conversations can be searched as the last two user turns together (the baseline memory must beat).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import write
from test_cli import cli, ok_json

from knowledge.answer.memory import ChatMessage
from knowledge.eval.evaluation import (
    EvalQuestion,
    balanced_score,
    last_two_user_turns,
    load_jsonl_questions,
    outcome_of,
    quoted_characters,
    score_answer,
    summarise_answers,
)

CORPUS = {
    "policies/vacation.md": "# Vacation\n\nFull-time employees get 25 days of paid vacation per year. Part-time "
                            "employees get vacation in proportion to their hours.\n",
    "it/vpn.md": "# VPN\n\nInstall the WireGuard client and import the configuration file from the IT portal.\n",
    "facilities/parking.md": "# Parking\n\nThe garage under the office has 40 spaces; permits cost $60 a month.\n",
}
# Indexed as an ordinary source: the same facts under other ids. Answering from it is answering outside the corpus.
DECOY = {
    "leave.md": "# Leave\n\nFull-time employees get 25 days of paid vacation per year.\n",
    "remote-access.md": "# Remote access\n\nInstall the WireGuard client to reach internal systems from home.\n",
}
QUESTIONS = [
    {"question": "How many vacation days do full-time employees get?", "relevant": ["policies/vacation.md"],
     "facts": ["25 days"], "kind": "exact_fact"},
    {"question": "How do I set up the VPN?", "relevant": ["it/vpn.md"], "facts": ["WireGuard"], "kind": "list"},
    {"question": "Who won the 1998 Tour de France?", "relevant": [], "kind": "off_topic"},
]


def folder(root: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        write(root, name, content)
    return root


def answers_json(*args: str) -> dict:  # type: ignore[type-arg]
    return ok_json("eval", *args, "--answers")


# --- --corpus ----------------------------------------------------------------------------------------------------


def test_answer_eval_answers_from_the_corpus_alone(fresh_database, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    decoy = folder(tmp_path / "wiki", DECOY)
    assert cli("ingest", str(decoy), "--source", "wiki").exit_code == 0
    corpus = folder(tmp_path / "acme", CORPUS)
    questions = write(tmp_path, "eval.jsonl", "".join(json.dumps(q) + "\n" for q in QUESTIONS))

    summary = answers_json(str(questions), "--corpus", str(corpus))

    # Both answerable questions are answered from the corpus, whose ids the file names; the wiki holds the same
    # facts, so an eval answering from "whatever is indexed" cites leave.md and remote-access.md instead.
    assert summary["right_document"] == 1.0 and summary["fact_recall"] == 1.0, summary
    cited = {c for miss in summary["misses"] for c in miss["cited"]}
    assert not cited & set(DECOY), summary["misses"]
    assert summary["by_side"]["answerable"]["questions"] == 2
    assert summary["by_side"]["unanswerable"]["questions"] == 1
    # The corpus is an eval-only source: nobody's search finds it, the wiki still answers everyone.
    assert {s["name"] for s in ok_json("status")["sources"]} == {"wiki", "corpus-acme"}
    found = ok_json("search", "parking garage permits")["results"]
    assert found and {r["document"]["source"] for r in found} == {"wiki"}


def test_answer_eval_with_a_corpus_needs_no_index_of_its_own(fresh_database, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    corpus = folder(tmp_path / "acme", {**CORPUS, "eval.jsonl": "", "conversations.jsonl": ""})
    questions = write(tmp_path, "q.jsonl", json.dumps(QUESTIONS[0]) + "\n")

    summary = answers_json(str(questions), "--corpus", str(corpus))

    assert summary["answered"] == 1.0 and summary["right_document"] == 1.0
    assert summary["fact_recall"] == 1.0
    # The folder's own question files are not documents of the corpus.
    assert ok_json("status")["documents"] == len(CORPUS)


def test_answer_eval_per_category(fresh_database, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    corpus = folder(tmp_path / "acme", CORPUS)
    questions = write(tmp_path, "eval.jsonl", "".join(json.dumps(q) + "\n" for q in QUESTIONS))

    summary = answers_json(str(questions), "--corpus", str(corpus))

    categories = summary["by_category"]
    assert set(categories) == {"exact_fact", "list", "off_topic"}
    assert categories["exact_fact"]["questions"] == 1 and categories["exact_fact"]["right_document"] == 1.0
    assert "abstention_accuracy" in categories["off_topic"] and "right_document" not in categories["off_topic"]
    for figures in (*categories.values(), *summary["by_side"].values()):
        assert figures["answered"] + figures["uncertain"] + figures["declined"] == pytest.approx(1.0)


def test_answer_eval_of_a_missing_corpus_is_a_usage_error(fresh_database, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    questions = write(tmp_path, "eval.jsonl", json.dumps(QUESTIONS[0]) + "\n")
    result = cli("eval", str(questions), "--answers", "--corpus", str(tmp_path / "nowhere"))
    assert result.exit_code == 2 and "no such file or folder" in result.stderr


# --- the balanced score on cases worked out by hand -------------------------------------------------------------

ANSWERABLE = [EvalQuestion(str(i), f"q{i}", {"doc.md": 1}, facts=("25 days",)) for i in range(4)]
UNANSWERABLE = [EvalQuestion(f"u{i}", f"u{i}", {}, kind="near_miss") for i in range(2)]


def reply(outcome: str | None, *, abstained: bool = False, cites: str = "doc.md", text: str = "25 days [1]"):  # type: ignore[no-untyped-def]
    """An answer as the answer layer returns it: text, citations, abstained and (newer) an outcome."""
    fields = {"text": text, "abstained": abstained, "citations": [SimpleNamespace(external_id=cites)]}
    return SimpleNamespace(**fields, **({"outcome": outcome} if outcome else {}))


def test_balanced_score_of_a_case_worked_out_by_hand():
    scores = [
        score_answer(ANSWERABLE[0], reply("answer")),      # 1
        score_answer(ANSWERABLE[1], reply("answer")),      # 1
        score_answer(ANSWERABLE[2], reply("uncertain")),   # 1/2
        score_answer(ANSWERABLE[3], reply("decline", abstained=True, text="I couldn't find this")),  # 0
        score_answer(UNANSWERABLE[0], reply("decline", abstained=True, text="I couldn't find this")),  # 1
        score_answer(UNANSWERABLE[1], reply("answer")),    # 0
    ]
    # answerable: (1 + 1 + 0.5 + 0) / 4 = 0.625; unanswerable: (1 + 0) / 2 = 0.5; balanced: 0.5625
    assert balanced_score(scores) == 0.5625
    summary = summarise_answers(scores)
    assert summary["balanced_score"] == 0.5625
    answerable, unanswerable = summary["by_side"]["answerable"], summary["by_side"]["unanswerable"]
    assert (answerable["answered"], answerable["uncertain"], answerable["declined"]) == (0.5, 0.25, 0.25)
    assert (unanswerable["answered"], unanswerable["uncertain"], unanswerable["declined"]) == (0.5, 0.0, 0.5)
    assert answerable["credit"] == 0.625 and unanswerable["credit"] == 0.5
    assert summary["abstention_accuracy"] == 0.5 and summary["wrongly_declined"] == 1
    # "answered" counts answers only: an uncertain reply is not an answer, even though it quotes the fact.
    assert summary["answered"] == 0.5 and summary["fact_recall"] == 0.75


def test_uncertain_everywhere_scores_one_half_not_one():
    hedge = [score_answer(q, reply("uncertain")) for q in ANSWERABLE + UNANSWERABLE]
    assert balanced_score(hedge) == 0.5
    assert summarise_answers(hedge)["abstention_accuracy"] == 0.0  # a hedge is not a decline
    assert summarise_answers(hedge)["by_side"]["unanswerable"]["declined_or_uncertain"] == 1.0
    # The two degenerate strategies score 0.5 as well; only telling the questions apart scores more.
    assert balanced_score([score_answer(q, reply("answer")) for q in ANSWERABLE + UNANSWERABLE]) == 0.5
    declines = [score_answer(q, reply("decline", abstained=True)) for q in ANSWERABLE + UNANSWERABLE]
    assert balanced_score(declines) == 0.5
    right = [score_answer(q, reply("answer")) for q in ANSWERABLE] + [
        score_answer(q, reply("decline", abstained=True)) for q in UNANSWERABLE]
    assert balanced_score(right) == 1.0


def test_the_outcome_is_derived_from_abstained_when_the_answer_has_none():
    assert outcome_of(reply(None, abstained=True)) == "decline"
    assert outcome_of(reply(None)) == "answer"
    assert outcome_of(reply("uncertain")) == "uncertain"
    with pytest.raises(ValueError, match="unknown answer outcome 'maybe'"):
        outcome_of(reply("maybe"))


# --- conversations: the last two user turns together -------------------------------------------------------------


def test_last_two_user_turns_join_the_previous_question_and_the_follow_up():
    question = EvalQuestion("1", "And for part-timers?", {"policies/vacation.md": 1}, history=(
        ChatMessage("user", "How many parking spaces are there?"), ChatMessage("assistant", "40."),
        ChatMessage("user", "How much vacation do full-time staff get?"), ChatMessage("assistant", "25 days."),
    ))
    assert last_two_user_turns(question) == "How much vacation do full-time staff get? And for part-timers?"
    assert last_two_user_turns(EvalQuestion("2", "Alone?", {})) == "Alone?"


def test_eval_of_conversations_reports_the_last_two_turns_baseline(fresh_database, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    corpus = folder(tmp_path / "acme", CORPUS)
    conversation = {"history": [{"role": "user", "text": "How much paid vacation do full-time employees get?",
                                 "relevant": ["policies/vacation.md"]},
                                {"role": "assistant", "text": "25 days a year."}],
                    "question": "And for contractors?", "relevant": ["policies/vacation.md"], "kind": "ellipsis"}
    path = write(tmp_path, "conversations.jsonl", json.dumps(conversation) + "\n")
    assert load_jsonl_questions(path)[0].history[0].text.startswith("How much paid vacation")

    last = ok_json("eval", str(path), "--corpus", str(corpus), "--mode", "lexical", "--no-memory")["lexical"]
    last_two = ok_json("eval", str(path), "--corpus", str(corpus), "--mode", "lexical", "--last-two")["lexical"]

    assert last_two["mrr@10"] == 1.0
    assert last["mrr@10"] < 1.0
    both = cli("eval", str(path), "--corpus", str(corpus), "--no-memory", "--last-two")
    assert both.exit_code == 2 and "--no-memory or --last-two" in both.stderr


def test_quote_length_counts_the_quoted_text_not_the_notes_and_headings():
    table = "**Parts** [1]\n\n| part | price |\n|---|---|\n| PX-1 | 10 EUR |\n\n_Quoted from your documents as written._"
    assert quoted_characters(table) == len("| part | price |") + len("| PX-1 | 10 EUR |")
    scores = [score_answer(ANSWERABLE[0], reply("answer", text=table)),
              score_answer(ANSWERABLE[1], reply("uncertain", text="25 days a year.")),
              score_answer(ANSWERABLE[2], reply("decline", abstained=True, text="I couldn't find this"))]
    # Per reply that quoted anything: (33 + 15) / 2; a decline quotes nothing and is left out.
    assert summarise_answers(scores)["quote_length"] == 24.0
    assert summarise_answers(scores)["by_side"]["answerable"]["quote_length"] == 24.0
