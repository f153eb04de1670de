"""Nothing an asker receives may depend on whether a query term occurs in documents they may not see.

Two indexes differ only in one word of a restricted document ("hunter3" in one, "hunter2" in the other): same
number of chunks, same lengths, same statistics for every other term. Searching as someone who cannot see that
document must give exactly the same hits, scores and abstention signal in both, for every mode.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import pytest_asyncio
from conftest import create_database, drop_database
from conftest import test_settings as kb_settings
from sqlalchemy import text

from db.settings import DatabaseSettings
from knowledge.kb import KnowledgeBase
from knowledge.search.retrieval import MODES, Retriever, SearchFilters, SearchTuning
from knowledge.sources.base import SourceItem, SourceSpec, StaticSource
from knowledge.storage.search import AccessStatistics, CorpusLayout, corpus_layout

PUBLIC = {
    "bands": "# Salary bands\n\nEvery salary band is published on the wiki; a band covers one level.",
    "review": "# Reviews\n\nSalary reviews happen in January; your band may change after a promotion.",
    "ladder": "# Career ladder\n\nThe ladder lists the expectations for each level and its salary band.",
    "benefits": "# Benefits\n\nHealth insurance, a pension plan and a yearly learning budget for everyone.",
    "office": "# Office\n\nThe office opens at eight; the band rehearses in the basement on Fridays.",
    # Filler, so that a word in one chunk is rare (in at most 10% of chunks) and "salary" is not.
    **{f"note-{i}": f"# Note {i}\n\nThe kitchen rota for week {i} is pinned by the coffee machine." for i in range(8)},
}
# The word twice: a term the chunk repeats is also in the index of term-frequency tiers (migration 0010).
SECRET = "# Vault\n\nThe salary band spreadsheet password is {word}; rotate {word} every quarter."


def _items(word: str) -> list[SourceItem]:
    items = [SourceItem(external_id=k, filename=f"{k}.md", read=(lambda v=v: v.encode())) for k, v in PUBLIC.items()]
    body = SECRET.format(word=word)
    items.append(SourceItem(external_id="vault", filename="vault.md", read=lambda: body.encode(), access=("group:hr",)))
    return items


@pytest_asyncio.fixture(scope="module")
async def twin_kbs(server_url, template_db):
    """(index where the hidden document says hunter3, index where it says hunter2), built once for the module."""
    kbs, names = [], []
    for word in ("hunter3", "hunter2"):
        name = f"t_oracle_{uuid.uuid4().hex[:8]}"
        names.append(name)
        url = create_database(server_url, name, template_db)
        kb = await KnowledgeBase.open(kb_settings(), DatabaseSettings(_env_file=None, database_url=url))  # type: ignore[call-arg]
        await kb.sync(StaticSource(SourceSpec("wiki", "test"), _items(word)))
        kbs.append(kb)
    yield kbs
    for kb in kbs:
        await kb.close()
    for name in names:
        drop_database(server_url, name)


def tuned(kb: KnowledgeBase, knobs: dict[str, Any]) -> Retriever:
    """A retriever over `kb` whose search statements use these knobs (knowledge.storage.search.SearchTuning)."""
    return Retriever(kb.search_engine, kb.embedder, kb.settings, SearchTuning(**knobs))


def _seen(results) -> list[tuple[str, float, float | None, float | None]]:  # type: ignore[no-untyped-def]
    return [(h.external_id, round(h.score, 9),
             None if h.dense_score is None else round(h.dense_score, 9),
             None if h.lexical_score is None else round(h.lexical_score, 9)) for h in results.hits]


REGIMES = ["small", "rare", "together", "triples", "common"]
REGIME_IDS = ["small-corpus", "large-corpus-candidates", "terms-together", "three-terms-together", "every-term-common"]
# How the lexical statement checks the asker's access (SearchTuning.narrow_reader_share): each fetched row (a reader
# of most chunks), or inside the lexical index's scans (a reader of few; migration 0023). -1: never, 1: always.
ACCESS_CHECKS = {"per-row": -1.0, "in-index": 1.0}


def _regime(regime: str) -> tuple[dict[str, Any], str]:
    """The search knobs (SearchTuning) that make the lexical statement take a regime's path, and its question."""
    knobs: dict[str, Any] = {}
    if regime != "small":
        # Behave as a large corpus does: candidates come only from the rarest terms.
        knobs["rare_term_corpus_size"] = 0
        knobs["together_corpus_size"] = 0  # groups of terms too (in regimes with them)
    question = "salary band hunter3"
    if regime == "together":
        # ... and candidates also come from the chunks holding two of the other terms together ("salary" and
        # "band", after the rare "rehearses"); the hidden word pairs with each of them and must bring nothing.
        knobs["candidate_postings"] = 1
        question = "salary band rehearses hunter3"
    if regime == "triples":
        # ... and from the chunks holding three of the terms when no pair of them qualifies ("salary", "band" and
        # "level"); the hidden word makes triples with the others and must bring nothing.
        knobs["candidate_postings"] = 1
        knobs["together_max_df"] = 0
        question = "salary band level hunter3"
    if regime == "common":
        # ... and every term is common: candidates from the rarest term the asker can find, read in table order
        # (more postings than the scan cap) and from the chunks that repeat a term (its term-frequency tiers, where
        # the hidden word has a tier of its own); visibility looked for in the first few rows, then in the index.
        knobs["candidate_postings"] = 0
        knobs["candidate_scan_cap"] = 1
        knobs["common_index_df"] = 1
        knobs["common_probe_rows"] = 3
    return knobs, question


@pytest.mark.parametrize("access_check", list(ACCESS_CHECKS))
@pytest.mark.parametrize("regime", REGIMES, ids=REGIME_IDS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_word_only_in_hidden_documents_changes_nothing_the_asker_sees(twin_kbs, mode, regime, access_check):
    knobs, question = _regime(regime)
    knobs["narrow_reader_share"] = ACCESS_CHECKS[access_check]
    with_word, without_word = twin_kbs
    for k in (1, 5):
        a = await tuned(with_word, knobs).search(question, SearchFilters(("user:bob@example.com",)), k=k, mode=mode)
        b = await tuned(without_word, knobs).search(question, SearchFilters(("user:bob@example.com",)), k=k, mode=mode)
        assert _seen(a) == _seen(b)
        assert a.hits, "the public documents match the question"
        assert "vault" not in {h.external_id for h in a.hits}
        assert a.best_similarity == b.best_similarity


@pytest.mark.parametrize("regime", REGIMES, ids=REGIME_IDS)
async def test_checking_access_inside_the_lexical_index_returns_what_checking_each_row_does(twin_kbs, regime):
    """A reader of few chunks has access checked in the index's scans, a broad one row by row: the same hits, the
    same scores, for someone who may not see the vault and for HR who may."""
    knobs, question = _regime(regime)
    with_word, _ = twin_kbs
    for principals in (("user:bob@example.com",), ("group:hr",)):
        for mode in ("lexical", "hybrid"):
            seen = {check: _seen(await tuned(with_word, {**knobs, "narrow_reader_share": share}).search(
                        question, SearchFilters(principals), k=5, mode=mode))
                    for check, share in ACCESS_CHECKS.items()}
            assert seen["in-index"] == seen["per-row"], (principals, mode)
            assert seen["per-row"], "the question matches documents this reader may see"


async def test_a_reader_of_few_chunks_is_told_apart_from_a_reader_of_most_by_postgres_statistics(twin_kbs):
    """The estimate that picks the access check: from ANALYZE's statistics of `access`; unknown before them."""
    _, kb = twin_kbs
    async with kb.search_engine.connect() as conn:
        await conn.execute(text("ANALYZE chunks"))
        layout = await corpus_layout(conn)
    hr_only = layout.visible_share(["group:hr"])  # the vault: 1 chunk of 14
    everyone = layout.visible_share(["everyone", "user:bob@example.com"])
    # HR's reader is narrow by the default setting, everyone's is not
    assert 0 < hr_only <= SearchTuning().narrow_reader_share < everyone, (hr_only, everyone)
    assert everyone > 0.9
    never_analysed = CorpusLayout(14, {}, (AccessStatistics(14.0, None, 0.0),))
    assert never_analysed.visible_share(["group:hr"]) == 1.0


async def test_the_hidden_word_does_count_for_someone_who_may_see_it(twin_kbs):
    """The same comparison as HR is not blind: the filter is by access, not a dropped term."""
    with_word, without_word = twin_kbs
    a = await with_word.search("hunter3", SearchFilters(("group:hr",)), k=3, mode="lexical")
    b = await without_word.search("hunter3", SearchFilters(("group:hr",)), k=3, mode="lexical")
    assert [h.external_id for h in a.hits] == ["vault"]
    assert b.hits == []


# --- the documented limit: term statistics are global (issue 30, docs/security.md "Fail-closed guarantees") ----

RANK_PUBLIC = {
    "alpha-note": "# Launch note\n\nThe alpha build ships to the pilot customers next month.",
    "beta-note": "# Test note\n\nThe beta survey and the beta feedback form close on Friday.",
    **{f"filler-{i}": f"# Rota {i}\n\nThe kitchen rota for week {i} is pinned by the coffee machine." for i in range(10)},
}


def _rank_items(restricted_word: str) -> list[SourceItem]:
    items = [SourceItem(external_id=k, filename=f"{k}.md", read=(lambda v=v: v.encode()))
             for k, v in RANK_PUBLIC.items()]
    for i in range(12):  # restricted chunks of the same length in both indexes; only one word differs
        body = f"# Plan {i}\n\nProject {restricted_word} milestone {i} is due before the board meeting."
        items.append(SourceItem(external_id=f"secret-{i}", filename=f"secret-{i}.md", read=lambda b=body: b.encode(),
                                access=("group:exec",)))
    return items


async def test_restricted_chunks_sharing_a_public_term_move_public_lexical_scores_but_never_appear(
    server_url, template_db
):
    """The exact guarantee: what is returned to an asker is only what they may see, and a term found only in
    documents they cannot see changes nothing (tests above). But BM25's document frequencies are counted over
    every chunk: restricted chunks holding a term the public ones also hold lower that term's weight, so the
    lexical scores, and possibly the order, of the same public hits change. This pins that documented limit."""
    seen: dict[str, list[tuple[str, float]]] = {}
    names = []
    try:
        for word in ("alpha", "gamma"):
            name = f"t_rank_{uuid.uuid4().hex[:8]}"
            names.append(name)
            kb = await KnowledgeBase.open(kb_settings(), DatabaseSettings(  # type: ignore[call-arg]
                _env_file=None, database_url=create_database(server_url, name, template_db)))
            try:
                await kb.sync(StaticSource(SourceSpec("wiki", "test"), _rank_items(word)))
                hits = (await kb.search("alpha beta", SearchFilters(("everyone",)), k=5, mode="lexical")).hits
            finally:
                await kb.close()
            assert not any(h.external_id.startswith("secret-") for h in hits)  # never returned
            seen[word] = [(h.external_id, round(h.lexical_score or 0.0, 2)) for h in hits]
    finally:
        for name in names:
            drop_database(server_url, name)
    with_alpha, without_alpha = seen["alpha"], seen["gamma"]
    print("lexical scores for 'alpha beta' as everyone:", {"restricted alpha": with_alpha, "none": without_alpha})
    assert {i for i, _ in with_alpha} == {i for i, _ in without_alpha} == {"alpha-note", "beta-note"}
    score = {w: dict(s)["alpha-note"] for w, s in seen.items()}
    assert score["alpha"] < score["gamma"]  # the restricted "alpha" chunks lowered the public alpha hit's score
