"""Multi-query retrieval for conversations (issue 40): a follow-up is searched in several readings fused by
reciprocal rank; "the second one" resolves against the previous answer's list; a question that stands alone is not
merged with the thread. On the handbook and tidewater (examples/)."""

from __future__ import annotations

import json
import uuid

import pytest
from conftest import REPO

from knowledge.answer.memory import (
    ChatMessage,
    History,
    answer_items,
    leans_on_thread,
    pointed_item,
    readings_of,
    refers_to_item,
)
from knowledge.search.fusion import fuse_readings

EVERYONE = ["everyone"]


def chat() -> str:
    return f"multi-query:{uuid.uuid4().hex[:8]}"


def test_readings_are_fused_by_weighted_reciprocal_rank():
    # Chunk 2 is second in both readings, chunk 1 first in one and absent from the other: agreement wins.
    fused = fuse_readings([(1.0, [1, 2, 3]), (1.0, [4, 2, 5])], rrf_k=60, limit=3)
    assert fused[0][0] == 2
    assert fuse_readings([(1.0, [7]), (0.5, [8])], rrf_k=60, limit=2)[0][0] == 7


def test_the_second_one_is_the_second_item_of_the_previous_answers_list():
    history = History(messages=[
        ChatMessage("user", "Which exit nodes can I pick?"),
        ChatMessage("assistant", "Choose the nearest location:\n- us-west (Portland)\n- us-central (Denver)"),
    ])
    assert refers_to_item("what about the second one?") == 1
    assert refers_to_item("How many PTO days do I get in my first year?") is None
    assert refers_to_item("第二个需要多久？") == 1
    assert answer_items(history.messages[-1].text) == ["us-west (Portland)", "us-central (Denver)"]
    assert pointed_item("what about the second one?", history) == "us-central (Denver)"
    assert pointed_item("and the last one?", history) == "us-central (Denver)"
    table = "| Severity | Response |\n|---|---|\n| P1 | 15 minutes |\n| P2 | 1 hour |"
    rows = History(messages=[ChatMessage("user", "Response times?"), ChatMessage("assistant", table)])
    assert pointed_item("And the second row?", rows) == "P2 1 hour"


async def test_a_follow_up_about_the_second_one_searches_that_item(handbook_kb):
    history = [ChatMessage("user", "Which benefits does Northwind offer?"),
               ChatMessage("assistant", "Northwind offers:\n- a 401(k) match\n- paid parental leave\n- health insurance")]
    answer = await handbook_kb.answer("How many weeks is the second one?", EVERYONE, chat(), prior_messages=history)
    assert "parental" in answer.standalone_query
    assert "on-call" not in answer.standalone_query.lower()
    assert answer.citations and answer.citations[0].external_id == "benefits/parental-leave.docx"


async def test_a_topic_switch_stays_alone(handbook_kb):
    conversation = chat()
    await handbook_kb.answer("Can I bring my dog to the Portland office?", EVERYONE, conversation)
    answer = await handbook_kb.answer("What is the capital of Australia?", EVERYONE, conversation)
    assert answer.standalone_query == "What is the capital of Australia?"
    assert answer.outcome != "answer"  # nothing in the handbook says: never an office passage as the answer


def test_a_reading_with_the_same_words_as_another_does_not_vote_twice():
    # The previous turn adds no word the question lacks: "the question with the previous turn" searches what the
    # question alone searches, and would double that ranking's vote against the rewrite's.
    history = History(messages=[ChatMessage("user", "Sick days?"), ChatMessage("assistant", "10 a year.")])
    readings = readings_of("When do my sick days reset?", "When do my sick days reset? january", history, None)
    assert [(r.query, r.weight) for r in readings] == [("When do my sick days reset? january", 1.0),
                                                       ("When do my sick days reset?", 0.25)]


def test_that_and_he_point_at_what_a_short_previous_answer_named():
    # A history without stored turns (thread messages, an eval file) has no cited documents: a short answer is the
    # item. A long answer is not one item, and "it" is the topic (the rewrite carries it), not the answer.
    short = History(messages=[ChatMessage("user", "Which password manager do we use?"),
                              ChatMessage("assistant", "1Password Business.")])
    assert pointed_item("Who pays for that?", short) == "1password business"
    assert pointed_item("Where did he start teaching?", History(messages=[
        ChatMessage("user", "Who was a prominent Huguenot refugee?"), ChatMessage("assistant", "Pierre Bayle.")],
    )) == "pierre bayle"
    assert pointed_item("How much does it cost?", short) is None
    long = History(messages=[ChatMessage("user", "What laptop do engineers get?"), ChatMessage(
        "assistant", "A MacBook Pro 14 inch with an M3 Pro chip, 36 GB memory, a 1 TB SSD and a three year warranty.")])
    assert pointed_item("Who pays for that?", long) is None


def test_a_question_ending_in_one_or_a_bare_phrase_leans_on_the_thread():
    """Whatever the index holds: "How do I request one?" after a corporate-card question asks how to request a card,
    and "For a cousin?" after a bereavement question is about bereavement leave. (Decided from the index alone, in an
    index where "request" or "cousin" is rare, both were searched as asked: the software-request page, a decline.)"""
    assert leans_on_thread("How do I request one?")
    assert leans_on_thread("For a cousin?") and leans_on_thread("In Canada?") and leans_on_thread("After five years?")
    assert leans_on_thread("how long before the first one?")  # "the first one" is item 0, which once read as none
    assert not leans_on_thread("For how long can I carry over unused vacation days?")
    assert not leans_on_thread("What are the first steps after a water main break?")  # names its own topic
    assert not leans_on_thread("Which one of the 2025 holidays falls on a Monday?")
    assert not leans_on_thread("How many weeks of paid parental leave does Northwind offer?")


def _switches(path):
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("kind") in ("topic_shift", "standalone"):
            yield record


@pytest.mark.parametrize("corpus", ["handbook", "tidewater"])
async def test_no_standalone_question_is_rewritten_with_an_unrelated_earlier_turn(handbook_kb, kb_factory, corpus):
    """Every topic switch of the example conversations: the search the chat shows holds no word of the earlier
    turns that the question itself does not hold."""
    from knowledge.answer.memory import content_words
    from knowledge.sources.folder import FolderSource

    kb = handbook_kb
    if corpus == "tidewater":
        kb = await kb_factory()
        await kb.sync(FolderSource(REPO / "examples" / "tidewater", "tidewater"))
    bad = []
    for record in _switches(REPO / "examples" / corpus / "conversations.jsonl"):
        history = kb.memory.history_from_messages(
            [ChatMessage(m["role"], m["text"]) for m in record["history"]])
        rewrite = await kb.memory.standalone_query(record["question"], history)
        earlier = {w for m in record["history"] if m["role"] == "user" for w in content_words(m["text"])}
        added = set(content_words(rewrite.query)) - set(content_words(record["question"]))
        if added & earlier:
            bad.append((record["question"], rewrite.query))
    assert bad == []


def test_one_eval_run_compares_memory_with_the_naive_baselines(fresh_database, monkeypatch, tmp_path):
    from test_cli import ok_json
    from test_memory import write_pests_eval

    monkeypatch.setenv("DATABASE_URL", fresh_database())
    corpus, questions = write_pests_eval(tmp_path, facts=["Hornworms"])
    table = ok_json("eval", str(questions), "--corpus", str(corpus), "--compare-memory")
    assert set(table) == {"memory", "last", "last-two"}
    assert table["memory"]["ndcg@10"] == 1.0 and table["memory"]["fact_recall"] == 1.0
    assert table["last"]["ndcg@10"] < 1.0
