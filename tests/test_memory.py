"""Conversation memory as a user sees it: follow-ups that find the right document, topic switches that leave the old
topic behind, long threads that stay within budget, conversations that never mix, and the Claude rewrite and
summary against the fake Messages API (with the offline fallback when the API fails).
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from fakes.anthropic_api import FakeAnthropicAPI, RecordedRequest
from test_answer_llm import API_KEY, CORPUS, open_kb
from test_cli import ok_json, on_handbook  # noqa: F401 (a fixture)

from knowledge.answer.memory import REWRITE_SYSTEM, ChatMessage, History, rewrite_offline
from knowledge.search.retrieval import SearchFilters

REPO = Path(__file__).resolve().parent.parent
CONVERSATIONS = REPO / "examples" / "handbook" / "conversations.jsonl"
EVERYONE = ["everyone"]


def conversation() -> str:
    return f"test:{uuid.uuid4()}"


def cited_ids(answer) -> list[str]:  # type: ignore[no-untyped-def]
    return [c.external_id for c in answer.citations]


# --- offline, on the handbook ------------------------------------------------------------------------------------


async def test_a_follow_up_finds_the_right_document_only_thanks_to_memory(handbook_kb):
    follow_up = "Do they carry over if I don't use them?"
    alone = await handbook_kb.search(follow_up, SearchFilters(), k=5)
    assert alone.hits[0].external_id != "policies/sick-leave.md"  # on its own, the question is too vague

    chat = conversation()
    await handbook_kb.answer("How many sick days do we get per year?", EVERYONE, chat)
    answer = await handbook_kb.answer(follow_up, EVERYONE, chat)

    assert answer.standalone_query != follow_up and "sick" in answer.standalone_query
    assert cited_ids(answer)[0] == "policies/sick-leave.md"
    assert "carry over" in answer.text.lower()


@pytest.mark.parametrize("switch, document", [
    ("What is the monthly spending limit on a standard corporate card?", "finance/corporate-card.docx"),
    ("Who approves vendor contracts?", "finance/procurement.md"),  # short, but it names its topic
])
async def test_a_topic_switch_does_not_drag_the_old_topic_along(handbook_kb, switch, document):
    chat = conversation()
    await handbook_kb.answer("How many sick days do we get per year?", EVERYONE, chat)

    answer = await handbook_kb.answer(switch, EVERYONE, chat)

    assert answer.standalone_query == switch
    assert cited_ids(answer)[0] == document
    assert "policies/sick-leave.md" not in cited_ids(answer)


async def test_two_conversations_never_see_each_others_turns(handbook_kb):
    first, second = conversation(), conversation()
    await handbook_kb.answer("How many sick days do we get per year?", EVERYONE, first)

    answer = await handbook_kb.answer("Do they carry over if I don't use them?", EVERYONE, second)

    assert answer.standalone_query == "Do they carry over if I don't use them?"
    assert (await handbook_kb.memory.history(second)).messages[0].text == "Do they carry over if I don't use them?"
    assert all("How many sick days" not in m.text for m in (await handbook_kb.memory.history(second)).messages)


async def test_prior_thread_messages_count_only_until_the_bot_has_turns_of_its_own(handbook_kb):
    chat = conversation()
    thread = [ChatMessage("user", "How many weeks of paid parental leave does Northwind offer?"),
              ChatMessage("assistant", "16 weeks at full pay, for any parent.")]

    answer = await handbook_kb.answer("And for adoption?", EVERYONE, chat, prior_messages=thread)
    assert "parental" in answer.standalone_query
    assert cited_ids(answer)[0] == "benefits/parental-leave.docx"

    # Now the conversation has a stored turn: other thread messages passed later are not used as history.
    unrelated = [ChatMessage("user", "What laptop do engineers get?")]
    later = await handbook_kb.answer("And do they carry over?", EVERYONE, chat, prior_messages=unrelated)
    assert "laptop" not in later.standalone_query


async def test_the_thread_before_the_first_mention_stays_in_view_on_later_turns(handbook_kb):
    chat = conversation()
    thread = [ChatMessage("user", "What laptop do engineers get?"),
              ChatMessage("assistant", "A MacBook Pro 14 inch, from the Equipment & Laptop Policy.")]
    await handbook_kb.answer("How often are they refreshed?", EVERYONE, chat, prior_messages=thread)

    history = await handbook_kb.memory.history(chat)
    assert "What laptop do engineers get?" in history.summary
    answer = await handbook_kb.answer("Who approves an early one?", EVERYONE, chat)
    assert "refreshed" in answer.standalone_query and "laptop" in answer.standalone_query
    assert cited_ids(answer)[0] == "it/equipment.html"


def test_the_offline_rewrite_leaves_standalone_questions_alone():
    history = History("", [ChatMessage("user", "How many sick days do we get per year?"),
                           ChatMessage("assistant", "10 paid sick days.")])
    for question in ("Which data classification level applies to customer data?",
                     "What is the monthly limit on a standard corporate card?"):
        assert rewrite_offline(question, history) == question
    assert rewrite_offline("And for managers?", History()) == "And for managers?"
    # A chain keeps the topic it started with; "back to …" finds the turn it names.
    chain = History("", [ChatMessage("user", "What counts as a SEV1 incident?"), ChatMessage("assistant", "…"),
                         ChatMessage("user", "How do I install the VPN on my Mac?"), ChatMessage("assistant", "…")])
    assert "sev1" in rewrite_offline("Back to the incidents: who may declare one?", chain).lower()


def test_memory_beats_no_memory_on_the_handbook_conversations(on_handbook):  # noqa: F811 (a pytest fixture imported by name and requested as a parameter)
    lines = [json.loads(line) for line in CONVERSATIONS.read_text().splitlines() if line.strip()]
    assert len(lines) >= 30
    assert all(2 <= len([m for m in line["history"] if m["role"] == "user"]) + 1 <= 6 for line in lines)

    memory = ok_json("eval", str(CONVERSATIONS), "--mode", "hybrid")["hybrid"]
    baseline = ok_json("eval", str(CONVERSATIONS), "--mode", "hybrid", "--no-memory")["hybrid"]

    assert memory["ndcg@10"] >= baseline["ndcg@10"] + 0.10, (memory, baseline)
    assert memory["mrr@10"] > baseline["mrr@10"]


def write_pests_eval(tmp_path: Path, **question: object) -> tuple[Path, Path]:
    """A four-document garden corpus and one follow-up ("What pests eat them?" after a question about tomatoes)
    whose answer only the history can find, as `eval --corpus` files; `question` adds fields to the question."""
    corpus = tmp_path / "corpus.jsonl"
    documents = [
        {"_id": "d-tomato", "title": "Tomatoes", "text": "Tomatoes need watering every morning and full sun."},
        {"_id": "d-basil", "title": "Basil", "text": "Basil likes warm soil and should be pinched weekly."},
        {"_id": "d-tomato-pests", "title": "Tomato pests", "text": "Hornworms eat tomato leaves; pick them off."},
        {"_id": "d-rose-pests", "title": "Rose pests",
         "text": "Aphids and other pests eat rose buds; pests thrive in spring, so check for pests weekly."},
    ]
    corpus.write_text("".join(json.dumps(d) + "\n" for d in documents))
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({
        "history": [{"role": "user", "text": "How often should I water my tomatoes?"},
                    {"role": "assistant", "text": "Every morning."}],
        "question": "What pests eat them?", "relevant": ["d-tomato-pests"], **question,
    }) + "\n")
    return corpus, questions


def test_eval_corpus_indexes_its_own_source_and_uses_history(fresh_database, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    corpus, questions = write_pests_eval(tmp_path)

    memory = ok_json("eval", str(questions), "--corpus", str(corpus), "--mode", "lexical")["lexical"]
    baseline = ok_json("eval", str(questions), "--corpus", str(corpus), "--mode", "lexical", "--no-memory")["lexical"]

    assert memory["mrr@10"] == 1.0
    assert baseline["mrr@10"] < 1.0
    # The corpus is an eval-only source: it never answers anyone.
    status = ok_json("status")
    assert [s["name"] for s in status["sources"]] == [f"corpus-{tmp_path.name}-corpus"]
    assert ok_json("search", "tomato pests")["results"] == []


# --- Claude: rewrite and summary against the fake Messages API ---------------------------------------------------


def _tag(text: str, name: str) -> str:
    match = re.search(rf"<{name}>\n(.*?)\n</{name}>", text, re.S)
    return match.group(1) if match else ""


def fake_claude(request: RecordedRequest) -> str:
    """A stand-in model: answers long-windedly, rewrites nothing, and summarises by keeping every assistant
    message's first sentence (so facts flow through the summary as a model would keep them)."""
    system = request.system_text
    if system == REWRITE_SYSTEM:
        return _tag(request.user_text, "question")
    if "running summary" in system:
        previous = _tag(request.user_text, "previous_summary")
        said = re.findall(r'<message role="assistant">\n(.*?)(?:\.|\n)', request.user_text)
        return "\n".join([line for line in previous.splitlines() if line] + [f"- {s}." for s in said])
    question = request.user_text.rsplit("Question:", 1)[-1].strip()
    return f"About {question.lower()}: " + "this policy has several parts worth knowing about " * 6 + "[1]."


@pytest.fixture
def fake_anthropic():
    with FakeAnthropicAPI() as fake:
        yield fake


async def test_the_claude_rewrite_is_searched_and_the_answer_addresses_the_original(kb_factory, fake_anthropic, tmp_path):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS, anthropic_rewrite_model="claude-small-test",
                       rewrite_max_tokens=77)
    chat = conversation()
    fake_anthropic.reply_text("Employees get 10 paid sick days a year [1].")
    await kb.answer("How many sick days do employees get?", EVERYONE, chat)
    fake_anthropic.reply_text("How many paid vacation days do employees get per year?")  # the rewrite
    fake_anthropic.reply_text("25 days a year [1].")  # the answer

    answer = await kb.answer("And vacation?", EVERYONE, chat)

    rewrite, answering = fake_anthropic.requests[1:]
    assert rewrite.body["model"] == "claude-small-test" and rewrite.body["max_tokens"] == 77
    assert rewrite.system_text == REWRITE_SYSTEM
    assert "How many sick days do employees get?" in rewrite.user_text and "And vacation?" in rewrite.user_text
    assert answer.standalone_query == "How many paid vacation days do employees get per year?"
    assert answer.citations[0].external_id == "policies/vacation.md"
    # The answer addresses the original question with the conversation in view.
    assert answering.body["model"] != "claude-small-test"
    assert answering.user_text.rstrip().endswith("Question: And vacation?")
    assert "Employees get 10 paid sick days a year." in answering.user_text.split("<sources>")[0]


async def test_a_failing_rewrite_call_falls_back_to_the_offline_rewrite(kb_factory, fake_anthropic, tmp_path):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS, anthropic_max_retries=1)
    chat = conversation()
    fake_anthropic.reply_text("Employees get 10 paid sick days a year [1].")
    await kb.answer("How many sick days do employees get per year?", EVERYONE, chat)
    fake_anthropic.overloaded()
    fake_anthropic.overloaded()  # the rewrite fails after its retry
    fake_anthropic.reply_text("A doctor's note is needed after three consecutive sick days [1].")

    answer = await kb.answer("Do I need a note for them?", EVERYONE, chat)

    assert answer.mode == "llm" and not answer.abstained
    history = History("", [ChatMessage("user", "How many sick days do employees get per year?")])
    assert answer.standalone_query == rewrite_offline("Do I need a note for them?", history)
    assert "sick" in answer.standalone_query
    assert answer.citations[0].external_id == "policies/sick-leave.md"
    assert answer.note is not None and "overloaded_error" in answer.note and API_KEY not in answer.note


async def test_a_long_conversation_stays_in_budget_and_its_summary_carries_an_early_fact(
    kb_factory, fake_anthropic, tmp_path
):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS, memory_token_budget=300,
                       memory_recent_turns=2, prompt_token_budget=1200, context_token_budget=3000)
    fake_anthropic.default = fake_claude
    chat = conversation()
    fake_anthropic.reply_text("Full-time employees get 25 days of paid vacation per year [1].")
    await kb.answer("How many vacation days do full-time employees get?", EVERYONE, chat)
    questions = ["How many sick days do employees get?", "When must I tell my manager I am sick?",
                 "When is a doctor's note needed?", "How do I set up the VPN?", "Why do I need the VPN?",
                 "Where is the VPN configuration file?", "How do I request vacation?", "How early must I request vacation?"]
    for question in questions:
        await kb.answer(question, EVERYONE, chat)

    answers = [r for r in fake_anthropic.requests if r.system_text.startswith("You are ragbot")]
    summaries = [r for r in fake_anthropic.requests if "running summary" in r.system_text]
    assert len(answers) == 1 + len(questions) and summaries
    count = kb.embedder.count_tokens_many
    for request in answers:
        assert sum(count([request.system_text, request.user_text])) <= 1200
    last = answers[-1].user_text
    conversation_block = last.split("<sources>")[0]
    # The first question is long gone from the verbatim turns, but its answer's fact survives in the summary.
    assert "How many vacation days do full-time employees get?" not in conversation_block
    assert "25 days of paid vacation" in _tag(conversation_block, "summary")
    history = await kb.memory.history(chat)
    assert kb.memory.budget_used(history) <= 300
    assert [m.text for m in history.messages if m.role == "user"][-1] == questions[-1]


async def test_the_offline_summary_keeps_figures_within_its_budget(kb_factory):
    from knowledge.answer.memory import summarize_offline

    kb = await kb_factory()
    lines = summarize_offline(
        "", [("How many vacation days do full-time employees get?",
              "Excerpts from the knowledge base (offline mode: quoted, not summarised):\n\n"
              "> Full-time employees get 25 days of paid vacation per year. [1]\n> Ask in the HR portal. [1]")]
        + [(f"Is there a question {i} about the kitchen?", "The kitchen is cleaned on Fridays by the office team.")
           for i in range(30)],
        120, kb.embedder.count_tokens_many,
    )
    assert "25 days of paid vacation" in lines and "[1]" not in lines and "Excerpts" not in lines
    assert sum(kb.embedder.count_tokens_many([lines])) <= 120


# --- the command line ----------------------------------------------------------------------------------------------


def test_chat_remembers_and_shows_what_it_searched_for(on_handbook):  # noqa: F811 (a pytest fixture imported by name and requested as a parameter)
    from test_cli import ok

    out = ok("chat", input="How many sick days do we get per year?\nDo they carry over if I don't use them?\n/quit\n")
    text = " ".join(out.stdout.split())
    assert text.count("ragbot>") == 2
    # Only the follow-up was rewritten, and the rewrite is shown before its answer.
    assert text.count("searched for:") == 1
    shown = text.split("searched for:")[1]
    assert shown.lstrip().startswith("Do they carry over if I don't use them? sick")
    assert "policies/sick-leave.md" in "".join(shown.split())


def test_ask_starts_a_new_conversation_unless_told_to_continue_one(on_handbook):  # noqa: F811 (a pytest fixture imported by name and requested as a parameter)
    from test_cli import ok

    shown = ok("ask", "How many sick days do we get per year?")
    hint = shown.stderr.strip().splitlines()[-1]
    assert hint.startswith("Follow up with: --conversation cli:")
    follow_up = ok("ask", "Do they carry over if I don't use them?", *hint.removeprefix("Follow up with: ").split())
    assert "searched for: Do they carry over if I don't use them? sick" in " ".join(follow_up.stdout.split())

    first = ok_json("ask", "How many sick days do we get per year?")
    fresh = ok_json("ask", "Do they carry over if I don't use them?")
    assert fresh["conversation_id"] != first["conversation_id"]
    assert fresh["standalone_query"] == "Do they carry over if I don't use them?"

    thread = f"readme:{uuid.uuid4()}"
    ok_json("ask", "How many sick days do we get per year?", "--conversation", thread)
    follow_up = ok_json("ask", "Do they carry over if I don't use them?", "--conversation", thread)
    assert follow_up["conversation_id"] == thread
    assert "sick" in follow_up["standalone_query"]
    assert follow_up["citations"][0]["external_id"] == "policies/sick-leave.md"


async def test_turns_stored_before_the_memory_migration_still_serve_as_history(kb_factory, tmp_path):
    """Rows written by revision 0001 (no standalone query, asker or cited chunks) are read as they are."""
    from conftest import write
    from sqlalchemy import text

    from knowledge.sources.folder import FolderSource

    for relative, content in CORPUS.items():
        write(tmp_path / "docs", relative, content)
    kb = await kb_factory()
    await kb.sync(FolderSource(tmp_path / "docs"))
    async with kb.engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO conversation_turns (conversation_id, question, answer, principals) "
            "VALUES ('old-thread', 'How many sick days do employees get?', 'Ten a year.', '{everyone}')"
        ))

    answer = await kb.answer("Do I need a note for them?", EVERYONE, "old-thread")

    assert "sick" in answer.standalone_query
    assert answer.citations[0].external_id == "policies/sick-leave.md"


async def test_a_failing_summary_call_falls_back_to_the_offline_summary(kb_factory, fake_anthropic, tmp_path):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS, memory_token_budget=250,
                       memory_recent_turns=1, anthropic_max_retries=1)
    fake_anthropic.default = fake_claude
    fake_anthropic.fail_requests(lambda request: "running summary" in request.system_text)
    chat = conversation()
    fake_anthropic.reply_text("Full-time employees get 25 days of paid vacation per year [1].")
    await kb.answer("How many vacation days do full-time employees get?", EVERYONE, chat)
    for question in ("How many sick days do employees get?", "When is a doctor's note needed?",
                     "How do I set up the VPN?", "Why do I need the VPN?"):
        answer = await kb.answer(question, EVERYONE, chat)
        assert answer.mode == "llm" and not answer.abstained

    history = await kb.memory.history(chat)  # the next question would fold the older turns now

    assert any("running summary" in r.system_text for r in fake_anthropic.requests)  # Claude was tried
    # Folded offline: the key sentence of the first answer, in the offline summary's own format.
    assert "- Asked: How many vacation days do full-time employees get?" in history.summary
    assert "25 days of paid vacation" in history.summary
    assert kb.memory.budget_used(history) <= 250


# --- a revoked grant (issue 30) ------------------------------------------------------------------------------

FINANCE_CORPUS = {
    **CORPUS,
    "finance/.access": "group:finance\n",
    "finance/forecast.md": "# Revenue forecast\n\nThe Q3 revenue forecast is 48.7 million euros, codename heron.\n",
}


async def test_after_a_grant_is_removed_the_earlier_answer_never_reaches_the_rewrite_prompt(
    kb_factory, fake_anthropic, tmp_path
):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, FINANCE_CORPUS, anthropic_rewrite_model="claude-small")
    chat = conversation()
    granted = ["everyone", "group:finance"]  # the channel's audience while it held the finance grant
    fake_anthropic.reply_text("Employees get 10 paid sick days a year [1].")
    await kb.answer("How many sick days do employees get?", EVERYONE, chat)  # before the grant
    # no rewrite: the question stands on its own (its terms find focused hits), so Claude is asked once
    fake_anthropic.reply_text("The Q3 revenue forecast is 48.7 million euros [1].")
    first = await kb.answer("What is the Q3 revenue forecast?", granted, chat)
    assert cited_ids(first) == ["finance/forecast.md"]

    # Same audience: the whole thread is in the rewrite prompt.
    fake_anthropic.reply_text("How many vacation days do employees get?")
    fake_anthropic.reply_text("25 days a year [1].")
    await kb.answer("And vacation?", granted, chat)
    assert "48.7 million" in fake_anthropic.requests[-2].user_text

    # `/kb channel-access remove group:finance`: the next turn's audience is everyone alone.
    fake_anthropic.reply_text("How many vacation days can be carried over?")
    fake_anthropic.reply_text("Five days [1].")
    await kb.answer("Can I carry them over?", EVERYONE, chat)
    rewrite, answering = fake_anthropic.requests[-2:]
    assert rewrite.system_text == REWRITE_SYSTEM
    for prompt in (rewrite.user_text, answering.user_text):
        assert "48.7 million" not in prompt and "revenue forecast" not in prompt.lower()
    assert "How many sick days do employees get?" in rewrite.user_text  # the turn before the grant stays
    # "And vacation?" was answered with the forecast turn in its prompt (its history): it may restate it, so it is
    # left out too (issue 38: a turn inherits the context of the turns it was shown).
    assert "And vacation?" not in rewrite.user_text

    history = await kb.memory.history(chat, audience=EVERYONE)
    assert all("48.7" not in m.text for m in history.messages) and "48.7" not in history.summary
    restored = await kb.memory.history(chat, audience=granted)
    assert any("48.7" in m.text for m in restored.messages)  # dropped for this audience, not deleted


async def test_a_restricted_passage_restated_without_a_citation_never_reaches_a_narrower_asker(
    kb_factory, fake_anthropic, tmp_path
):
    """Issue 38, item 2: the turn records every chunk its prompt held, not only the cited ones. Claude restates
    the finance forecast it was given without citing it; a later asker in the same conversation who may not see
    the forecast never gets that turn in the rewrite or the answer prompt."""
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, FINANCE_CORPUS, anthropic_rewrite_model="claude-small")
    chat = conversation()
    granted = ["everyone", "group:finance"]
    fake_anthropic.reply_text("Employees get 10 paid sick days a year [1].")
    await kb.answer("How many sick days do employees get?", EVERYONE, chat)  # before the grant
    # no rewrite: the question stands on its own (its terms find focused hits), so Claude is asked once
    fake_anthropic.reply_text("The Q3 revenue forecast is 48.7 million euros, codename heron.")  # no citation
    first = await kb.answer("What is the Q3 revenue forecast?", granted, chat)
    assert "48.7" in fake_anthropic.requests[-1].user_text  # the forecast was in the prompt
    assert first.citations == [] and not first.abstained  # ... and the answer cited nothing

    # A narrower asker in the same conversation (a DM-visible thread, a channel that lost its grant).
    fake_anthropic.reply_text("How many vacation days do employees get?")
    fake_anthropic.reply_text("25 days a year [1].")
    await kb.answer("And vacation?", EVERYONE, chat)
    rewrite, answering = fake_anthropic.requests[-2:]
    assert rewrite.system_text == REWRITE_SYSTEM
    for prompt in (rewrite.user_text, answering.user_text):
        assert "48.7" not in prompt and "heron" not in prompt and "forecast" not in prompt.lower()
    history = await kb.memory.history(chat, audience=EVERYONE)
    assert all("48.7" not in m.text and "heron" not in m.text for m in history.messages)
    assert any("10 paid sick days" in m.text for m in history.messages)  # the public turn stays
    # The audience that may see the forecast still gets the whole thread.
    granted_history = await kb.memory.history(chat, audience=granted)
    assert any("48.7" in m.text for m in granted_history.messages)


async def test_a_summary_that_folded_a_turn_the_audience_cannot_see_is_left_out(kb_factory):
    kb = await kb_factory(memory_token_budget=200, memory_recent_turns=1)
    docs = {"finance/.access": "group:finance\n",
            "finance/forecast.md": "# Revenue forecast\n\nThe Q3 revenue forecast is 48.7 million euros.\n",
            "policies/vacation.md": "# Vacation\n\nEmployees get 25 vacation days a year; five carry over.\n"}
    import tempfile

    from conftest import write

    from knowledge.sources.folder import FolderSource
    root = Path(tempfile.mkdtemp())
    for relative, content in docs.items():
        write(root, relative, content)
    await kb.sync(FolderSource(root))
    chat = conversation()
    granted = ["everyone", "group:finance"]
    await kb.answer("What is the Q3 revenue forecast?", granted, chat)
    for question in ("How many vacation days do employees get?", "Do vacation days carry over?",
                     "How many vacation days carry over each year?"):
        await kb.answer(question, granted, chat)
    folded = await kb.memory.history(chat, audience=granted)
    assert "48.7" in folded.summary  # the forecast turn was folded into the summary
    history = await kb.memory.history(chat, audience=EVERYONE)
    assert history.summary == "" and all("48.7" not in m.text for m in history.messages)
    # The later turns were answered for the granted audience with the forecast turn in their history, so they may
    # restate it: hidden as well (issue 38). A turn answered for everyone is shown to everyone.
    assert history.messages == []
    await kb.answer("How many vacation days do employees get?", EVERYONE, chat)
    history = await kb.memory.history(chat, audience=EVERYONE)
    assert history.messages and all("48.7" not in m.text for m in history.messages)
