"""The answer contract: streamed answers, turn ids, standalone queries and who asked, against the fake Messages API.

The fake serves `stream: true` requests as server-sent events in the real order (message_start,
content_block_start, ping, content_block_delta/text_delta…, content_block_stop, message_delta, message_stop),
so the real SDK's `messages.stream` parses them.
"""

from __future__ import annotations

import pytest
from fakes.anthropic_api import FakeAnthropicAPI
from test_answer_llm import API_KEY, CORPUS, open_kb, sources_sent

from knowledge.answer.answering import ABSTAIN_MESSAGE
from knowledge.storage import conversations as memory_store

ALICE = ["user:alice@example.com"]


@pytest.fixture
def fake_anthropic():
    with FakeAnthropicAPI() as fake:
        yield fake


class Collector:
    def __init__(self) -> None:
        self.deltas: list[str] = []

    async def __call__(self, delta: str) -> None:
        self.deltas.append(delta)

    @property
    def text(self) -> str:
        return "".join(self.deltas)


async def test_streamed_answer_keeps_the_numbers_the_asker_saw(kb_factory, fake_anthropic, tmp_path):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS)
    fake_anthropic.reply_stream(["Sick leave is 10 days [2", "]. Vacation is", " 25 days [1]. Ponies are free [9]."])
    seen = Collector()

    answer = await kb.answer("How many vacation days and how many sick days do employees get?", ALICE, "s-1",
                             on_text=seen)

    [request] = fake_anthropic.requests
    assert request.body["stream"] is True
    assert seen.deltas == ["Sick leave is 10 days [2", "]. Vacation is", " 25 days [1]. Ponies are free [9]."]
    # No renumbering: the final text is exactly what was streamed.
    assert answer.text == seen.text.strip()
    assert answer.mode == "llm" and not answer.abstained and answer.note is None
    # Only real sources are listed, under the numbers the model used (the invented [9] is not among them).
    sent = sources_sent(request)
    assert [c.n for c in answer.citations] == [1, 2]
    for citation in answer.citations:
        assert citation.title == sent[citation.n]["title"]
    assert {c.external_id for c in answer.citations} == {"policies/vacation.md", "policies/sick-leave.md"}


async def test_without_on_text_the_answer_is_not_streamed_and_is_renumbered(kb_factory, fake_anthropic, tmp_path):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS)
    fake_anthropic.reply_stream(["Sick leave is 10 days [2].", " Vacation is 25 days [1]."])

    answer = await kb.answer("How many vacation days and how many sick days do employees get?", ALICE, "s-2")

    assert "stream" not in fake_anthropic.requests[0].body
    assert answer.text == "Sick leave is 10 days [1]. Vacation is 25 days [2]."
    assert [c.n for c in answer.citations] == [1, 2]


async def test_a_streamed_no_answer_is_never_shown(kb_factory, fake_anthropic, tmp_path):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS)
    fake_anthropic.reply_stream(["NO_", "ANS", "WER"])
    seen = Collector()

    answer = await kb.answer("Can I carry over unused vacation days forever?", ALICE, "s-3", on_text=seen)

    assert seen.deltas == []
    assert answer.abstained and answer.text == ABSTAIN_MESSAGE and answer.citations == []


async def test_a_short_reply_that_starts_like_the_marker_still_streams(kb_factory, fake_anthropic, tmp_path):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS)
    fake_anthropic.reply_stream(["No", "."])
    seen = Collector()

    answer = await kb.answer("Can I carry over unused vacation days forever?", ALICE, "s-4", on_text=seen)

    assert seen.text == "No." and answer.text == "No." and not answer.abstained


async def test_a_stream_that_breaks_off_falls_back_to_excerpts_with_a_note(kb_factory, fake_anthropic, tmp_path):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS)
    fake_anthropic.stream_breaks(["Employees get", " 10 paid"], "overloaded_error")
    seen = Collector()

    answer = await kb.answer("How many sick days do employees get?", ALICE, "s-5", on_text=seen)

    assert seen.text == "Employees get 10 paid"
    # The returned answer replaces what was shown: quoted excerpts, and why.
    assert answer.mode == "extractive" and not answer.abstained
    assert "10 paid sick days" in answer.text
    assert answer.note is not None and "stopped" in answer.note and "overloaded_error" in answer.note
    assert API_KEY not in answer.note


async def test_offline_answers_never_call_on_text(kb_factory, tmp_path):
    from conftest import write

    from knowledge.sources.folder import FolderSource

    for relative, content in CORPUS.items():
        write(tmp_path / "docs", relative, content)
    kb = await kb_factory()
    await kb.sync(FolderSource(tmp_path / "docs"))
    seen = Collector()

    answer = await kb.answer("How many sick days do employees get?", ALICE, "s-6", on_text=seen)

    assert answer.mode == "extractive" and "10 paid sick days" in answer.text
    assert seen.deltas == []


async def test_each_turn_has_an_id_its_query_and_its_asker(kb_factory, fake_anthropic, tmp_path):
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS)
    fake_anthropic.reply_text("Employees get 10 paid sick days a year [1].")

    first = await kb.answer("How many sick days do employees get?", ALICE, "s-7", asker="slack:U123")
    second = await kb.answer("Who wrote Pride and Prejudice?", ALICE, "s-7", asker="discord:42")

    assert first.id is not None and second.id is not None and second.id > first.id
    assert first.standalone_query == "How many sick days do employees get?"
    assert first.to_dict()["id"] == first.id
    async with kb.engine.connect() as conn:
        turns = await memory_store.turns_after(conn, "s-7")
    assert [(t.id, t.asker) for t in turns] == [(first.id, "slack:U123"), (second.id, "discord:42")]
    assert turns[0].answer == first.text
    # The cited chunks are stored with the turn; an abstention cites none.
    assert turns[0].cited_chunk_ids and set(turns[0].cited_chunk_ids) <= {h.chunk_id for h in first.chunks_used}
    assert second.abstained and turns[1].cited_chunk_ids == ()
