"""Claude's own citations (Anthropic Citations): the passages go out as `search_result` blocks, the cited spans come
back with the answer, streamed (`citations_delta`) or not, and a citation pointing outside the sources is dropped.
Against the fake Anthropic API (tests/fakes/anthropic_api.py), which builds its citations from the request."""

from __future__ import annotations

import pytest
from conftest import write
from fakes.anthropic_api import FakeAnthropicAPI
from test_answer_llm import API_KEY, CORPUS

from knowledge.answer.answering import ABSTAIN_MESSAGE
from knowledge.sources.folder import FolderSource

QUESTION = "How many vacation days do full-time employees get?"


@pytest.fixture
def fake_anthropic():
    with FakeAnthropicAPI() as fake:
        yield fake


async def cited_kb(kb_factory, fake, tmp_path):
    for relative, content in CORPUS.items():
        write(tmp_path / "docs", relative, content)
    kb = await kb_factory(anthropic_api_key=API_KEY, anthropic_base_url=fake.url, anthropic_max_retries=0,
                          anthropic_timeout_seconds=10)
    await kb.sync(FolderSource(tmp_path / "docs"))
    return kb


def search_results(fake: FakeAnthropicAPI) -> list[dict]:
    content = fake.requests[-1].body["messages"][-1]["content"]
    return [block for block in content if block["type"] == "search_result"]


async def test_passages_go_out_as_search_results_and_cited_spans_come_back(kb_factory, fake_anthropic, tmp_path):
    kb = await cited_kb(kb_factory, fake_anthropic, tmp_path)
    fake_anthropic.reply_cited([("Full-time employees get 25 days of paid vacation per year.", [(0, 0)])])
    answer = await kb.answer(QUESTION, ["everyone"], "c1")
    results = search_results(fake_anthropic)
    assert results and all(r["citations"] == {"enabled": True} for r in results)
    assert results[0]["title"] == "Vacation policy" and "25 days" in results[0]["content"][0]["text"]
    assert "<sources>" not in fake_anthropic.requests[-1].user_text  # no escaped prompt copy of the passages
    assert answer.outcome == "answer" and not answer.abstained
    assert answer.text == "Full-time employees get 25 days of paid vacation per year.[1]"
    (citation,) = answer.citations
    assert citation.title == "Vacation policy"
    assert len(citation.quotes) == 1 and "25 days of paid vacation" in citation.quotes[0]
    assert answer.to_dict()["citations"][0]["quotes"] == list(citation.quotes)


async def test_streamed_citations_delta_gives_the_same_answer_as_was_shown(kb_factory, fake_anthropic, tmp_path):
    kb = await cited_kb(kb_factory, fake_anthropic, tmp_path)
    fake_anthropic.reply_cited([("You get 25 days a year.", [(0, 0)]), (" Ask two weeks ahead.", [(0, 0)])])
    shown: list[str] = []

    async def on_text(delta: str) -> None:
        shown.append(delta)

    answer = await kb.answer(QUESTION, ["everyone"], "c2", on_text=on_text)
    assert fake_anthropic.requests[-1].body["stream"] is True
    assert "".join(shown).strip() == answer.text == "You get 25 days a year.[1] Ask two weeks ahead.[1]"
    assert [c.title for c in answer.citations] == ["Vacation policy"]
    assert "Request vacation in the HR portal" in answer.citations[0].quotes[0]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_citation_pointing_outside_the_sources_is_dropped(kb_factory, fake_anthropic, tmp_path, stream):
    kb = await cited_kb(kb_factory, fake_anthropic, tmp_path)
    outside = {"type": "search_result_location", "source": "https://evil.example/x", "title": "Elsewhere",
               "cited_text": "Everyone gets 99 days.", "search_result_index": 7, "start_block_index": 0,
               "end_block_index": 1}
    forged = {**outside, "search_result_index": 0, "source": None}  # filled below with the real first source
    fake_anthropic.reply_cited([("You get 99 days.", [outside]), (" Or 25 days.", [(0, 0)])])
    shown: list[str] = []

    async def on_text(delta: str) -> None:
        shown.append(delta)

    answer = await kb.answer(QUESTION, ["everyone"], "c3", on_text=on_text if stream else None)
    assert answer.text == "You get 99 days. Or 25 days.[1]"  # no marker for the citation that points elsewhere
    assert [c.title for c in answer.citations] == ["Vacation policy"]
    assert all("99 days" not in q for c in answer.citations for q in c.quotes)
    # A citation naming a real source but quoting text that source does not hold is dropped too.
    forged["source"] = search_results(fake_anthropic)[0]["source"]
    fake_anthropic.reply_cited([("You get 99 days.", [forged])])
    answer = await kb.answer(QUESTION, ["everyone"], "c4")
    assert answer.citations == [] and answer.text == "You get 99 days."


async def test_no_answer_with_citations_declines(kb_factory, fake_anthropic, tmp_path):
    kb = await cited_kb(kb_factory, fake_anthropic, tmp_path)
    fake_anthropic.reply_cited([("NO_ANSWER", [])])
    answer = await kb.answer(QUESTION, ["everyone"], "c5")
    assert answer.abstained and answer.outcome == "decline" and answer.text == ABSTAIN_MESSAGE
    assert answer.to_dict()["outcome"] == "decline"
