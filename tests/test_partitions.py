"""`chunks` partitioned by source (migration 0019, issue 43 item 4): one partition per source with its own indexes,
global BM25 statistics, searches of some sources that scan only their partitions, and the move of an existing index
from the single table (0018) and back."""

from __future__ import annotations

import json
import re
from typing import Any

from psycopg import sql as psql
from sqlalchemy import text

from db.engine import _driver_sql  # the product's own translation of text() parameters for psycopg
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.base import SourceItem, SourceSpec, StaticSource
from knowledge.storage import search as search_sql
from knowledge.storage.search import SearchTuning
from knowledge.storage.words import lexical_text

CORPUS = {
    "handbook": {
        "vacation": "# Vacation\n\nEvery employee gets 25 vacation days a year; unused days carry over until March.",
        "expenses": "# Expenses\n\nSubmit travel expenses within 30 days with receipts attached in the finance tool.",
        "laptops": "# Laptops\n\nNew hires receive a laptop on their first day; replacements come every three years.",
    },
    "wiki": {
        "deploys": "# Deploys\n\nProduction deploys run on Tuesdays and Thursdays after the release review.",
        "oncall": "# On-call\n\nThe on-call engineer answers pages within 15 minutes and hands over on Mondays.",
        "vacation-oncall": "# Vacation and on-call\n\nSwap your on-call week before taking vacation days.",
    },
    "runbooks": {
        "database": "# Database failover\n\nPromote the standby, then point the pooler at the new primary.",
        "certificates": "# Certificates\n\nCertificates renew automatically thirty days before they expire.",
    },
}

QUESTIONS = ["how many vacation days do I get", "when do production deploys run", "who answers on-call pages",
             "how do I fail over the database", "when do I get a new laptop"]


def _source(name: str) -> StaticSource:
    items = [SourceItem(external_id=key, filename=f"{key}.md", read=lambda body=body: body.encode(),
                        access=("everyone",)) for key, body in CORPUS[name].items()]
    return StaticSource(SourceSpec(name, "test"), items)


async def _sync_all(kb: Any) -> None:
    for name in CORPUS:
        report = await kb.sync(_source(name))
        assert not report.failed, report.failed


async def _partitions(kb: Any) -> dict[str, dict[str, str]]:
    """Each partition of `chunks`, with its indexes by access method."""
    async with kb.engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT c.relname AS partition, i.relname AS index, am.amname AS method FROM pg_inherits h "
            "JOIN pg_class c ON c.oid = h.inhrelid LEFT JOIN pg_index x ON x.indrelid = c.oid "
            "LEFT JOIN pg_class i ON i.oid = x.indexrelid LEFT JOIN pg_am am ON am.oid = i.relam "
            "WHERE h.inhparent = 'chunks'::regclass"))).all()
    found: dict[str, dict[str, str]] = {}
    for row in rows:
        found.setdefault(row.partition, {})
        if row.index:
            found[row.partition][row.index] = row.method
    return found


async def _source_ids(kb: Any) -> dict[str, int]:
    async with kb.engine.connect() as conn:
        return {r.name: r.id for r in await conn.execute(text("SELECT name, id FROM sources"))}


async def test_each_source_gets_its_own_partition_and_indexes_and_the_statistics_stay_global(fresh_kb):
    await _sync_all(fresh_kb)
    ids = await _source_ids(fresh_kb)
    partitions = await _partitions(fresh_kb)
    assert set(partitions) == {f"chunks_p{i}" for i in ids.values()} | {"chunks_default"}
    for name, source_id in ids.items():
        methods = sorted(partitions[f"chunks_p{source_id}"].values())
        # its own graph, its own lexical, access and tiers indexes, its own key
        assert methods.count("hnsw") == 1 and methods.count("gin") == 3 and "btree" in methods, (name, methods)
    async with fresh_kb.engine.connect() as conn:
        stored = (await conn.execute(text(
            "SELECT (SELECT n_chunks FROM corpus_stats) AS n, (SELECT count(*) FROM chunks) AS counted, "
            "(SELECT count(*) FROM chunks_default) AS strays, "
            "(SELECT count(*) FROM chunks_p" + str(ids["wiki"]) + ") AS wiki"))).one()
        wiki_chunks = (await conn.execute(text(
            "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id JOIN sources s "
            "ON s.id = d.source_id WHERE s.name = 'wiki'"))).scalar_one()
    assert stored.n == stored.counted > 0 and stored.strays == 0 and stored.wiki == wiki_chunks

    # a word of one source only counts in the one vocabulary; a search of another source cannot find it
    hits = await fresh_kb.search("certificates renew", SearchFilters(sources=("runbooks",)), k=3, mode="lexical")
    assert hits.hits and hits.hits[0].external_id == "certificates"
    other = await fresh_kb.search("certificates renew", SearchFilters(sources=("wiki",)), k=3, mode="lexical")
    assert all(h.source == "wiki" for h in other.hits) and "certificates" not in {h.external_id for h in other.hits}

    # removing a source removes its partition; the statistics count what is left
    await fresh_kb.remove_source("runbooks")
    assert f"chunks_p{ids['runbooks']}" not in await _partitions(fresh_kb)
    async with fresh_kb.engine.connect() as conn:
        n, counted = (await conn.execute(text(
            "SELECT (SELECT n_chunks FROM corpus_stats), (SELECT count(*) FROM chunks)"))).one()
    assert n == counted


def _scanned(plan: Any) -> set[str]:
    """The relations of `chunks` an EXPLAIN (FORMAT JSON) plan reads."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            name = node.get("Relation Name")
            if isinstance(name, str) and name.startswith("chunks"):
                found.add(name)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    return found


async def _explain(kb: Any, sql: str, params: dict[str, Any], *, generic: bool) -> set[str]:
    """The partitions the statement reads, from the plan Postgres runs it with: prepared with its parameters apart
    from its text (as the product's reads send them), then EXPLAIN EXECUTE, with a generic plan (as BM25's statement
    runs) or one planned for the values."""
    async with kb.engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        query = _driver_sql(text(sql), conn.dialect)
        names: list[str] = []
        for name in re.findall(r"%\((\w+)\)s", query):
            if name not in names:
                names.append(name)
        for i, name in enumerate(names, 1):
            query = query.replace(f"%({name})s", f"${i}")
        values = [psql.Literal(params[name]).as_string(driver) for name in names]
        async with driver.cursor() as cursor:
            await cursor.execute("SET plan_cache_mode = " + ("force_generic_plan" if generic else "force_custom_plan"))
            await cursor.execute("PREPARE partitions_explained AS " + query.replace("%%", "%"))
            await cursor.execute("EXPLAIN (FORMAT JSON) EXECUTE partitions_explained(" + ", ".join(values) + ")")
            (plan,) = await cursor.fetchone()
            await cursor.execute("DEALLOCATE partitions_explained")
            await cursor.execute("RESET plan_cache_mode")
    return _scanned(plan if not isinstance(plan, str) else json.loads(plan))


async def test_a_search_of_some_sources_scans_only_their_partitions(fresh_kb):
    await _sync_all(fresh_kb)
    ids = await _source_ids(fresh_kb)
    vector = await fresh_kb.retriever.query_vector("how many vacation days do I get")
    vector = "[" + ",".join(str(float(x)) for x in vector) + "]"
    params = {"principals": ["everyone"], "updated_after": None, "n": 10, "embedding": vector,
              "config": fresh_kb.settings.text_search_config, "query": lexical_text("vacation days"),
              **SearchTuning().params()}
    dimension = fresh_kb.embedder.dimension
    some = {**params, "source_ids": [ids["handbook"], ids["wiki"]]}
    wanted = {f"chunks_p{ids['handbook']}", f"chunks_p{ids['wiki']}"}
    every = {f"chunks_p{i}" for i in ids.values()} | {"chunks_default"}

    dense = await _explain(fresh_kb, search_sql.dense_sql(dimension, by_source=True), some, generic=False)
    assert dense == wanted
    # BM25's statement as a search of some sources runs it: planned for their ids (a generic plan cannot prune on
    # `= ANY(array)`, so lexical_rows does not ask for one then)
    lexical = await _explain(fresh_kb, str(search_sql._LEXICAL[False, False, True].text), some, generic=False)
    assert lexical == wanted
    permitted = await _explain(fresh_kb, str(search_sql._LEXICAL[True, False, True].text), some, generic=False)
    assert permitted == wanted
    # ... and as a reader of few chunks runs it (access checked inside the lexical index)
    narrow = await _explain(fresh_kb, str(search_sql._LEXICAL[False, True, True].text), some, generic=False)
    assert narrow == wanted
    # without a source limit every partition is read
    assert await _explain(fresh_kb, search_sql.dense_sql(dimension), params, generic=False) == every

    # and the product's search of those sources answers from them alone
    results = await fresh_kb.search("vacation days", SearchFilters(sources=("handbook", "wiki")), k=10)
    assert {h.source for h in results.hits} <= {"handbook", "wiki"} and results.hits


async def _answers(kb: Any) -> list[Any]:
    """What the questions return: each hit's chunk, source and score, every mode, every source and one source."""
    out = []
    for question in QUESTIONS:
        for mode in ("hybrid", "dense", "lexical"):
            for sources in (None, ("wiki",)):
                results = await kb.search(question, SearchFilters(sources=sources), k=5, mode=mode)
                out.append((question, mode, sources, [(h.chunk_id, h.source, h.external_id, round(h.score, 6))
                                                      for h in results.hits]))
    return out


async def _statistics(kb: Any) -> tuple[Any, ...]:
    async with kb.engine.connect() as conn:
        stats = (await conn.execute(text("SELECT n_chunks, total_len, weights_avgdl FROM corpus_stats"))).one()
        df = (await conn.execute(text("SELECT sum(df), count(*) FILTER (WHERE df > 0) FROM lexemes"))).one()
        kind = (await conn.execute(text("SELECT relkind FROM pg_class WHERE oid = 'chunks'::regclass"))).scalar()
    return tuple(stats), tuple(df), kind


async def test_an_index_built_at_0018_moves_to_partitions_and_back_with_the_same_answers(kb_factory, fresh_database):
    from alembic import command
    from db.migrate import alembic_config, upgrade_to_head

    def downgrade(sync_connection) -> None:  # type: ignore[no-untyped-def]
        config = alembic_config()
        config.attributes["connection"] = sync_connection
        command.downgrade(config, "0018_cjk_lexemes")

    url = fresh_database()
    kb = await kb_factory(url)
    async with kb.engine.begin() as conn:
        await conn.run_sync(downgrade)
    await kb.engine.dispose()
    await _sync_all(kb)  # an index as 0018 holds it: one table
    before, stats = await _answers(kb), await _statistics(kb)
    assert stats[2] == "r" and all(hits for _, mode, sources, hits in before if mode == "hybrid" and sources is None)

    await upgrade_to_head(kb.engine)
    kb.retriever._query_vectors.clear()
    moved = await _statistics(kb)
    assert moved[2] == "p" and moved[:2] == stats[:2]
    assert await _answers(kb) == before
    ids = await _source_ids(kb)
    async with kb.engine.connect() as conn:
        strays = (await conn.execute(text("SELECT count(*) FROM chunks_default"))).scalar_one()
        placed = (await conn.execute(text(
            f"SELECT count(*) FROM chunks_p{ids['wiki']}"))).scalar_one()
    assert strays == 0 and placed > 0

    async with kb.engine.begin() as conn:
        await conn.run_sync(downgrade)
    await kb.engine.dispose()
    kb.retriever._query_vectors.clear()
    back = await _statistics(kb)
    assert back[2] == "r" and back[:2] == stats[:2]
    assert await _answers(kb) == before


def _one_chunk(key: str, body: str) -> SourceItem:
    return SourceItem(external_id=key, filename=f"{key}.md", read=lambda body=body: body.encode(),
                      access=("everyone",))


async def _search_lists_in_the_pool(kb: Any) -> list[tuple[str | None, str]]:
    """Every pooled search connection's HNSW search list: as the pool remembers it (read_rows SETs it only where
    that differs) and as Postgres has it."""
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as stack:  # every connection the searches' pool holds (5, and 5 more it may open)
        connections = [await stack.enter_async_context(kb.search_engine.connect()) for _ in range(10)]
        return [(conn.info.get("hnsw.ef_search"),
                 (await conn.execute(text("SELECT current_setting('hnsw.ef_search')"))).scalar_one())
                for conn in connections]


async def test_the_hnsw_search_list_follows_the_largest_graph_searched(kb_factory, fresh_database):
    """Each partition has its own HNSW graph, and a search walks each graph it reads with one search list: that
    list is sized for the largest graph searched (the searched source's partition, or the largest of all), not for
    the corpus (at a million chunks over ten sources, ten graphs of 100k were each walked with a million-chunk
    graph's list, 800 instead of 200). One table keeps the corpus's size. The answers stay the same."""
    from alembic import command
    from db.migrate import alembic_config
    from knowledge.search.retrieval import Retriever

    kb = await kb_factory(fresh_database())
    teams = [_one_chunk(f"team-{i}", f"# Team {i} rituals\n\nTeam {i} holds a planning meeting every March.")
             for i in range(230)]
    guilds = [_one_chunk(f"guild-{i}", f"# Guild {i}\n\nGuild {i} meets on Fridays in room {i}.") for i in range(300)]
    for name, items in (("teams", teams), ("guilds", guilds)):
        report = await kb.sync(StaticSource(SourceSpec(name, "test"), items))
        assert not report.failed, report.failed
    async with kb.engine.connect() as conn:
        await (await conn.execution_options(isolation_level="AUTOCOMMIT")).execute(text("ANALYZE chunks"))
        counts = {r.name: str(r.n) for r in await conn.execute(text(
            "SELECT s.name, count(*) AS n FROM chunks c JOIN sources s ON s.id = c.source_id GROUP BY s.name"))}
        corpus = str((await conn.execute(text("SELECT n_chunks FROM corpus_stats"))).scalar_one())
    assert int(counts["teams"]) > 200 and int(counts["guilds"]) > int(counts["teams"])
    # every chunk counts as a search list entry (no less than db.engine.HNSW_EF_SEARCH, 200), read at every search
    tuning = SearchTuning(chunks_per_ef_search=1, corpus_size_ttl_s=0.0)
    retriever = Retriever(kb.search_engine, kb.embedder, kb.settings, tuning)
    every, only_teams = SearchFilters(), SearchFilters(sources=("teams",))

    async def top(filters: SearchFilters, question: str) -> list[str]:
        hits = (await retriever.search(question, filters, k=5, mode="dense")).hits
        return [h.external_id for h in hits]

    before = {(q, f.sources): [h.external_id for h in (await kb.search(q, f, k=5, mode="dense")).hits]
              for q in ("when does team 7 plan", "where does guild 12 meet") for f in (every, only_teams)}

    assert (await top(every, "where does guild 12 meet"))[0] == "guild-12"
    pooled = await _search_lists_in_the_pool(kb)
    assert (counts["guilds"], counts["guilds"]) in pooled
    assert all(remembered == actual for remembered, actual in pooled)
    assert not any(actual == corpus for _, actual in pooled)  # the corpus: what it was sized for before
    assert (await top(only_teams, "when does team 7 plan"))[0] == "team-7"
    pooled = await _search_lists_in_the_pool(kb)
    assert (counts["teams"], counts["teams"]) in pooled
    assert all(remembered == actual for remembered, actual in pooled)
    # the same answers as with the default search list
    assert {(q, s): await top(SearchFilters(sources=s), q) for q, s in before} == before

    # one table (the layout before migration 0019): one graph of every chunk, whatever the sources searched
    def downgrade(sync_connection) -> None:  # type: ignore[no-untyped-def]
        config = alembic_config()
        config.attributes["connection"] = sync_connection
        command.downgrade(config, "0018_cjk_lexemes")

    async with kb.engine.begin() as conn:
        await conn.run_sync(downgrade)
    for engine in (kb.engine, kb.search_engine):
        await engine.dispose()
    assert (await top(only_teams, "when does team 7 plan"))[0] == "team-7"
    pooled = await _search_lists_in_the_pool(kb)
    assert (corpus, corpus) in pooled and all(remembered == actual for remembered, actual in pooled)
    assert {(q, s): await top(SearchFilters(sources=s), q) for q, s in before} == before
