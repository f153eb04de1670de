"""A/B of search levers on a database a `bench/search.py --keep` run left (issue 43: what makes the 1M tail drop).

    PYTHONPATH=. DATABASE_URL=... .venv/bin/python bench/search_ab.py --chunks 1M --sources 10 --queries 100 \
        --variant base --variant "nojit:pg.jit=on" --variant "postings:tuning.candidate_postings=2000"

Each variant is the product's `KnowledgeBase.search` on a KnowledgeBase of its own (its own pool), changed by
`pg.<setting>=<value>` (SET on every connection of its search pool, after the product's own settings) and/or
`tuning.<SearchTuning field>=<value>`. The variants take turns question by question (the order rotating), so all see
the same moments of this shared machine's load. Timed: hybrid as a 10% reader with the question embedded (the issue's
target), lexical as a 10% reader, dense as a 10% reader (cached vector). Beside each latency: how many of its top-10
lists equal the first variant's, and recall@10 on the first --recall-queries questions against exact search (the
exact answers are computed once and kept in a file beside the results, since at 1M each costs tens of seconds).
Results go to bench/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    PlantedQueryEmbedder,
    machine_info,
    open_existing_kb,
    parse_size,
    real_questions,
    summary,
    timer,
    write_results,
)
from search import (  # noqa: E402  (also sets the benchmark's environment)
    EVERY_DOCUMENT,
    TEN_PERCENT,
    exact_answers,
    regenerate_sample,
)

from knowledge.search.retrieval import SearchFilters, SearchTuning  # noqa: E402

TUNING_FIELDS = {f.name: f.type for f in fields(SearchTuning)}


def parse_variant(spec: str) -> tuple[str, dict[str, str], dict[str, object]]:
    """"name:pg.x=1,tuning.y=2" -> (name, Postgres settings, SearchTuning overrides)."""
    name, _, rest = spec.partition(":")
    pg: dict[str, str] = {}
    tuning: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        kind, _, field = key.partition(".")
        if kind == "pg":
            pg[field] = value
        elif kind == "tuning" and field in TUNING_FIELDS:
            tuning[field] = float(value) if "." in value else int(value)
        else:
            raise SystemExit(f"unknown lever {key!r}: use pg.<setting> or tuning.<{'|'.join(TUNING_FIELDS)}>")
    return name, pg, tuning


async def open_variant(database: str, pg: dict[str, str], tuning: dict[str, object], embedder: Any) -> Any:
    from sqlalchemy import event

    kb = await open_existing_kb(database)
    if pg:
        @event.listens_for(kb.search_engine.sync_engine, "connect")
        def _settings(dbapi_connection, connection_record) -> None:  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            for key, value in pg.items():
                cursor.execute(f"SET {key} = '{value}'")
            cursor.close()
            dbapi_connection.commit()

    kb.retriever.tuning = replace(SearchTuning(), **tuning)  # type: ignore[arg-type]
    kb.retriever.embedder = embedder
    return kb


async def truths(kb: Any, queries: list[str], vectors: list[Any]) -> dict[str, Any]:
    """Exact answers for the recall questions (search.exact_answers: kept in a file, tens of seconds each at 1M)."""
    known = {}
    for query, vector in zip(queries, vectors, strict=True):
        known[query] = await exact_answers(kb, query, vector, None)
        print(f"  exact answers: {len(known)}", flush=True)
    return known


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", default="1M")
    parser.add_argument("--sources", type=int, default=1)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--recall-queries", type=int, default=10)
    parser.add_argument("--modes", default="hybrid_filtered,lexical_filtered,dense_filtered")
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--name", default="search-ab")
    parser.add_argument("--truths-only", action="store_true",
                        help="only compute the exact answers of the recall questions (untimed; before a locked run)")
    args = parser.parse_args()
    n_chunks = parse_size(args.chunks)
    database = f"ragbot_bench_search_{n_chunks}" + (f"_{args.sources}_sources" if args.sources > 1 else "")
    variants = [parse_variant(v) for v in (args.variant or ["base"])]

    first = await open_existing_kb(database)
    await asyncio.to_thread(first.embedder.prepare_query_encoder)
    started = timer()
    corpus, sample = regenerate_sample(first.embedder.dimension, n_chunks)
    print(f"corpus regenerated in {timer() - started:.0f} s", flush=True)
    queries = corpus.queries(args.queries, [text for text, _ in sample])
    planted = {q: corpus.question_vector(sample[i][1]).tolist()
               for q, i in zip(queries, corpus.query_sources, strict=False)}
    embedder = PlantedQueryEmbedder(first.embedder, planted, real_questions())
    first.retriever.embedder = embedder
    vectors = [await first.retriever.query_vector(q) for q in queries]
    exact = await truths(first, queries[:args.recall_queries], vectors[:args.recall_queries])
    await first.close()
    if args.truths_only:
        return

    kbs = {name: await open_variant(database, pg, tuning, embedder) for name, pg, tuning in variants}
    modes = {"hybrid_filtered": ("hybrid", TEN_PERCENT, True), "lexical_filtered": ("lexical", TEN_PERCENT, False),
             "dense_filtered": ("dense", TEN_PERCENT, False), "hybrid": ("hybrid", EVERY_DOCUMENT, True),
             "lexical": ("lexical", EVERY_DOCUMENT, False), "dense": ("dense", EVERY_DOCUMENT, False)}
    for kb in kbs.values():  # warm each pool, the model and the caches
        for q in queries[:20]:
            await kb.search(q, SearchFilters(TEN_PERCENT), k=10, mode="hybrid")
    out: dict[str, Any] = {"variants": {name: {"pg": pg, "tuning": tuning} for name, pg, tuning in variants}}
    names = list(kbs)
    for key in args.modes.split(","):
        mode, principals, embed = modes[key]
        samples: dict[str, list[float]] = {n: [] for n in names}
        hits: dict[str, list[list[int]]] = {n: [] for n in names}
        stages: dict[str, dict[str, list[float]]] = {n: {} for n in names}
        for i, query in enumerate(queries):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                kb = kbs[name]
                if embed:
                    kb.retriever._query_vectors.pop(query, None)
                else:
                    kb.retriever._query_vectors[query] = vectors[i]
                t0 = timer()
                found = await kb.search(query, SearchFilters(principals), k=10, mode=mode)
                samples[name].append((timer() - t0) * 1000)
                hits[name].append([h.chunk_id for h in found.hits])
                for stage, ms in found.timings.items():
                    stages[name].setdefault(stage, []).append(ms)
        for name in names:
            same = sum(a == b for a, b in zip(hits[name], hits[names[0]], strict=True))
            figures = {**summary(samples[name]), "same_top10_as_first": same,
                       "stages_p95": {s: summary(v)["p95"] for s, v in stages[name].items()}}
            out.setdefault(key, {})[name] = figures
            print(f"  {key:18s} {name:14s} {figures}", flush=True)
    # recall on the first questions against the exact answers
    for name in names:
        kb = kbs[name]
        dense_all = dense_ten = lexical = 0.0
        for query, vector in zip(queries[:args.recall_queries], vectors, strict=False):
            kb.retriever._query_vectors[query] = vector
            truth = exact[query]
            for principals, bucket in ((EVERY_DOCUMENT, "all"), (TEN_PERCENT, "ten")):
                got = {h.chunk_id for h in (await kb.search(query, SearchFilters(principals), k=10, mode="dense",
                                                            max_per_document=10)).hits}
                share = len(got & set(truth[bucket])) / max(len(truth[bucket]), 1)
                if bucket == "all":
                    dense_all += share
                else:
                    dense_ten += share
            got = {h.chunk_id for h in (await kb.search(query, SearchFilters(EVERY_DOCUMENT), k=10, mode="lexical",
                                                        max_per_document=10)).hits}
            lexical += len(got & set(truth["lexical"])) / max(len(truth["lexical"]), 1)
        n = max(args.recall_queries, 1)
        out.setdefault("recall", {})[name] = {"hnsw_recall@10": round(dense_all / n, 4),
                                              "hnsw_filtered_recall@10": round(dense_ten / n, 4),
                                              "lexical_recall@10": round(lexical / n, 4)}
        print(f"  recall {name:14s} {out['recall'][name]}", flush=True)
    for kb in kbs.values():
        await kb.close()
    out["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = write_results(args.name, {"runs": {out["measured_at"]: out}}, machine_info())
    print(f"wrote {path}")


if __name__ == "__main__":
    asyncio.run(main())
