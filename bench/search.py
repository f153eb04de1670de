"""Search at scale: latency of the product's search call beside the raw SQL floor, index build, sizes, recall.

    PYTHONPATH=. .venv/bin/python bench/search.py --chunks 10k            # the quick set (make bench)
    PYTHONPATH=. .venv/bin/python bench/search.py --chunks 10k,100k,1M    # larger sizes take tens of minutes
    PYTHONPATH=. .venv/bin/python bench/search.py --chunks 100k --sources 10 --layout single,partitioned

`--sources N` spreads the documents over N sources (bench-0 ... by document number) and also times searches
limited to one source (`hybrid_one_source*`, recall against exact search within that source). `--layout` measures
`chunks` as one table (migration 0018) and/or partitioned by source (0019): the corpus is loaded once, in the first
layout, and moved to the next by the migration itself (its duration is reported as `migrate_s`).

For each size, a fresh database is filled with the synthetic corpus of bench/common.py through the product's own
storage path (`store.write_documents`: the BM25 statistics, weights and GIN index maintained exactly as in a sync),
then the HNSW index is built the way the product builds it (`store.ensure_vector_index`). Measured:
- p50/p95/p99 of `KnowledgeBase.search` (k=10) for hybrid, dense and lexical; query embedding included (the query
  cache emptied before each call) and excluded (the query vector cached); as `group:all` (every document) and as
  `group:g3` (10% of the documents);
- the floor in the same run: a bare HNSW top-10 (`ORDER BY embedding <=> q LIMIT 10`) over the same pool and the
  same query vectors, timed right after every product call (so both see the same moment's load), and once more
  unfiltered and filtered after all of them; and the same top-10 through the driver alone (psycopg on one
  connection, no SQLAlchemy, no pool checkout: `raw_driver`), the least a statement can cost from Python;
- HNSW build time, table and index sizes;
- recall@10 of the product's dense path against exact (sequential) cosine search, unfiltered and filtered, and how
  often its best hit is exact search's (the floors use the product's HNSW search list for the size: `hnsw_ef_search`);
- recall@10 of the product's lexical path against exact Okapi BM25 computed from every chunk's lexemes with the
  current corpus statistics (no candidate pruning, no stored weights).
Results go to bench/results/search.json (sizes measured before are kept).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    PlantedQueryEmbedder,
    SyntheticCorpus,
    database_versions,
    drop_database,
    machine_info,
    open_existing_kb,
    open_fresh_kb,
    parse_size,
    real_questions,
    summary,
    timer,
    use_throwaway_home,
    write_results,
)

use_throwaway_home()

import numpy as np  # noqa: E402
from sqlalchemy import text  # noqa: E402

from db.engine import read_rows  # noqa: E402
from knowledge.search.retrieval import SearchFilters  # noqa: E402
from knowledge.storage import documents as store  # noqa: E402

EVERY_DOCUMENT = ("group:all",)
TEN_PERCENT = ("group:g3",)
WRITE_BATCH_CHUNKS = 2000


def regenerate_sample(dimension: int, n_chunks: int) -> tuple[SyntheticCorpus, list[tuple[str, np.ndarray]]]:
    """The corpus and question sample `load_corpus` produced, generated again without storing (for --reuse). The
    questions are drawn from the generator's state after the whole corpus, so the whole corpus is generated again
    (minutes at a million chunks); the result is kept in a file for the next --reuse run, named after the code that
    generates it (SyntheticCorpus), so a changed generator never reuses an old one."""
    import hashlib
    import inspect
    import pickle
    import tempfile

    import common

    generator = inspect.getsource(common.SyntheticCorpus) + inspect.getsource(common.pseudo_words)
    code = hashlib.sha256(generator.encode()).hexdigest()[:12]
    kept = Path(tempfile.gettempdir()) / f"ragbot-bench-sample-{dimension}-{n_chunks}-{code}.pickle"
    if kept.exists():
        corpus, sample = pickle.loads(kept.read_bytes())
        return corpus, sample
    corpus = SyntheticCorpus(dimension)
    sample = [(d.chunks[0], d.vectors[0]) for d in corpus.documents(n_chunks) if d.number % 7 == 0][:2000]
    kept.write_bytes(pickle.dumps((corpus, sample)))
    return corpus, sample


def source_names(n_sources: int) -> list[str]:
    return ["bench"] if n_sources <= 1 else [f"bench-{i}" for i in range(n_sources)]


async def set_layout(kb, layout: str) -> float:  # type: ignore[no-untyped-def]
    """Move `chunks` to `layout` with the migration itself ("single": 0018's one table with 0023's lexical index,
    "partitioned": 0019 and on), then VACUUM (ANALYZE) it; returns the migration's seconds."""
    from alembic import command
    from db.migrate import alembic_config

    def migrate(sync_connection) -> None:  # type: ignore[no-untyped-def]
        config = alembic_config()
        config.attributes["connection"] = sync_connection
        if layout == "single":
            command.downgrade(config, "0018_cjk_lexemes")
            # ... with today's lexical index (migration 0023), so the layouts differ only in partitioning
            sync_connection.execute(text("CREATE INDEX IF NOT EXISTS chunks_tsv_access ON chunks USING gin (tsv, access)"))
            sync_connection.execute(text("DROP INDEX IF EXISTS chunks_tsv"))
        else:
            command.upgrade(config, "head")

    started = timer()
    async with kb.engine.begin() as conn:
        kind = (await conn.execute(text("SELECT relkind FROM pg_class WHERE oid = 'chunks'::regclass"))).scalar()
        if (kind == "p") == (layout == "partitioned"):
            return 0.0
        await conn.run_sync(migrate)
    elapsed = timer() - started
    for engine in {kb.engine, kb.search_engine}:
        await engine.dispose()
    async with kb.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM (ANALYZE) chunks"))
    return elapsed


async def load_corpus(kb, n_chunks: int, n_sources: int = 1) -> tuple[SyntheticCorpus, list[tuple[str, np.ndarray]], dict[str, float]]:  # type: ignore[no-untyped-def]
    """Write n_chunks synthetic chunks through the product's store path (documents 10k..10k+9 in source k mod
    n_sources),
    then build the HNSW index."""
    corpus = SyntheticCorpus(kb.embedder.dimension)
    sample: list[tuple[str, np.ndarray]] = []  # (chunk text, its vector): what questions are drawn from
    async with kb.engine.begin() as conn:
        source_ids = [await store.ensure_source(conn, name, "bench", None) for name in source_names(n_sources)]
    generate_s = store_s = 0.0
    batches: list[list[store.DocumentWrite]] = [[] for _ in source_ids]
    written = 0

    async def flush(i: int) -> None:
        nonlocal store_s, written
        batch = batches[i]
        started = timer()
        await store.write_documents(kb.engine, source_ids[i], batch, kb.settings.text_search_config)
        store_s += timer() - started
        written += sum(len(d.chunks) for d in batch)
        batch.clear()
        print(f"\r  stored {written:,}/{n_chunks:,} chunks", end="", flush=True)

    await kb.ensure_embedding_space()
    # As a first sync writes (store.bulk_load): without the HNSW graph, built once at the end.
    async with store.bulk_load(kb.engine) as bulk:
        assert bulk, "the benchmark database was not empty"
        started = timer()
        pending = [0] * len(source_ids)
        for document in corpus.documents(n_chunks):
            # runs of ten documents (one of each access group) per source, so every source holds every group
            i = document.number // 10 % len(source_ids)
            rows = [
                store.ChunkRow(i, body, "", len(body.split()), f"{document.number}-{i}",
                               store.as_vector(vector), body)
                for i, (body, vector) in enumerate(zip(document.chunks, document.vectors, strict=False))
            ]
            if len(sample) < 2000 and document.number % 7 == 0:
                sample.append((document.chunks[0], document.vectors[0]))
            batches[i].append(store.DocumentWrite(
                external_id=f"doc-{document.number}", title=f"Synthetic document {document.number}", url=None,
                path=None, author=None, updated_at=None, content_hash=f"h{document.number}", access=document.access,
                chunks=rows,
            ))
            pending[i] += len(rows)
            if pending[i] >= WRITE_BATCH_CHUNKS:
                generate_s += timer() - started
                await flush(i)
                pending[i] = 0
                started = timer()
        generate_s += timer() - started
        for i, batch in enumerate(batches):
            if batch:
                await flush(i)
        print()
        started = timer()  # the graph is built (and the table analysed) when the bulk load ends
    index_s = timer() - started
    async with kb.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM (ANALYZE) chunks"))
        await conn.execute(text("ANALYZE lexemes"))
    return corpus, sample, {"generate_s": round(generate_s, 1), "store_s": round(store_s, 1),
                            "store_chunks_per_s": round(n_chunks / store_s, 1), "hnsw_build_s": round(index_s, 1)}


async def sizes(kb) -> dict[str, object]:  # type: ignore[no-untyped-def]
    async with kb.engine.connect() as conn:
        # summed over the partitions when chunks is partitioned (the parent itself stores nothing)
        table = (await conn.execute(text(
            "WITH t AS (SELECT oid AS relid FROM pg_class WHERE oid = 'chunks'::regclass AND relkind = 'r' "
            "UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = 'chunks'::regclass) "
            "SELECT (SELECT sum(pg_total_relation_size(relid))::bigint FROM t) AS total, "
            "(SELECT sum(pg_relation_size(relid))::bigint FROM t) AS heap, "
            "(SELECT sum(pg_total_relation_size(relid) - pg_relation_size(relid) - pg_indexes_size(relid))::bigint "
            "FROM t) AS toast, (SELECT sum(pg_indexes_size(relid))::bigint FROM t) AS indexes, "
            "pg_total_relation_size('lexemes') AS lexemes, "
            "(SELECT count(*) FROM chunks) AS chunks, (SELECT count(*) FROM lexemes) AS vocabulary"
        ))).one()
        indexes = (await conn.execute(text(
            "SELECT coalesce(p.relname, i.indexrelname) AS indexrelname, sum(pg_relation_size(i.indexrelid))::bigint AS size "
            "FROM pg_stat_user_indexes i LEFT JOIN pg_inherits h ON h.inhrelid = i.indexrelid "
            "LEFT JOIN pg_class p ON p.oid = h.inhparent "
            "WHERE i.relid = 'chunks'::regclass "
            "OR i.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'chunks'::regclass) "
            "GROUP BY 1 ORDER BY 2 DESC"
        ))).all()
    mb = 1024 * 1024
    return {
        "chunks_table_mb": round(table.total / mb, 1), "heap_mb": round(table.heap / mb, 1),
        "toast_mb": round(table.toast / mb, 1), "indexes_mb": round(table.indexes / mb, 1),
        "lexemes_mb": round(table.lexemes / mb, 1), "vocabulary": table.vocabulary,
        "bytes_per_chunk": round(table.total / max(table.chunks, 1)),
        "index_mb": {name: round(size / mb, 1) for name, size in indexes},
    }


async def timed_search(kb, queries: list[str], mode: str, principals: tuple[str, ...], embed: bool,  # type: ignore[no-untyped-def]
                       floor_vectors: list[str] | None = None, floor: list[float] | None = None,
                       sources: tuple[str, ...] | None = None):
    """Time the product's search per query; with floor_vectors, the bare HNSW top-10 for the same query right after
    each call (appended to `floor`), so both see the same moment's load. `sources`: a search limited to them."""
    samples, short = [], 0
    filters = SearchFilters(principals, sources=sources)
    for i, query in enumerate(queries):
        if embed:
            kb.retriever._query_vectors.pop(query, None)  # the product's query cache: forget this one
        started = timer()
        results = await kb.search(query, filters, k=10, mode=mode)
        samples.append((timer() - started) * 1000)
        short += len(results.hits) < 10
        if floor_vectors is not None and floor is not None:
            floor.extend(await raw_floor(kb, [floor_vectors[i]], None))
    return samples, short


async def raw_floor(kb, vectors: list[np.ndarray], principals: tuple[str, ...] | None) -> list[float]:  # type: ignore[no-untyped-def]
    """The bare HNSW top-10 as every product statement runs: a pooled connection in autocommit, db.engine.read_rows,
    and the HNSW search list the product's search uses for this corpus (its own cached value, SET on a connection
    only when it differs). Nothing here may run a transaction on the pool: psycopg's rollback drops every statement
    the connection had prepared, BM25's with its generic plan, and a floor that did slowed the product's next
    lexical search by 5 ms."""
    dim = kb.embedder.dimension
    where = "WHERE access && CAST(:p AS text[])" if principals else ""
    sql = text(f"SELECT id FROM chunks {where} ORDER BY embedding::halfvec({dim}) <=> CAST(:q AS halfvec({dim})) "
               "LIMIT 10")
    samples = []
    for vector in vectors:
        started = timer()
        async with kb.retriever._reads.connect() as conn:
            settings = {"hnsw.ef_search": await kb.retriever._ef_search_for_corpus(conn)}
            await read_rows(conn, sql, {"q": vector, "p": list(principals or [])}, settings=settings)
        samples.append((timer() - started) * 1000)
    return samples


async def raw_driver_floor(kb, vectors: list[np.ndarray]) -> list[float]:  # type: ignore[no-untyped-def]
    """The bare HNSW top-10 through the database driver alone (psycopg on one pooled connection, no SQLAlchemy, no
    pool checkout): the lowest a search statement can cost from Python, beside `raw_floor`. Same HNSW search list
    as the product's."""
    dim = kb.embedder.dimension
    sql = f"SELECT id FROM chunks ORDER BY embedding::halfvec({dim}) <=> CAST(%s AS halfvec({dim})) LIMIT 10"
    samples = []
    async with kb.retriever._reads.connect() as conn:
        settings = {"hnsw.ef_search": await kb.retriever._ef_search_for_corpus(conn)}
        await read_rows(conn, text("SELECT 1"), {}, settings=settings)  # the product's search list, if it differs
        driver = (await conn.get_raw_connection()).driver_connection
        for vector in vectors:
            started = timer()
            await (await driver.execute(sql, (vector,))).fetchall()
            samples.append((timer() - started) * 1000)
    return samples


async def exact_dense(kb, vector: np.ndarray, principals: tuple[str, ...], source: str | None = None) -> list[int]:  # type: ignore[no-untyped-def]
    """The exact top-10 by full-precision cosine (a sequential scan), best first (within `source` if given)."""
    async with kb.engine.begin() as conn:
        await conn.execute(text("SET LOCAL enable_indexscan = off"))
        await conn.execute(text("SET LOCAL enable_bitmapscan = off"))
        rows = await conn.execute(
            text("SELECT id FROM chunks WHERE access && CAST(:p AS text[]) AND (CAST(:s AS text) IS NULL "
                 "OR source_id = (SELECT id FROM sources WHERE name = CAST(:s AS text))) "
                 "ORDER BY embedding <=> CAST(:q AS vector) LIMIT 10"),
            {"q": vector, "p": list(principals) + ["everyone"], "s": source},
        )
        return [r.id for r in rows]


EXACT_BM25 = text("""
WITH s AS (
    SELECT n_chunks::float8 AS n, total_len::float8 / greatest(n_chunks, 1) AS avgdl, k1, b FROM corpus_stats
),
q AS (
    SELECT l.lexeme, ln(1 + (s.n - l.df + 0.5) / (l.df + 0.5)) AS idf
    FROM lexemes l, s
    WHERE l.lexeme = ANY(tsvector_to_array(to_tsvector(CAST(:config AS regconfig), :query))) AND l.df > 0
),
candidates AS (
    SELECT c.id, c.tsv, c.lexical_len FROM chunks c
    WHERE c.tsv @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM q)
      AND (CAST(:source AS text) IS NULL OR c.source_id = (SELECT id FROM sources WHERE name = CAST(:source AS text)))
)
SELECT c.id, sum(q.idf * x.tf * (s.k1 + 1) / (x.tf + s.k1 * (1 - s.b + s.b * c.lexical_len / s.avgdl))) AS score
FROM candidates c CROSS JOIN s, unnest(c.tsv) t
JOIN q ON q.lexeme = t.lexeme
CROSS JOIN LATERAL (SELECT coalesce(array_length(t.positions, 1), 1)::float8 AS tf) x
GROUP BY c.id ORDER BY score DESC, c.id LIMIT 10
""")


async def exact_answers(kb, query: str, vector: np.ndarray, source: str | None) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    """Exact search's top-10 for a question: dense for everyone and for the 10% reader, and BM25 (within `source`).
    Kept in a file per database and corpus (bench/results/.exact-<database>-<chunks>-<total length>.json): they do
    not change while a kept database is only searched, and at a million chunks each question costs tens of seconds,
    so a --reuse run computes them once (`bench/search_ab.py --truths-only` computes them untimed, before a locked
    run)."""
    import json

    from common import RESULTS

    async with kb.engine.connect() as conn:
        stats = (await conn.execute(text("SELECT n_chunks, total_len FROM corpus_stats WHERE id = 1"))).one()
    path = RESULTS / f".exact-{kb.engine.url.database}-{stats.n_chunks}-{stats.total_len}.json"
    known: dict[str, dict[str, list[int]]] = json.loads(path.read_text()) if path.exists() else {}
    key = f"{source}|{query}"
    if key not in known:
        entry = {"all": await exact_dense(kb, vector, EVERY_DOCUMENT, source),
                 "ten": await exact_dense(kb, vector, TEN_PERCENT, source)}
        async with kb.engine.connect() as conn:
            entry["lexical"] = [r.id for r in await conn.execute(
                EXACT_BM25, {"query": query, "config": kb.settings.text_search_config, "source": source})]
        known = json.loads(path.read_text()) if path.exists() else {}
        known[key] = entry
        path.write_text(json.dumps(known))
    return known[key]


async def recall(kb, queries: list[str], source: str | None = None) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """recall@10 of the product's dense and lexical paths against exact search, and how often the dense path's
    best hit is exact search's: on these clustered vectors most of recall@10's misses are near-ties (hits as similar
    as the ones missed), while a different best hit means the search missed the question's clear answer. `source`:
    searches limited to that source, against exact search within it."""
    dense = dense_filtered = lexical = top1 = top1_filtered = 0.0
    sources = (source,) if source else None
    for query in queries:
        vector = await kb.retriever.query_vector(query)
        truth = await exact_answers(kb, query, vector, source)
        for principals, bucket in ((EVERY_DOCUMENT, "all"), (TEN_PERCENT, "ten")):
            exact = truth[bucket]
            got = [h.chunk_id for h in (await kb.search(query, SearchFilters(principals, sources=sources), k=10,
                                                        mode="dense", max_per_document=10)).hits]
            share = len(set(exact) & set(got)) / max(len(exact), 1)
            same_best = float(exact[:1] == got[:1])
            if bucket == "all":
                dense += share
                top1 += same_best
            else:
                dense_filtered += share
                top1_filtered += same_best
        exact_lex = set(truth["lexical"])
        got_lex = {h.chunk_id for h in (await kb.search(query, SearchFilters(EVERY_DOCUMENT, sources=sources), k=10,
                                                        mode="lexical", max_per_document=10)).hits}
        lexical += len(exact_lex & got_lex) / max(len(exact_lex), 1)
    n = len(queries)
    return {"hnsw_recall@10": round(dense / n, 4), "hnsw_filtered_recall@10": round(dense_filtered / n, 4),
            "hnsw_top1_agreement": round(top1 / n, 4), "hnsw_filtered_top1_agreement": round(top1_filtered / n, 4),
            "lexical_recall@10": round(lexical / n, 4)}


async def levers(kb, queries: list[str], vectors: list[str]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Measured, not assumed: HNSW ef_search, a full-precision HNSW index beside the product's halfvec one, and the
    lexical candidate rule (how many
    postings the rarest question terms may bring)."""
    from knowledge.search.retrieval import Retriever, SearchTuning

    dim = kb.embedder.dimension
    out: dict[str, object] = {}
    exact = [await exact_dense(kb, v, EVERY_DOCUMENT) for v in vectors]

    async def dense_run(sql: str, settings: str = "") -> dict[str, float]:
        samples, hits = [], 0.0
        for vector, truth in zip(vectors, exact, strict=False):
            async with kb.engine.begin() as conn:
                if settings:
                    await conn.execute(text(settings))
                started = timer()
                ids = {r.id for r in await conn.execute(text(sql), {"q": vector})}
                samples.append((timer() - started) * 1000)
            hits += len(ids & set(truth)) / max(len(truth), 1)
        return {"recall@10": round(hits / len(vectors), 4), **summary(samples)}

    vector_sql = (f"SELECT id FROM chunks ORDER BY embedding::halfvec({dim}) <=> CAST(:q AS halfvec({dim})) "
                  "LIMIT 10")
    for ef in (40, 100, 200, 400):
        out[f"hnsw_ef_search_{ef}"] = await dense_run(vector_sql, f"SET LOCAL hnsw.ef_search = {ef}")
        print(f"  ef_search {ef}: {out[f'hnsw_ef_search_{ef}']}")
    # The alternative to the product's half-precision graph: a full-precision one (what ragbot built before 0007).
    started = timer()
    async with kb.engine.begin() as conn:
        n = (await conn.execute(text("SELECT count(*) FROM chunks"))).scalar_one()
        # a full-precision graph is about twice the size of the half-precision one
        await conn.execute(text(f"SET LOCAL maintenance_work_mem = '{store.index_build_memory(2 * n)}'"))
        await conn.execute(text(f"CREATE INDEX bench_fullvec ON chunks USING hnsw ((embedding::vector({dim})) "
                                "vector_cosine_ops)"))
    build = timer() - started
    async with kb.engine.connect() as conn:
        size = (await conn.execute(text("SELECT pg_relation_size('bench_fullvec')"))).scalar_one()
    full = await dense_run(f"SELECT id FROM chunks ORDER BY embedding::vector({dim}) <=> "
                           f"CAST(:q AS vector({dim})) LIMIT 10")
    out["full_precision_hnsw"] = {**full, "build_s": round(build, 1), "index_mb": round(size / 1024 / 1024, 1)}
    print(f"  full-precision vector index: {out['full_precision_hnsw']}")
    async with kb.engine.begin() as conn:
        await conn.execute(text("DROP INDEX bench_fullvec"))

    truths = []
    for query in queries:
        async with kb.engine.connect() as conn:
            truths.append({r.id for r in await conn.execute(
                EXACT_BM25, {"query": query, "config": kb.settings.text_search_config, "source": None})})
    for postings in (1000, 2000, 3000, 5000, 10000):
        retriever = Retriever(kb.search_engine, kb.embedder, kb.settings, SearchTuning(candidate_postings=postings))
        samples, hits = [], 0.0
        for query, truth in zip(queries, truths, strict=False):
            started = timer()
            got = await retriever.search(query, SearchFilters(EVERY_DOCUMENT), k=10, mode="lexical",
                                         max_per_document=10)
            samples.append((timer() - started) * 1000)
            hits += len({h.chunk_id for h in got.hits} & truth) / max(len(truth), 1)
        out[f"lexical_candidate_postings_{postings}"] = {"recall@10": round(hits / len(queries), 4),
                                                         **summary(samples)}
        print(f"  lexical candidate postings <= {postings}: {out[f'lexical_candidate_postings_{postings}']}")
    return out


async def measure(kb, queries: list[str], vectors: list[np.ndarray], recall_queries: int,  # type: ignore[no-untyped-def]
                  with_levers: bool, one_source: str | None) -> dict[str, object]:
    """Every timing and recall of one layout of the loaded corpus (see the module docstring)."""
    figures: dict[str, object] = {**await sizes(kb),
                                  "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    for query in queries[:20]:  # warm the connection pool, the model and Postgres' caches
        await kb.search(query, SearchFilters(EVERY_DOCUMENT), k=10, mode="hybrid")
        if one_source:
            await kb.search(query, SearchFilters(EVERY_DOCUMENT, sources=(one_source,)), k=10, mode="hybrid")
    latency: dict[str, object] = {}
    short: dict[str, int] = {}
    floor: list[float] = []  # the bare HNSW top-10, timed right after every product call
    for embed in (False, True):
        for mode in ("hybrid", "dense", "lexical"):
            if mode == "lexical" and embed:
                continue  # lexical search never embeds the query
            for label, principals in (("", EVERY_DOCUMENT), ("_filtered", TEN_PERCENT)):
                samples, missing = await timed_search(kb, queries, mode, principals, embed, vectors, floor)
                key = f"{mode}{label}" + ("" if embed or mode == "lexical" else "_cached_query")
                latency[key] = summary(samples)
                short[key] = missing
                print(f"  {key:32s} {latency[key]}")
        if embed:
            break
    if one_source:  # searches limited to one source (a channel's source, --source), question embedded
        for label, principals in (("", EVERY_DOCUMENT), ("_filtered", TEN_PERCENT)):
            samples, missing = await timed_search(kb, queries, "hybrid", principals, True, sources=(one_source,))
            key = f"hybrid_one_source{label}"
            latency[key] = summary(samples)
            short[key] = missing
            print(f"  {key:32s} {latency[key]}")
    # the floor again, all at once after the product's calls (for comparison with the interleaved one)
    latency["raw_sql"] = summary(floor)
    latency["raw_sql_after"] = summary(await raw_floor(kb, vectors, None))
    latency["raw_sql_filtered"] = summary(await raw_floor(kb, vectors, TEN_PERCENT))
    latency["raw_driver"] = summary(await raw_driver_floor(kb, vectors))
    for key in ("raw_sql", "raw_sql_filtered", "raw_driver"):
        print(f"  {key:32s} {latency[key]}")
    print("  recall against exact search ...")
    figures.update(await recall(kb, queries[:recall_queries]))
    if one_source:
        figures["one_source"] = await recall(kb, queries[:recall_queries], one_source)
        print(f"  recall within {one_source}: {figures['one_source']}")
    if with_levers:
        print("  levers ...")
        figures["levers"] = await levers(kb, queries[:recall_queries], vectors[:recall_queries])
    figures["latency_ms"] = latency
    figures["searches_with_fewer_than_10_results"] = short
    for key in ("hybrid", "hybrid_filtered", "dense", "lexical", "raw_sql", "raw_driver"):
        figures[f"{key}_p95_ms"] = latency[key]["p95"]  # type: ignore[index]
    figures["hybrid_filtered_vs_floor_p95"] = round(
        latency["hybrid_filtered"]["p95"] / max(latency["raw_sql"]["p95"], 1e-9), 2)  # type: ignore[index]
    print(f"  recall: hnsw {figures['hnsw_recall@10']} (filtered {figures['hnsw_filtered_recall@10']}), "
          f"same best hit {figures['hnsw_top1_agreement']} (filtered {figures['hnsw_filtered_top1_agreement']}), "
          f"lexical {figures['lexical_recall@10']}")
    return figures


async def run_size(
    n_chunks: int, n_queries: int, recall_queries: int, keep: bool, with_levers: bool = False, reuse: bool = False,
    n_sources: int = 1, layouts: tuple[str, ...] = (), searches_of_one_source: bool = True,
) -> dict[str, object]:
    database = f"ragbot_bench_search_{n_chunks}" + (f"_{n_sources}_sources" if n_sources > 1 else "")
    if reuse:
        kb = await open_existing_kb(database)
        print(f"{n_chunks:,} chunks: reusing {database} (load figures are not re-measured)")
        corpus, sample = regenerate_sample(kb.embedder.dimension, n_chunks)
        load: dict[str, float] = {}
        keep = True
    else:
        kb = await open_fresh_kb(database)
    try:
        if not reuse:
            if layouts:
                await set_layout(kb, layouts[0])  # loaded in the first layout
            print(f"{n_chunks:,} chunks over {n_sources} source(s): loading through the product's store path")
            corpus, sample, load = await load_corpus(kb, n_chunks, n_sources)
            print(f"  {load}")
        figures: dict[str, object] = {"chunks": n_chunks, "sources": n_sources, **load,
                                      "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        # What a question is embedded with after a first sync: the product builds its ONNX question encoder then.
        await asyncio.to_thread(kb.embedder.prepare_query_encoder)
        encoder = kb.embedder.small_batch_encoder
        figures["query_encoder"] = (f"{type(encoder).__name__} {getattr(encoder, 'precision', '')}".strip()
                                    if encoder is not None else "sentence-transformers")
        print(f"  questions embedded by {figures['query_encoder']}")
        async with kb.retriever._reads.connect() as conn:
            figures["hnsw_ef_search"] = int(await kb.retriever._ef_search_for_corpus(conn))
        print(f"  HNSW search list (hnsw.ef_search): {figures['hnsw_ef_search']}")
        queries = corpus.queries(n_queries, [text for text, _ in sample])
        planted = {q: corpus.question_vector(sample[i][1]).tolist()
                   for q, i in zip(queries, corpus.query_sources, strict=False)}
        embedder = PlantedQueryEmbedder(kb.embedder, planted, real_questions())
        kb.retriever.embedder = embedder
        figures["question_tokens"] = {  # what the model embeds, beside the synthetic questions (PlantedQueryEmbedder)
            "embedded": summary(kb.embedder.count_tokens_many(embedder.embedded_texts(queries))),
            "synthetic": summary(kb.embedder.count_tokens_many(queries)),
        }
        print(f"  question tokens: {figures['question_tokens']}")
        vectors = [await kb.retriever.query_vector(q) for q in queries]  # also fills the query cache
        one_source = source_names(n_sources)[n_sources // 2] if n_sources > 1 and searches_of_one_source else None
        if not layouts:
            figures.update(await measure(kb, queries, vectors, recall_queries, with_levers, one_source))
            return figures
        for layout in layouts:
            migrate_s = await set_layout(kb, layout)
            print(f"  layout {layout}" + (f" (moved by the migration in {migrate_s:.1f} s)" if migrate_s else ""))
            figures[layout] = {"migrate_s": round(migrate_s, 1),
                               **await measure(kb, queries, vectors, recall_queries, with_levers, one_source)}
        return figures
    finally:
        await kb.close()
        if not keep:
            drop_database(database)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", default="10k", help="comma-separated sizes, e.g. 10k,100k,1M")
    parser.add_argument("--queries", type=int, default=200, help="timed queries per configuration")
    parser.add_argument("--recall-queries", type=int, default=50)
    parser.add_argument("--levers", action="store_true",
                        help="also measure HNSW ef_search, a halfvec index and the lexical candidate rule")
    parser.add_argument("--keep", action="store_true", help="keep the databases (ragbot_bench_search_<n>)")
    parser.add_argument("--reuse", action="store_true",
                        help="search the databases a --keep run left (skips loading; for trying search changes)")
    parser.add_argument("--name", default="search", help="results file name (bench/results/<name>.json)")
    parser.add_argument("--sources", type=int, default=1,
                        help="spread the documents over this many sources and also time searches of one of them")
    parser.add_argument("--layout", default="",
                        help="comma-separated layouts of chunks to measure on one load: single (migration 0018), "
                             "partitioned (0019); default: the schema's own (partitioned)")
    parser.add_argument("--no-one-source", action="store_true",
                        help="with --sources: do not also time (and measure the recall of) searches of one source")
    args = parser.parse_args()
    results: dict[str, object] = {}
    versions: dict[str, str] = {}
    for size in [parse_size(s) for s in args.chunks.split(",")]:
        layouts = tuple(x for x in args.layout.split(",") if x)
        assert set(layouts) <= {"single", "partitioned"}, "--layout takes single and/or partitioned"
        results[str(size)] = await run_size(size, args.queries, args.recall_queries, args.keep, args.levers,
                                            args.reuse, args.sources, layouts, not args.no_one_source)
    from db.engine import create_engine, database_url

    engine = create_engine(database_url())
    versions = await database_versions(engine)
    await engine.dispose()
    path = write_results(args.name, {"sizes": results}, machine_info(versions))
    print(f"wrote {path}")


if __name__ == "__main__":
    asyncio.run(main())
