"""Hybrid search: access control inside the index scans, filters, per-document caps, near-duplicates."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import write
from sqlalchemy import text

from knowledge.search.retrieval import MODES, Retriever, SearchFilters, SearchTuning
from knowledge.sources.base import SourceItem, SourceSpec, StaticSource
from knowledge.sources.folder import FolderSource


def item(external_id: str, body: str, access=("everyone",), updated_at=None, title=None) -> SourceItem:
    return SourceItem(
        external_id=external_id, filename=f"{external_id}.md", read=lambda: body.encode(), title=title,
        access=tuple(access), updated_at=updated_at,
    )


def tuned(kb: Any, knobs: dict[str, Any]) -> Retriever:
    """A retriever over `kb` whose search statements use these knobs (knowledge.storage.search.SearchTuning), as a
    large corpus would have them."""
    return Retriever(kb.search_engine, kb.embedder, kb.settings, SearchTuning(**knobs))


@pytest.fixture
async def acl_kb(fresh_kb):
    items = [
        item("salaries", "# Salary bands\n\nThe salary band for a senior engineer is 180,000 to 210,000 dollars.",
             access=("group:hr",)),
        item("alice-review", "# Review\n\nAlice's salary will rise by 8 percent after her review.",
             access=("user:alice@example.com",)),
        item("careers", "# Career ladder\n\nSenior engineers lead projects and mentor others; pay follows the ladder."),
    ]
    await fresh_kb.sync(StaticSource(SourceSpec("people", "test"), items))
    return fresh_kb


@pytest.mark.parametrize("mode", MODES)
async def test_restricted_documents_never_reach_other_principals(acl_kb, mode):
    query = "what is the salary band for a senior engineer"
    as_bob = await acl_kb.search(query, SearchFilters(("user:bob@example.com",)), k=10, mode=mode)
    assert {h.external_id for h in as_bob.hits} <= {"careers"}
    as_hr = await acl_kb.search(query, SearchFilters(("group:hr",)), k=10, mode=mode)
    assert as_hr.hits[0].external_id == "salaries"
    as_alice = await acl_kb.search(query, SearchFilters(("user:alice@example.com",)), k=10, mode=mode)
    assert "alice-review" in {h.external_id for h in as_alice.hits}
    assert "salaries" not in {h.external_id for h in as_alice.hits}


async def test_best_similarity_only_counts_permitted_chunks(acl_kb):
    query = "salary band for a senior engineer"
    hidden = await acl_kb.search(query, SearchFilters(("user:bob@example.com",)), k=5)
    visible = await acl_kb.search(query, SearchFilters(("group:hr",)), k=5)
    assert hidden.best_similarity < visible.best_similarity


async def test_a_filtered_search_still_returns_k_results(fresh_kb):
    """Hundreds of better-matching chunks the asker may not see must not starve the result list."""
    secret = [item(f"secret-{i}", f"# Bonus plan {i}\n\nThe bonus plan for team {i} pays out in March.",
                   access=("group:exec",)) for i in range(300)]
    public = [item(f"public-{i}", f"# Team {i} rituals\n\nTeam {i} holds a planning meeting every March.")
              for i in range(15)]
    await fresh_kb.sync(StaticSource(SourceSpec("mixed", "test"), secret + public))
    for mode in MODES:
        hits = (await fresh_kb.search("when does the bonus plan pay out", SearchFilters(), k=10, mode=mode)).hits
        if mode == "lexical":
            assert {h.external_id for h in hits} <= {f"public-{i}" for i in range(15)}
            continue
        assert len(hits) == 10, mode
        assert all(h.external_id.startswith("public-") for h in hits)



async def test_the_hnsw_search_list_grows_with_the_corpus_and_the_pool_remembers_it_truly(fresh_kb):
    """A larger corpus gets a longer HNSW search list (knowledge.search.retrieval.ef_search_for: at a million chunks the
    default one missed a question's clear answer 33 times in 200). It is SET on a pooled connection only when that
    connection's differs, so what the pool remembers must be what Postgres has."""
    from contextlib import AsyncExitStack

    from sqlalchemy.ext.asyncio import AsyncConnection

    knobs: dict[str, Any] = {  # the search statements' knobs (SearchTuning)
        "chunks_per_ef_search": 1,  # so that a few hundred chunks count as large
        "corpus_size_ttl_s": 0.0,
    }
    docs = [item(f"team-{i}", f"# Team {i} rituals\n\nTeam {i} holds a planning meeting every March.")
            for i in range(250)]
    await fresh_kb.sync(StaticSource(SourceSpec("teams", "test"), docs))
    (n_chunks,) = (await _read(fresh_kb, "SELECT n_chunks FROM corpus_stats")).one()

    async def settings_on_every_pooled_connection() -> list[tuple[str | None, str]]:
        async def one(conn: AsyncConnection) -> tuple[str | None, str]:
            actual = (await conn.execute(text("SELECT current_setting('hnsw.ef_search')"))).scalar_one()
            return conn.info.get("hnsw.ef_search"), actual

        async with AsyncExitStack() as stack:  # every connection the pool holds (5, and 5 more it may open)
            connections = [await stack.enter_async_context(fresh_kb.search_engine.connect()) for _ in range(10)]
            return [await one(conn) for conn in connections]

    hits = (await tuned(fresh_kb, knobs).search("when does team 7 plan", SearchFilters(), k=5, mode="dense")).hits
    assert hits[0].external_id == "team-7"
    pooled = await settings_on_every_pooled_connection()
    assert (str(n_chunks), str(n_chunks)) in pooled  # the connection the search used
    assert all(remembered == actual for remembered, actual in pooled)

    await fresh_kb.sync(StaticSource(SourceSpec("teams", "test"), docs + [
        item(f"guild-{i}", f"# Guild {i}\n\nGuild {i} meets on Fridays.") for i in range(100)]))
    (grown,) = (await _read(fresh_kb, "SELECT n_chunks FROM corpus_stats")).one()
    assert grown > n_chunks
    await tuned(fresh_kb, knobs).search("when does guild 3 meet", SearchFilters(), k=5, mode="dense")
    pooled = await settings_on_every_pooled_connection()
    assert (str(grown), str(grown)) in pooled
    assert all(remembered == actual for remembered, actual in pooled)


async def test_searches_keep_their_prepared_statements_while_the_bot_reads_in_transactions(acl_kb):
    """psycopg drops every statement a connection had prepared when it rolls a transaction back, and the bot reads
    conversation memory, channel grants and identities in transactions that end so. Searches keep a pool of their
    own, so BM25's statement stays prepared (and planned once, see db.engine.read_rows) between questions."""
    from contextlib import AsyncExitStack

    for _ in range(8):  # psycopg prepares a statement on its fifth run on a connection
        await acl_kb.search("senior engineer career ladder", SearchFilters(), k=5, mode="lexical")
    async with AsyncExitStack() as stack:  # a busy bot: read-only transactions on every connection of its pool
        for _ in range(10):
            conn = await stack.enter_async_context(acl_kb.engine.connect())
            await conn.execute(text("SELECT count(*) FROM bot_identities"))
    async with acl_kb.retriever.engine.connect() as conn:  # the searches' pool: the connection they used
        prepared = (await conn.execute(text(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%question_terms AS%'"))).scalar_one()
    assert prepared >= 1


async def _read(kb, sql: str):  # type: ignore[no-untyped-def]
    async with kb.engine.connect() as conn:
        return await conn.execute(text(sql))


async def test_a_lexical_search_for_a_reader_of_few_documents_still_fills_k(fresh_kb):
    """The rarest question term brings the candidates; its postings are mostly in documents the asker may not see,
    and the more common term that their documents do contain is over the posting budget (its postings mostly hidden
    too). The search looks once more, with every term, among the chunks the asker may see."""
    knobs: dict[str, Any] = {  # the search statements' knobs (SearchTuning)
        "rare_term_corpus_size": 0,  # act as a large corpus: rarest terms only
        "candidate_postings": 4,
    }
    hidden = [item(f"hidden-{i}", f"# Audit {i}\n\nThe zeppelin audit number {i} is confidential.",
                   access=("group:exec",)) for i in range(3)]
    hidden += [item(f"hidden-inspection-{i}", f"# Board {i}\n\nThe board inspection {i} is confidential.",
                    access=("group:exec",)) for i in range(12)]
    mine = [item("zeppelin", "# Hangar\n\nThe zeppelin hangar inspection happens in spring.")]
    mine += [item(f"inspection-{i}", f"# Site {i}\n\nThe inspection of site {i} happens every spring.")
             for i in range(8)]
    await fresh_kb.sync(StaticSource(SourceSpec("mixed", "test"), hidden + mine))
    hits = (await tuned(fresh_kb, knobs).search("zeppelin inspection", SearchFilters(), k=5, mode="lexical")).hits
    assert len(hits) == 5
    assert hits[0].external_id == "zeppelin"
    assert all(not h.external_id.startswith("hidden-") for h in hits)


def hangar_and_inspection_items() -> list[SourceItem]:
    """Chunks holding "hangar" or "inspection", and one ("answer") holding both."""
    items = [item(f"hangar-{i}", f"# Hangar {i}\n\nHangar {i} stores the spare chairs.") for i in range(3)]
    items += [item(f"inspection-{i}", f"# Inspection {i}\n\nThe fire inspection of floor {i} is yearly.")
              for i in range(4)]
    items.append(item("answer", "# Hangar inspection\n\nThe hangar inspection is done by the facilities team."))
    return items


async def test_a_chunk_holding_two_other_terms_together_is_found_without_the_rarest_one(fresh_kb):
    """In a large corpus BM25's candidates come from the rarest question terms. The best match here lacks the rarest
    term ("zeppelin") but holds the next two ("hangar", "inspection") together: it is found, and ranked first."""
    knobs: dict[str, Any] = {  # the search statements' knobs (SearchTuning)
        "rare_term_corpus_size": 0,  # act as a large corpus: rarest terms only
        "candidate_postings": 2,  # "zeppelin" (2 chunks) fills the budget alone
        "together_corpus_size": 0,  # ... and large enough for groups of terms
    }
    items = [item(f"airship-{i}", f"# Airship {i}\n\nA zeppelin model number {i} sits on the reception desk "
                                  "next to the plants, the post trays and the visitor book.") for i in range(2)]
    items += hangar_and_inspection_items()
    items += [item(f"other-{i}", f"# Note {i}\n\nThe kitchen rota for week {i} is on the fridge.") for i in range(8)]
    await fresh_kb.sync(StaticSource(SourceSpec("mixed", "test"), items))
    hits = (await tuned(fresh_kb, knobs).search("zeppelin hangar inspection", SearchFilters(), k=2, mode="lexical")).hits
    assert [h.external_id for h in hits][0] == "answer"
    assert hits[1].external_id.startswith("airship-")

    # A corpus smaller than together_corpus_size reads no groups: the rarest term's chunks only.
    knobs["together_corpus_size"] = len(items) + 1
    hits = (await tuned(fresh_kb, knobs).search("zeppelin hangar inspection", SearchFilters(), k=2, mode="lexical")).hits
    assert all(h.external_id.startswith("airship-") for h in hits)

    knobs["together_corpus_size"] = 0
    knobs["together_postings"] = 0  # no pair qualifies: the rarest term's chunks only
    hits = (await tuned(fresh_kb, knobs).search("zeppelin hangar inspection", SearchFilters(), k=2, mode="lexical")).hits
    assert all(h.external_id.startswith("airship-") for h in hits)


async def test_a_chunk_holding_three_other_terms_is_found_when_no_pair_of_them_qualifies(fresh_kb):
    """A short question of fairly common words: no two of its terms are rare enough together to bring candidates,
    but all three together are, and the best match holds all three."""
    knobs: dict[str, Any] = {  # the search statements' knobs (SearchTuning)
        "rare_term_corpus_size": 0,  # act as a large corpus: rarest terms only
        "candidate_postings": 2,  # "zeppelin" (2 chunks) fills the budget alone
        "together_corpus_size": 0,  # ... and large enough for groups of terms
        "together_max_df": 0,  # no pair qualifies
    }
    items = [item(f"airship-{i}", f"# Airship {i}\n\nA zeppelin model number {i} sits on the reception desk "
                                  "next to the plants, the post trays and the visitor book.") for i in range(2)]
    items += hangar_and_inspection_items()
    items += [item(f"facilities-{i}", f"# Facilities {i}\n\nThe facilities team orders paper for floor {i}.")
              for i in range(3)]
    await fresh_kb.sync(StaticSource(SourceSpec("mixed", "test"), items))
    question = "zeppelin hangar inspection facilities"
    hits = (await tuned(fresh_kb, knobs).search(question, SearchFilters(), k=2, mode="lexical")).hits
    assert hits[0].external_id == "answer"

    knobs["together_triple_max_df"] = 0  # no triple either: the rarest term's chunks only
    hits = (await tuned(fresh_kb, knobs).search(question, SearchFilters(), k=2, mode="lexical")).hits
    assert all(h.external_id.startswith("airship-") for h in hits)


async def test_a_question_of_common_words_finds_the_chunk_holding_two_of_them(fresh_kb):
    """When every question term is in many chunks, BM25's candidates were the first chunks holding the rarest one;
    the chunk holding both terms came later in the table and was not among them. It is now found through the pair."""
    knobs: dict[str, Any] = {  # the search statements' knobs (SearchTuning)
        "rare_term_corpus_size": 0,  # act as a large corpus
        "candidate_postings": 0,  # every term counts as common
        "candidate_scan_cap": 1,  # ... and in more chunks than the scan cap
        "common_index_df": 1,  # ... read in table order, not through the index
        "together_corpus_size": 0,  # ... and large enough for groups of terms
    }
    items = hangar_and_inspection_items()
    await fresh_kb.sync(StaticSource(SourceSpec("common", "test"), items))
    hits = (await tuned(fresh_kb, knobs).search("hangar inspection", SearchFilters(), k=1, mode="lexical")).hits
    assert [h.external_id for h in hits] == ["answer"]

    knobs["together_postings"] = 0  # no pairs: the first chunk holding "hangar" only
    hits = (await tuned(fresh_kb, knobs).search("hangar inspection", SearchFilters(), k=1, mode="lexical")).hits
    assert [h.external_id for h in hits] == ["hangar-0"]


async def test_a_common_term_read_through_the_index_is_read_whole(fresh_kb):
    """When no question term is rare, the rarest one's chunks are the candidates. Read through the GIN index, its
    posting list is read whole: the scan cap used to keep the first chunks found, which need not hold the best match."""
    knobs: dict[str, Any] = {  # the search statements' knobs (SearchTuning)
        "rare_term_corpus_size": 0,  # act as a large corpus
        "candidate_postings": 0,  # every term counts as common
        "candidate_scan_cap": 1,  # ... and in more chunks than the scan cap
    }
    await fresh_kb.sync(StaticSource(SourceSpec("common", "test"), hangar_and_inspection_items()))
    hits = (await tuned(fresh_kb, knobs).search("hangar inspection", SearchFilters(), k=1, mode="lexical")).hits
    assert [h.external_id for h in hits] == ["answer"]  # the last of the four chunks holding "hangar"


async def test_a_question_of_common_words_finds_the_chunk_that_repeats_them(fresh_kb):
    """When every question term is common and read in table order, the chunks read first need not be its best
    matches: those repeat the term, and are found in the index of term-frequency tiers, also by a reader who may see
    only some documents. A repeating chunk the asker may not see is not found."""
    knobs: dict[str, Any] = {  # the search statements' knobs (SearchTuning)
        "rare_term_corpus_size": 0,  # act as a large corpus
        "candidate_postings": 0,  # every term counts as common
        "candidate_scan_cap": 1,  # ... and in more chunks than the scan cap
        "common_index_df": 1,  # ... read in table order, not through the index
        "common_scan_rows": 3,  # ... only the first chunks of the table
    }
    items = [item(f"hangar-{i}", f"# Note {i}\n\nHangar {i} stores the spare chairs.") for i in range(6)]
    items.append(item("secret", "# Hangar audit\n\nHangar hangar hangar hangar: the hangar audit of the hangar.",
                      access=("group:audit",)))
    items.append(item("answer", "# Hangar rules\n\nEach hangar has a hangar warden, and the hangar keys stay there."))
    await fresh_kb.sync(StaticSource(SourceSpec("common", "test"), items))

    for principals in (("everyone",), ("user:ann",)):
        hits = (await tuned(fresh_kb, knobs).search("hangar", SearchFilters(principals), k=1, mode="lexical")).hits
        assert [h.external_id for h in hits] == ["answer"]
    hits = (await tuned(fresh_kb, knobs).search("hangar", SearchFilters(("group:audit",)), k=1, mode="lexical")).hits
    assert [h.external_id for h in hits] == ["secret"]

    # Chunks written before migration 0010 have no stored tiers: the index computes theirs from the tsvector, also
    # when Postgres rebuilds it (maintenance runs index expressions with a search_path of pg_catalog only).
    async with fresh_kb.engine.begin() as conn:
        await conn.execute(text("UPDATE chunks SET tf_tiers = NULL"))
    async with fresh_kb.engine.connect() as conn:  # a partitioned index (migration 0019) reindexes outside a transaction
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("REINDEX INDEX chunks_tf_tiers"))
    hits = (await tuned(fresh_kb, knobs).search("hangar", SearchFilters(), k=1, mode="lexical")).hits
    assert [h.external_id for h in hits] == ["answer"]

    knobs["tf_tiers"] = ()  # without the tiers: the first chunks of the table only
    hits = (await tuned(fresh_kb, knobs).search("hangar", SearchFilters(), k=1, mode="lexical")).hits
    assert [h.external_id for h in hits] != ["answer"]


async def test_source_and_date_filters(fresh_kb, tmp_path):
    old = datetime(2020, 1, 1, tzinfo=UTC)
    new = datetime.now(UTC)
    await fresh_kb.sync(StaticSource(SourceSpec("wiki", "test"), [
        item("wiki-vpn", "# VPN\n\nConnect to the VPN with Tailscale.", updated_at=new),
        item("wiki-old-vpn", "# Old VPN\n\nConnect to the VPN with Cisco AnyConnect.", updated_at=old),
    ]))
    write(tmp_path / "drive", "vpn.md", "# VPN notes\n\nThe VPN client is Tailscale.")
    await fresh_kb.sync(FolderSource(tmp_path / "drive"))

    only_drive = await fresh_kb.search("vpn client", SearchFilters(sources=("drive",)), k=10)
    assert {h.external_id for h in only_drive.hits} == {"vpn.md"}
    recent = await fresh_kb.search("vpn client", SearchFilters(sources=("wiki",), updated_after=new - timedelta(days=1)))
    assert {h.external_id for h in recent.hits} == {"wiki-vpn"}


async def test_at_most_n_chunks_per_document_and_duplicates_collapse(kb_factory):
    kb = await kb_factory(max_chunks_per_document=2, chunk_tokens=64, chunk_overlap_tokens=0)
    cities = ["Boston", "Denver", "Austin", "Chicago", "Seattle", "Miami", "Dallas", "Phoenix"]
    long_doc = "# Expenses\n\n" + "\n\n".join(
        f"## {city}\n\nIn {city}, meals on business trips are reimbursed up to {20 + i} dollars a day, "
        f"and the {city} office manager approves exceptions." for i, city in enumerate(cities)
    )
    pasted = "Meals on business trips are reimbursed when you keep the receipt and submit it within 30 days."
    await kb.sync(StaticSource(SourceSpec("finance", "test"), [
        item("expenses", long_doc),
        item("copy-a", f"# Team wiki\n\n{pasted}"),
        item("copy-b", f"# Team wiki\n\n{pasted}"),
    ]))
    hits = (await kb.search("are meals on business trips reimbursed", SearchFilters(), k=10)).hits
    ids = [h.external_id for h in hits]
    assert ids.count("expenses") == 2
    assert ids.count("copy-a") + ids.count("copy-b") == 1  # the pasted paragraph is shown once
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))


async def test_empty_query_is_rejected(fresh_kb):
    with pytest.raises(ValueError, match="empty"):
        await fresh_kb.search("   ", SearchFilters())


async def test_rerank_model_reorders_hits_by_its_scores(kb_factory):
    """RERANK_MODEL wiring: hits come back in the cross-encoder's order, scored by it. No trained cross-encoder
    ships offline, so this loads the bundled MiniLM checkpoint as one (its scoring head is untrained)."""
    from knowledge.embedding.encoder import resolve_model_path
    from knowledge.search.retrieval import _cross_encoders

    model = resolve_model_path("all-MiniLM-L6-v2")
    kb = await kb_factory(rerank_model=model)
    await kb.sync(StaticSource(SourceSpec("it", "test"), [
        item("vpn", "# VPN\n\nInstall Tailscale and sign in with Okta."),
        item("laptops", "# Laptops\n\nLaptops are refreshed every three years."),
        item("badges", "# Badges\n\nLost badges are replaced at the front desk."),
    ]))
    query = "how do I get on the VPN"
    hits = (await kb.search(query, SearchFilters(), k=3)).hits
    expected = [float(s) for s in _cross_encoders[model].predict([(query, h.text) for h in hits])]
    assert [h.score for h in hits] == pytest.approx(expected, rel=1e-5)
    assert expected == sorted(expected, reverse=True)
    assert [h.rank for h in hits] == [1, 2, 3]
