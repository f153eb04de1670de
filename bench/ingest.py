"""Ingest throughput: the whole pipeline beside the embedding model alone, the store path beside a bare COPY, and
re-syncs as ratios to the first sync.

    PYTHONPATH=. .venv/bin/python bench/ingest.py                    # the quick set (make bench)
    PYTHONPATH=. .venv/bin/python bench/ingest.py --documents 400 --store-chunks 50000

1. End to end: a folder of generated Markdown documents (headings, paragraphs and lists of Zipf-distributed words,
   see bench/common.py) synced into an empty index by `KnowledgeBase.sync` (list, read, parse, chunk, embed,
   store), in chunks/s; beside it, in the same run, `model.encode` alone on exactly the texts that were embedded
   (the same batch size, normalised, on the same device). Their ratio is how much the pipeline costs on top of the
   embedding model. The model is loaded before either clock starts (`model_load_s` reports the load). On a shared
   machine, `--repeats 3` alternates syncs and floors (S F S F S F) and reports the median ratio, each sync beside
   the floors on either side of it, with every ratio in `ingest_vs_encode_ratios`. `ingest_vs_encode_cpu_ratio`
   compares CPU seconds of this process instead (floor over syncs; Postgres' own CPU not included): far less
   sensitive to other processes' load than wall time.
2. The store path alone: `store.write_documents` with precomputed embeddings, batched and written the way the
   indexer's writers do when the model is ahead of Postgres (as a GPU is): batches of 16 documents joined into an
   equal share for each of the STORE_WRITERS writers (at most 2,000 chunks a transaction), written side by side
   (`--writers 1`: one writer, as before 2026-11-25; `--unmerged`: each batch of 16 on its own, as a CPU-bound sync
   writes them). The later sync writes 4,000 chunks by default, a full write for each of the two writers, as they
   run while a GPU keeps them fed (2,000 chunks would be two writes of 1,000, each paying its fixed costs twice as
   often; before 2026-11-25 one writer wrote 2,000 in one transaction). Generating the rows
   is outside every clock. First as a first sync runs it (`store_first_sync_chunks_per_s`): into the empty
   index without the HNSW graph, which `store.bulk_load` builds at the end (the build is in the time); then into
   that index with its graph maintained row by row, as every later sync writes (`store_chunks_per_s`); beside them
   a bare `COPY` of the same rows into a table with no index, no trigger and no derived columns: the floor of
   getting those bytes into Postgres.
   `--store-repeats N` runs it N times, each into a fresh database, and reports each figure's median (`make bench`
   runs 3: one run moves by about ±6% on this machine).
3. Re-syncs: nothing changed, and 1% of the documents edited, as time ratios to the first sync.
Results go to bench/results/ingest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    SyntheticCorpus,
    database_versions,
    drop_database,
    machine_info,
    open_fresh_kb,
    timer,
    use_throwaway_home,
    write_results,
)

use_throwaway_home()

import numpy as np  # noqa: E402
from sqlalchemy import text  # noqa: E402

from knowledge.ingest.chunking import compose_search_text  # noqa: E402
from knowledge.ingest.pipeline import WriterPool, share_out  # noqa: E402
from knowledge.settings import KnowledgeSettings  # noqa: E402
from knowledge.sources.folder import FolderSource  # noqa: E402
from knowledge.storage import documents as store  # noqa: E402

DEFAULTS = KnowledgeSettings(_env_file=None)
STORE_WRITERS = DEFAULTS.store_writers  # the settings' defaults
BATCH_DOCUMENTS = DEFAULTS.sync_batch_documents
WRITE_BATCH_CHUNKS = DEFAULTS.write_batch_chunks


def write_markdown_corpus(root: Path, documents: int, seed: int = 5) -> None:
    """Markdown files of 300–1,500 words in sections with paragraphs and lists: what the chunker sees in a wiki."""
    corpus = SyntheticCorpus(8, seed=seed)
    rng = np.random.default_rng(seed)
    for number in range(documents):
        words = corpus.words[rng.choice(len(corpus.words), size=int(rng.integers(300, 1500)), p=corpus.p)]
        lines = [f"# Synthetic handbook page {number}", ""]
        at = 0
        section = 0
        while at < len(words):
            if at == 0 or rng.random() < 0.25:
                section += 1
                lines += [f"## Section {section}: {' '.join(words[at:at + 3])}", ""]
            length = int(rng.integers(30, 120))
            if rng.random() < 0.2:
                lines += [f"- {' '.join(words[i:i + 8])}" for i in range(at, min(at + length, len(words)), 8)]
            else:
                lines.append(" ".join(words[at : at + length]) + ".")
            lines.append("")
            at += length
        (root / f"page-{number:05d}.md").write_text("\n".join(lines), encoding="utf-8")


async def end_to_end(documents: int, repeats: int = 1) -> dict[str, float]:
    """First syncs into an empty index alternating with the `model.encode` floor: S F S F ... (`repeats` of each).
    Each sync is compared with the floors next to it in time (the mean of the one before and the one after), so a
    load that drifts while the bench runs on a shared machine moves both sides; the ratio reported is the median."""
    kb = await open_fresh_kb("ragbot_bench_ingest")
    root = Path(tempfile.mkdtemp(prefix="ragbot-bench-corpus-")) / "wiki"
    root.mkdir()
    try:
        write_markdown_corpus(root, documents)
        # Load sentence-transformers before the clock starts, as for the floor below: its import and load (several
        # seconds) are a one-off per process, not ingest throughput. (A warm-up of a few short texts alone would
        # go through the NumPy encoder and leave the load inside the first sync.)
        started = timer()
        kb.embedder.model  # noqa: B018 (loads it)
        kb.embedder.embed(["warm up the model"] * 32)
        model_load_s = timer() - started
        model = kb.embedder.model
        sync_rates: list[float] = []
        floor_rates: list[float] = []
        sync_cpu_s = floor_cpu_s = 0.0  # this process's CPU time (every thread; Postgres' own is not included)
        texts: list[str] = []
        for repeat in range(repeats):
            if repeat:
                await kb.close()
                kb = await open_fresh_kb("ragbot_bench_ingest")  # empty again, embedding cache included
            started, cpu = timer(), time.process_time()
            first = await kb.sync(FolderSource(root, "wiki"))
            first_s = timer() - started
            sync_cpu_s += time.process_time() - cpu
            chunks = first.chunks_written
            sync_rates.append(chunks / first_s)
            if not texts:
                async with kb.engine.connect() as conn:
                    rows = (await conn.execute(text(
                        "SELECT d.title, c.heading, c.text FROM chunks c JOIN documents d ON d.id = c.document_id"
                    ))).all()
                texts = [compose_search_text(r.title, r.heading, r.text) for r in rows]
            started, cpu = timer(), time.process_time()
            model.encode(texts, batch_size=kb.embedder.batch_size, normalize_embeddings=True, show_progress_bar=False)
            floor_rates.append(len(texts) / (timer() - started))
            floor_cpu_s += time.process_time() - cpu
        ratios = [
            rate / statistics.mean(floor_rates[max(0, i - 1) : i + 1]) for i, rate in enumerate(sync_rates)
        ]

        started = timer()
        unchanged = await kb.sync(FolderSource(root, "wiki"))
        unchanged_s = timer() - started
        assert unchanged.unchanged == documents, unchanged.to_dict()

        count = max(1, documents // 100)  # 1% of the documents, at least one
        edited = sorted(root.iterdir())[:: documents // count][:count]
        for path in edited:
            path.write_text(path.read_text() + "\n\nAn edited paragraph with new words: zebrafinch quokkaline.\n")
        started = timer()
        changed = await kb.sync(FolderSource(root, "wiki"))
        changed_s = timer() - started
        assert len(changed.updated) == len(edited), changed.to_dict()
        figures = {
            "documents": documents, "chunks": chunks, "first_sync_s": round(first_s, 2),
            "ingest_chunks_per_s": round(statistics.median(sync_rates), 2),
            "encode_chunks_per_s": round(statistics.median(floor_rates), 2),
            "ingest_vs_encode_ratio": round(statistics.median(ratios), 3),
            "ingest_vs_encode_ratios": [round(r, 3) for r in ratios],
            # CPU seconds of the floor over those of the syncs (this process only): what the pipeline costs beyond the
            # model in CPU, much less sensitive than wall time to other processes' load on a shared machine.
            "ingest_vs_encode_cpu_ratio": round(floor_cpu_s / sync_cpu_s, 3),
            "unchanged_resync_s": round(unchanged_s, 3),
            "unchanged_resync_speedup": round(first_s / unchanged_s, 1),
            "one_percent_changed_documents": len(edited),
            "one_percent_changed_resync_s": round(changed_s, 2),
            "one_percent_changed_resync_speedup": round(first_s / changed_s, 1),
            "one_percent_changed_chunks_embedded": changed.chunks_embedded,
            "embedding_device": str(getattr(model, "device", "cpu")),
            "model_load_s": round(model_load_s, 2),
        }
        return figures
    finally:
        await kb.close()
        shutil.rmtree(root.parent, ignore_errors=True)
        drop_database("ragbot_bench_ingest")


def synthetic_writes(
    corpus: SyntheticCorpus, n_chunks: int, prefix: str, *, merged: bool = True, writers: int = STORE_WRITERS
) -> list[list[store.DocumentWrite]]:
    """The corpus as the indexer's writers hand it to the store: batches of BATCH_DOCUMENTS documents, shared out
    among the free writers (`indexing.share_out`) when the embedder is ahead of Postgres, as a GPU is (the
    embeddings here are precomputed, so every batch is waiting). `merged=False`: each batch of BATCH_DOCUMENTS on
    its own, as a sync whose model is slower than the writers (a CPU) writes them."""
    writes = []
    for document in corpus.documents(n_chunks):
        rows = [store.ChunkRow(i, body, "", len(body.split()), f"{prefix}{document.number}-{i}",
                               store.as_vector(vector), body)
                for i, (body, vector) in enumerate(zip(document.chunks, document.vectors, strict=False))]
        writes.append(store.DocumentWrite(f"{prefix}{document.number}", f"Document {document.number}", None, None,
                                          None, None, f"{prefix}h{document.number}", document.access, rows))
    batches = [writes[i : i + BATCH_DOCUMENTS] for i in range(0, len(writes), BATCH_DOCUMENTS)]
    if not merged:
        return batches
    return share_out(batches, writers, external_id=lambda w: w.external_id, chunks=lambda w: len(w.chunks),
                     max_chunks=WRITE_BATCH_CHUNKS)


async def store_path(
    n_chunks: int, base_chunks: int, merged: bool = True, writers: int = STORE_WRITERS
) -> dict[str, float]:
    kb = await open_fresh_kb("ragbot_bench_store")
    try:
        corpus = SyntheticCorpus(kb.embedder.dimension, seed=3)
        async with kb.engine.begin() as conn:
            source_id = await store.ensure_source(conn, "bench", "bench", None)

        async def write(batches: list[list[store.DocumentWrite]]) -> float:
            """Written as the indexer writes them: up to `writers` transactions at once (indexing.WriterPool)."""
            pool = WriterPool(writers)
            started = timer()
            for batch in batches:
                await pool.start(store.write_documents(kb.engine, source_id, batch, kb.settings.text_search_config),
                                 documents={d.external_id for d in batch})
            await pool.finish_all()
            return timer() - started

        # A first sync's store path: base_chunks chunks into the empty index, written without the HNSW graph, which
        # is built at the end (store.bulk_load, as Indexer.sync does), the build included in the time.
        await kb.ensure_embedding_space()
        # Generated before the clock starts.
        base = synthetic_writes(corpus, base_chunks, "base-", merged=merged, writers=writers)
        started = timer()
        async with store.bulk_load(kb.engine) as bulk:
            assert bulk, "the index was not empty: no bulk load"
            written_s = await write(base)
            graph_started = timer()
        bulk_s = timer() - started
        build_s = timer() - graph_started
        # Every later sync: writes into that index, its graph maintained row by row.
        measured = synthetic_writes(corpus, n_chunks, "new-", merged=merged, writers=writers)
        rows = [(c, d) for batch in measured for d in batch for c in d.chunks]
        with_hnsw_s = await write(measured)

        # The floor: the same rows COPYed into a table with no index, trigger or derived column.
        async with kb.engine.begin() as conn:
            await conn.execute(text(
                "CREATE TABLE copy_floor (document_id bigint, ordinal integer, text text, heading text, "
                "token_count integer, content_hash text, embedding vector, access text[], source_id integer)"
            ))
        async with kb.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            started = timer()
            async with raw.transaction():
                async with raw.cursor().copy(
                    "COPY copy_floor (document_id, ordinal, text, heading, token_count, content_hash, embedding, "
                    "access, source_id) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(["bigint", "integer", "text", "text", "integer", "text", "vector", "text[]",
                                    "integer"])
                    for number, (chunk, document) in enumerate(rows):
                        await copy.write_row((number, chunk.ordinal, chunk.text, chunk.heading, chunk.token_count,
                                              chunk.content_hash, chunk.embedding, list(document.access), source_id))
            copy_s = timer() - started
        figures = {
            "store_chunks": len(rows), "store_base_chunks": base_chunks, "store_writers": writers,
            "store_transactions": len(measured),
            "store_chunks_per_s": round(len(rows) / with_hnsw_s, 1),
            "store_first_sync_chunks_per_s": round(base_chunks / bulk_s, 1),
            "store_without_hnsw_chunks_per_s": round(base_chunks / written_s, 1),
            "store_first_sync_graph_build_s": round(build_s, 2),
            "copy_chunks_per_s": round(len(rows) / copy_s, 1),
            "store_vs_copy_ratio": round((len(rows) / with_hnsw_s) / (len(rows) / copy_s), 3),
        }
        # BM25 statistics maintenance: re-weighting every chunk after a drift of avgdl, in committed batches.
        async with kb.engine.begin() as conn:
            total = (await conn.execute(text("SELECT count(*) FROM chunks"))).scalar_one()
        started = timer()
        reweighted = await store.reweight_bm25(kb.engine, force=True)
        reweight_s = timer() - started
        figures.update({"reweight_chunks": reweighted, "reweight_s": round(reweight_s, 2),
                        "reweight_chunks_per_s": round(reweighted / max(reweight_s, 1e-9), 1),
                        "reweight_batch_max_s": round(reweight_s / max(1, -(-total // store.REWEIGHT_BATCH)), 2)})
        return figures
    finally:
        await kb.close()
        drop_database("ragbot_bench_store")


def median_of_runs(runs: list[dict[str, float]]) -> dict[str, object]:
    """Each figure's median over the store-path runs (their spread on this machine is about ±6%), with every run's
    chunks/s figures kept beside it."""
    merged: dict[str, object] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    if len(runs) > 1:
        for key in ("store_chunks_per_s", "store_first_sync_chunks_per_s"):
            merged[f"{key}_runs"] = [run[key] for run in runs]
    merged["store_repeats"] = len(runs)
    return merged


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=40, help="generated Markdown documents (end to end)")
    parser.add_argument("--store-chunks", type=int, default=STORE_WRITERS * WRITE_BATCH_CHUNKS,
                        help="chunks written by the store path (default: a full write for each writer, 4,000)")
    parser.add_argument("--base-chunks", type=int, default=5000, help="chunks already in the index before that")
    parser.add_argument("--repeats", type=int, default=1,
                        help="first syncs, each beside the encode floors before and after it (median ratio)")
    parser.add_argument("--name", default="ingest")
    parser.add_argument("--end-to-end-only", action="store_true", help="skip the store path and re-weighting")
    parser.add_argument("--store-only", action="store_true", help="skip the end-to-end syncs")
    parser.add_argument("--writers", type=int, default=STORE_WRITERS,
                        help="store path: transactions writing at once (the indexer's STORE_WRITERS)")
    parser.add_argument("--unmerged", action="store_true",
                        help="store path: each batch of 16 documents in its own transaction (a CPU-bound sync)")
    parser.add_argument("--store-repeats", type=int, default=1,
                        help="store path runs, each into a fresh database; the median of each figure is reported")
    args = parser.parse_args()
    figures: dict[str, object] = {}
    if not args.store_only:
        print("1. end to end")
        figures.update(await end_to_end(args.documents, args.repeats))
        print(f"   {figures}")
    if not args.end_to_end_only:
        print("2. store path")
        runs = [await store_path(args.store_chunks, args.base_chunks, merged=not args.unmerged, writers=args.writers)
                for _ in range(max(1, args.store_repeats))]
        stored = median_of_runs(runs)
        stored["store_batches"] = "16 documents each" if args.unmerged else "joined as the writer joins waiting ones"
        print(f"   {stored}")
        figures.update(stored)
    from db.engine import create_engine, database_url

    engine = create_engine(database_url())
    versions = await database_versions(engine)
    await engine.dispose()
    print(f"wrote {write_results(args.name, figures, machine_info(versions))}")


if __name__ == "__main__":
    asyncio.run(main())
