"""The held-out knowledge base (examples/tidewater, a municipal water and electric utility): it ingests cleanly,
and its question files say what they promise. No floor on its figures lives here: the set is for reporting
(docs/evaluation.md), and a test tuned to pass on it would make it a tuning set."""

from __future__ import annotations

import json
from collections import Counter

from conftest import REPO

from knowledge.eval.evaluation import _plain, load_jsonl_questions
from knowledge.ingest.parsing import SUPPORTED_SUFFIXES, parse_document
from knowledge.sources.folder import FolderSource

TIDEWATER = REPO / "examples" / "tidewater"
QUESTIONS = load_jsonl_questions(TIDEWATER / "eval.jsonl")
CONVERSATIONS = [json.loads(line) for line in (TIDEWATER / "conversations.jsonl").read_text().splitlines() if line]
DOCUMENTS = sorted(p.relative_to(TIDEWATER).as_posix() for p in TIDEWATER.rglob("*") if p.suffix in SUPPORTED_SUFFIXES)


async def test_the_held_out_set_ingests_cleanly(fresh_kb):
    report = await fresh_kb.sync(FolderSource(TIDEWATER, "tidewater"))

    assert not report.failed, report.failed
    assert sorted(name for name, _ in report.skipped) == ["conversations.jsonl", "eval.jsonl"]  # not documents
    assert sorted(report.added) == DOCUMENTS
    assert len(DOCUMENTS) >= 25
    assert {p.rsplit(".", 1)[1] for p in DOCUMENTS} >= {"md", "txt", "html", "csv", "pdf", "docx"}
    status = await fresh_kb.status()
    assert status.documents == len(DOCUMENTS) and status.chunks >= 3 * len(DOCUMENTS)


def test_the_questions_cover_every_category():
    kinds = Counter(q.kind for q in QUESTIONS)
    assert len(QUESTIONS) == 60
    assert set(kinds) == {"paraphrase", "table", "list", "exact_fact", "near_miss", "off_topic"}
    assert kinds["near_miss"] >= 10 and kinds["off_topic"] >= 6
    assert all(bool(q.relevant) == (q.kind not in ("near_miss", "off_topic")) for q in QUESTIONS)
    assert all(q.facts for q in QUESTIONS if q.relevant)


def test_every_expected_fact_is_in_a_relevant_document():
    """A fact no relevant document states would count against every answer."""
    texts = {}
    for name in DOCUMENTS:
        parsed = parse_document((TIDEWATER / name).read_bytes(), name)
        texts[name] = _plain(" ".join(block.text for block in parsed.blocks))
    for question in QUESTIONS:
        assert set(question.relevant) <= set(texts), question
        for fact in question.facts:
            assert any(_plain(fact) in texts[r] for r in question.relevant), (question.question, fact)


def test_the_conversations_label_every_user_turn():
    assert len(CONVERSATIONS) == 30
    assert {c["kind"] for c in CONVERSATIONS} >= {"ellipsis", "pronoun", "chain", "topic_shift", "standalone", "return"}
    for conversation in CONVERSATIONS:
        users = [m for m in conversation["history"] if m["role"] == "user"]
        assert users and all(set(m["relevant"]) <= set(DOCUMENTS) and m["relevant"] for m in users), conversation
        assert set(conversation["relevant"]) <= set(DOCUMENTS) and conversation["relevant"]
    assert len(load_jsonl_questions(TIDEWATER / "conversations.jsonl")) == 30
