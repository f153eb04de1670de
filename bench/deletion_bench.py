"""What a large deletion does to dense search, and what the safeguards cost. Prints numbers; asserts nothing.

    PYTHONPATH=. .venv/bin/python bench/deletion_bench.py [--chunks 30000]

The handbook is indexed, then N synthetic chunks whose vectors sit close to the handbook's eval questions (the
worst case: the HNSW scan meets them first), then that source is deleted. Dense top-10 over the handbook questions
is measured (a) with the synthetic chunks present but restricted to another group, (b) right after the delete,
before any vacuum, using the bare index scan (what ragbot did before) and the retriever with its exact fallback,
(c) after `VACUUM (ANALYZE) chunks`, which syncs and `remove-source` now run after deleting >= 1000 chunks.
With --identical the synthetic chunks repeat 8 vectors exactly (what a pasted paragraph did before identical
chunks were merged), which is what degrades the HNSW graph.
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

from sqlalchemy import text  # noqa: E402

from knowledge.eval.evaluation import load_jsonl_questions  # noqa: E402
from knowledge.kb import KnowledgeBase  # noqa: E402
from knowledge.search.retrieval import SearchFilters  # noqa: E402
from knowledge.sources.folder import FolderSource  # noqa: E402
from knowledge.storage import documents as store  # noqa: E402
from knowledge.storage.search import dense_sql  # noqa: E402

HANDBOOK = Path(__file__).resolve().parent.parent / "examples" / "handbook"


async def bare_index_scan(kb: KnowledgeBase, query: str) -> int:
    """Rows the dense SQL returns on its own (no exact fallback)."""
    sql = dense_sql(kb.embedder.dimension)
    params = {"embedding": await kb.retriever.query_vector(query), "principals": ["everyone"], "sources": None,
              "updated_after": None, "n": 100}
    async with kb.engine.connect() as conn:
        return len((await conn.execute(text(sql), params)).all())


async def measure(kb: KnowledgeBase, label: str, questions: list[str]) -> None:
    counts, samples, bare = [], [], []
    for q in questions:
        started = time.perf_counter()
        results = await kb.search(q, SearchFilters(), k=10, mode="dense")
        samples.append((time.perf_counter() - started) * 1000)
        counts.append(len(results.hits))
        bare.append(await bare_index_scan(kb, q))
    short = sum(1 for c in bare if c < 10)
    print(f"{label:<44} bare index scan: {short:>2}/{len(questions)} questions get < 10 rows "
          f"(mean {statistics.mean(bare):5.1f}); ragbot: min {min(counts)} hits, "
          f"p50 {statistics.median(samples):6.1f} ms, max {max(samples):6.1f} ms")


async def main(n_chunks: int, identical: bool) -> None:
    kb = await KnowledgeBase.open()
    try:
        await kb.sync(FolderSource(HANDBOOK, "handbook"))
        questions = [q.question for q in load_jsonl_questions(HANDBOOK / "eval.jsonl")][:20]
        await measure(kb, "handbook only", questions)
        anchors = await kb.embedder.embed_async(questions)
        rng = random.Random(7)
        started = time.perf_counter()
        async with kb.engine.begin() as conn:
            source_id = await store.ensure_source(conn, "bulk", "bench", None)
        per_doc = 1000
        for doc in range(n_chunks // per_doc):
            rows = []
            for i in range(per_doc):
                anchor = anchors[(doc * per_doc + i) % (8 if identical else len(anchors))]
                vector = list(anchor) if identical else [v + rng.gauss(0, 0.02) for v in anchor]
                norm = sum(v * v for v in vector) ** 0.5
                body = f"bulk chunk {doc}-{i}"
                rows.append(store.ChunkRow(i, body, "", 5, f"bulk-{doc}-{i}",
                                           store.as_vector([v / norm for v in vector]), body))
            await store.write_documents(kb.engine, source_id, [store.DocumentWrite(
                f"bulk-{doc}", "Bulk", None, None, None, None, str(doc), ["group:other"], rows)], "english")
        print(f"wrote {n_chunks} synthetic chunks in {time.perf_counter() - started:.0f} s")
        await measure(kb, f"+{n_chunks} restricted chunks near the questions", questions)
        async with kb.engine.begin() as conn:
            await store.delete_source(conn, "bulk")  # the delete alone, no vacuum yet
        await measure(kb, "after deleting them, before VACUUM", questions)
        started = time.perf_counter()
        await store.vacuum_chunks(kb.engine)
        print(f"VACUUM (ANALYZE) chunks took {time.perf_counter() - started:.1f} s")
        await measure(kb, "after VACUUM", questions)
    finally:
        await kb.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=30_000)
    parser.add_argument("--identical", action="store_true",
                        help="8 distinct vectors repeated (a document of one paragraph pasted thousands of times)")
    args = parser.parse_args()
    asyncio.run(main(args.chunks, args.identical))
