"""Follow-ups that only follow up (issue 31): a question that stands on its own is searched as asked, whatever its
length, and a change of topic drops the old topic; decided from the index's own statistics. On the handbook."""

from __future__ import annotations

import uuid

import pytest
from conftest import test_settings as settings_for
from fakes.anthropic_api import FakeAnthropicAPI

from db.settings import DatabaseSettings
from knowledge.answer.memory import ChatMessage
from knowledge.kb import KnowledgeBase

EVERYONE = ["everyone"]


def chat() -> str:
    return f"follow-ups:{uuid.uuid4().hex[:8]}"


async def test_a_standalone_question_after_another_topic_is_searched_as_asked(handbook_kb):
    conversation = chat()
    await handbook_kb.answer("What's the monthly spending limit for managers on the corporate card?", EVERYONE,
                             conversation)
    answer = await handbook_kb.answer("What is the company 401(k) match?", EVERYONE, conversation)
    assert answer.standalone_query == "What is the company 401(k) match?"
    assert answer.citations[0].external_id == "benefits/401k.md"
    answer = await handbook_kb.answer("How many PTO days do I get in my first year?", EVERYONE, conversation)
    assert answer.standalone_query == "How many PTO days do I get in my first year?"
    assert answer.citations[0].external_id == "policies/leave.md"


@pytest.mark.parametrize("question", ["Is there a meal per diem for international trips?", "How do I report phishing?",
                                      "Who approves vendor contracts?"])
async def test_short_questions_naming_their_topic_stand_alone(handbook_kb, question):
    history = [ChatMessage("user", "What laptop do engineers get?"), ChatMessage("assistant", "A MacBook Pro.")]
    answer = await handbook_kb.answer(question, EVERYONE, chat(), prior_messages=history)
    assert answer.standalone_query == question


@pytest.mark.parametrize("question, expected", [("When does it vest?", "benefits/401k.md"),
                                                ("And for managers?", "finance/corporate-card.docx")])
async def test_a_real_follow_up_is_still_resolved(handbook_kb, question, expected):
    conversation = chat()
    first = ("What is the company 401(k) match?" if "vest" in question
             else "What's the monthly spending limit on a standard corporate card?")
    await handbook_kb.answer(first, EVERYONE, conversation)
    answer = await handbook_kb.answer(question, EVERYONE, conversation)
    assert answer.standalone_query != question
    assert answer.citations[0].external_id == expected


async def test_with_claude_a_standalone_question_makes_no_rewrite_call(handbook_url):
    with FakeAnthropicAPI(default_text="NO_ANSWER") as fake:
        kb = await KnowledgeBase.open(
            settings_for(anthropic_api_key="sk-test", anthropic_base_url=fake.url, anthropic_max_retries=0),
            DatabaseSettings(_env_file=None, database_url=handbook_url),  # type: ignore[call-arg]
        )
        try:
            history = [ChatMessage("user", "Who gets a corporate card?"), ChatMessage("assistant", "Managers.")]
            await kb.answer("What is the company 401(k) match?", EVERYONE, chat(), prior_messages=history)
            models = [r.body["model"] for r in fake.requests]
            assert models == [kb.settings.anthropic_model]  # the answer only: no rewrite by the small model
            await kb.answer("When does it vest?", EVERYONE, chat(),
                            prior_messages=[ChatMessage("user", "What is the company 401(k) match?"),
                                            ChatMessage("assistant", "4%.")])
            assert kb.settings.anthropic_rewrite_model in [r.body["model"] for r in fake.requests[1:]]
        finally:
            await kb.close()
