"""Chunks follow structure, fit the model, overlap, and carry their title and breadcrumb."""

import pytest

from knowledge.embedding.encoder import get_embedder
from knowledge.ingest.chunking import chunk_document, split_sentences
from knowledge.ingest.parsing import parse_document


@pytest.fixture(scope="module")
def embedder():
    return get_embedder("all-MiniLM-L6-v2")


def long_section(n: int) -> str:
    return " ".join(f"Rule {i} says that requests for item {i} need manager approval first." for i in range(n))


def test_sections_never_share_a_chunk_and_know_their_breadcrumb(embedder):
    parsed = parse_document(
        f"# Handbook\n\n## Leave\n\n### Sick leave\n\nTake what you need.\n\n## Expenses\n\n{long_section(3)}\n".encode(), "h.md"
    )
    chunks = chunk_document(parsed, embedder.count_tokens_many, max_tokens=256, overlap_tokens=40)
    assert [c.heading for c in chunks] == ["Leave > Sick leave", "Expenses"]
    assert chunks[0].text == "Take what you need."
    assert chunks[0].search_text == "Handbook\nLeave > Sick leave\nTake what you need."


def test_long_sections_split_within_budget_with_sentence_overlap(embedder):
    parsed = parse_document(f"# Policy\n\n## Approvals\n\n{long_section(40)}\n".encode(), "p.md")
    chunks = chunk_document(parsed, embedder.count_tokens_many, max_tokens=128, overlap_tokens=30)
    assert len(chunks) > 3
    assert all(c.token_count <= 128 for c in chunks)
    for first, second in zip(chunks, chunks[1:], strict=False):
        first_sentences, second_sentences = split_sentences(first.text), split_sentences(second.text)
        carried = second_sentences[0]
        assert carried in first_sentences[-3:]  # the next chunk opens with the previous one's last sentences
        assert first_sentences[first_sentences.index(carried):] == second_sentences[: len(first_sentences) - first_sentences.index(carried)]
    every_rule = " ".join(c.text for c in chunks)
    assert all(f"Rule {i} says" in every_rule for i in range(40))


def test_a_giant_sentence_is_cut_to_fit(embedder):
    parsed = parse_document(("# T\n\n" + "word " * 2000).encode(), "t.md")
    chunks = chunk_document(parsed, embedder.count_tokens_many, max_tokens=256, overlap_tokens=0)
    assert len(chunks) >= 8
    assert all(c.token_count <= 256 for c in chunks)


def test_list_items_are_units_and_soft_wrapped_lines_are_joined():
    assert split_sentences("Bring:\n- a laptop\n- your badge. Then go\nto the desk.") == [
        "Bring:",
        "- a laptop",
        "- your badge.",
        "Then go to the desk.",
    ]


def test_text_without_spaces_is_still_cut_to_the_model_limit(embedder):
    cjk = "年假申请需要提前两周提交给经理审批并在系统中登记" * 60  # one "sentence", no spaces
    parsed = parse_document(f"# 政策\n\n{cjk}\n".encode(), "policy.md")
    chunks = chunk_document(parsed, embedder.count_tokens_many, max_tokens=256, overlap_tokens=0)
    assert len(chunks) > 2
    assert all(c.token_count <= 256 for c in chunks)
    assert "".join(c.text for c in chunks).replace(" ", "") == cjk


def test_a_runaway_title_does_not_eat_the_budget(embedder):
    parsed = parse_document((f"# {'Very long title ' * 80}\n\nThe actual policy text.\n").encode(), "t.md")
    (chunk,) = chunk_document(parsed, embedder.count_tokens_many, max_tokens=256, overlap_tokens=0)
    assert chunk.token_count < 100 and chunk.text == "The actual policy text."
