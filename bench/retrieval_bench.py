"""Speed figures for ingest and search. Prints numbers; asserts nothing (targets are read, not enforced).

    .venv/bin/python bench/retrieval_bench.py [--chunks 20000]

1. Ingest of the example handbook into an empty database (embedding-bound), then a no-change re-sync.
2. Search latency per mode over the handbook's eval questions (query embedding included).
3. Search latency at scale: N synthetic chunks (Zipf-distributed vocabulary, random unit vectors) written through
   the same insert path and BM25 triggers, then hybrid search with ACL filtering.
Uses DATABASE_URL if set, else a throwaway embedded Postgres.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

if not os.environ.get("DATABASE_URL"):
    os.environ["RAGBOT_HOME"] = tempfile.mkdtemp(prefix="ragbot-bench-")
os.environ["ANTHROPIC_API_KEY"] = ""

from knowledge.eval.evaluation import load_jsonl_questions  # noqa: E402
from knowledge.kb import KnowledgeBase  # noqa: E402
from knowledge.search.retrieval import MODES, SearchFilters  # noqa: E402
from knowledge.sources.folder import FolderSource  # noqa: E402
from knowledge.storage import documents as store  # noqa: E402

HANDBOOK = Path(__file__).resolve().parent.parent / "examples" / "handbook"


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"p50 {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms   (n={len(ordered)})"


async def timed_searches(kb: KnowledgeBase, queries: list[str], mode: str, filters: SearchFilters) -> list[float]:
    samples = []
    for query in queries:
        started = time.perf_counter()
        await kb.search(query, filters, k=10, mode=mode)  # type: ignore[arg-type]
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def synthetic_corpus(kb: KnowledgeBase, n_chunks: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    vocabulary = [f"term{i}" for i in range(30_000)]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    dimension = kb.embedder.dimension
    async with kb.engine.begin() as conn:
        source_id = await store.ensure_source(conn, "synthetic", "bench", None)
    started = time.perf_counter()
    per_doc = 5
    for doc in range(n_chunks // per_doc):
        rows = []
        for ordinal in range(per_doc):
            words = rng.choices(vocabulary, weights, k=120)
            vector = [rng.gauss(0, 1) for _ in range(dimension)]
            norm = sum(v * v for v in vector) ** 0.5
            body = " ".join(words)
            rows.append(store.ChunkRow(ordinal, body, "", 150, f"{doc}-{ordinal}",
                                       store.as_vector([v / norm for v in vector]), body))
        access = ["everyone"] if doc % 10 == 0 else [f"group:team{doc % 10}"]  # 90% restricted
        await store.write_documents(kb.engine, source_id, [store.DocumentWrite(
            f"doc-{doc}", f"Synthetic {doc}", None, None, None, None, str(doc), access, rows)], "english")
    elapsed = time.perf_counter() - started
    print(f"  wrote {n_chunks} chunks in {elapsed:.1f}s ({n_chunks / elapsed:.0f} chunks/s, embedding excluded)")
    started = time.perf_counter()
    async with kb.engine.begin() as conn:
        await store.ensure_vector_index(conn, dimension)
    print(f"  HNSW index ready in {time.perf_counter() - started:.1f}s")
    return [" ".join(rng.choices(vocabulary[:5000], k=8)) for _ in range(100)]


async def main(n_chunks: int) -> None:
    kb = await KnowledgeBase.open()
    print(f"database: {(await kb.status()).database}")
    print("1. ingest of examples/handbook")
    started = time.perf_counter()
    report = await kb.sync(FolderSource(HANDBOOK, "handbook"))
    elapsed = time.perf_counter() - started
    docs = len(report.added)
    print(f"  cold: {docs} documents, {report.chunks_written} chunks in {elapsed:.1f}s "
          f"({docs / elapsed:.1f} documents/s, {report.chunks_embedded / elapsed:.1f} chunks embedded/s)")
    started = time.perf_counter()
    report = await kb.sync(FolderSource(HANDBOOK, "handbook"))
    print(f"  re-sync with no changes: {report.unchanged} unchanged in {time.perf_counter() - started:.2f}s")

    print("2. search latency on the handbook (query embedding included)")
    questions = [q.question for q in load_jsonl_questions(HANDBOOK / "eval.jsonl")]
    await timed_searches(kb, questions, "hybrid", SearchFilters())  # warm-up: caches query vectors
    for mode in MODES:
        print(f"  {mode:8s} {percentiles(await timed_searches(kb, questions, mode, SearchFilters()))}")

    print(f"3. search latency at {n_chunks} synthetic chunks (90% restricted to other groups)")
    queries = await synthetic_corpus(kb, n_chunks)
    await timed_searches(kb, queries, "hybrid", SearchFilters())
    for mode in MODES:
        print(f"  {mode:8s} {percentiles(await timed_searches(kb, queries, mode, SearchFilters()))}")
        print(f"  {mode:8s} as group:team3 "
              f"{percentiles(await timed_searches(kb, queries, mode, SearchFilters(('group:team3',))))}")
    await kb.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    asyncio.run(main(parser.parse_args().chunks))
