"""Past one machine, measured: a real primary, a streaming hot standby (pg_basebackup -R) and PgBouncer in transaction
mode, on this machine (tests/pg_cluster.py starts them from the embedded server's binaries and Debian's pgbouncer).

    .venv/bin/python bench/scale.py [--rounds 2]

The example handbook is synced into the primary; then the eval set's questions (examples/handbook/eval.jsonl, 76)
are searched (hybrid, k=10, as everyone) `--rounds` times through each path, interleaved: the primary directly, the standby
(DATABASE_REPLICA_URLS) and PgBouncer (DATABASE_POOLER=transaction); every path must return the same hits. Also how
long a synced document takes to reach the standby (from the end of the sync to the row being visible there).
Results go to bench/results/scale.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench.common import machine_info, summary, use_throwaway_home, write_results  # noqa: E402

HANDBOOK = ROOT / "examples" / "handbook"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--visibility-trials", type=int, default=5)
    args = parser.parse_args()
    use_throwaway_home()
    import os

    os.environ.setdefault("QUERY_ENCODER", "numpy")
    from pg_cluster import Bouncer, Cluster, _system_user, wait_for_replay

    from db.engine import create_engine
    from db.migrate import upgrade_to_head
    from db.settings import DatabaseSettings
    from knowledge import KnowledgeBase, SearchFilters
    from knowledge.settings import KnowledgeSettings
    from knowledge.sources.folder import FolderSource

    questions = [json.loads(line)["question"] for line in (HANDBOOK / "eval.jsonl").read_text().splitlines()]
    with Cluster() as cluster:
        primary = cluster.primary()
        primary.execute("CREATE DATABASE ragbot")
        engine = create_engine(primary.url_for("ragbot"))
        await upgrade_to_head(engine)
        await engine.dispose()

        def settings(**overrides: object) -> DatabaseSettings:
            return DatabaseSettings(_env_file=None, database_url=primary.url_for("ragbot"), **overrides)  # type: ignore[call-arg]

        direct = await KnowledgeBase.open(KnowledgeSettings(), settings())
        report = await direct.sync(FolderSource(HANDBOOK, "handbook"))
        standby = cluster.standby(primary)
        wait_for_replay(primary, standby, "ragbot")
        bouncer = Bouncer(f"host=127.0.0.1 port={primary.port}", cluster.root, _system_user(), pool_size=4)
        try:
            replicated = await KnowledgeBase.open(KnowledgeSettings(), settings(
                database_replica_urls=standby.url_for("ragbot"), replica_max_lag_seconds=30))
            assert replicated.replicas is not None
            await replicated.replicas.check_now()
            pooled = await KnowledgeBase.open(KnowledgeSettings(), DatabaseSettings(  # type: ignore[call-arg]
                _env_file=None, database_url=bouncer.url_for("ragbot"), database_pooler="transaction"))
            paths = {"primary": direct, "standby": replicated, "pgbouncer": pooled}
            for kb in paths.values():  # warm: question vectors cached, pages in the buffer cache, pools filled
                for question in questions:
                    await kb.search(question, SearchFilters(), k=10)
            figures: dict[str, object] = {"chunks": (await direct.status()).chunks, "documents": len(report.added),
                                          "questions": len(questions), "rounds": args.rounds}
            hits: dict[str, list[list[int]]] = {name: [] for name in paths}
            samples: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(args.rounds):
                for question in questions:  # the paths interleaved, so a busy moment of the machine hits all three
                    for name, kb in paths.items():
                        started = time.perf_counter()
                        results = await kb.search(question, SearchFilters(), k=10)
                        samples[name].append((time.perf_counter() - started) * 1000)
                        hits[name].append([h.chunk_id for h in results.hits])
            for name in paths:
                figures[f"hybrid_ms_{name}"] = summary(samples[name])
            figures["same_hits_on_every_path"] = hits["primary"] == hits["standby"] == hits["pgbouncer"]
            figures["standby_served_reads"] = replicated.replicas.replicas[0].reads > 0 and \
                replicated.replicas.primary_reads == 0
            delays = []
            for trial in range(args.visibility_trials):
                folder = Path(tempfile.mkdtemp(prefix="ragbot-bench-visible-"))
                (folder / f"note{trial}.md").write_text(f"# Note {trial}\n\nThe visitor code this week is {trial}77.")
                await direct.sync(FolderSource(folder, f"visible{trial}"))
                synced = time.perf_counter()
                while not standby.execute(f"SELECT 1 FROM sources WHERE name = 'visible{trial}'", "ragbot"):
                    await asyncio.sleep(0.002)
                delays.append((time.perf_counter() - synced) * 1000)
                shutil.rmtree(folder, ignore_errors=True)
            figures["standby_visible_after_sync_ms"] = summary(delays)
            for kb in paths.values():
                await kb.close()
        finally:
            bouncer.stop()
    for name in paths:
        stats = figures[f"hybrid_ms_{name}"]
        print(f"hybrid search through {name}: p50 {stats['p50']:.1f} ms, p95 {stats['p95']:.1f} ms")  # type: ignore[index]
    print(f"same hits on every path: {figures['same_hits_on_every_path']}; "
          f"standby served the reads: {figures['standby_served_reads']}")
    print(f"a synced document visible on the standby after: {figures['standby_visible_after_sync_ms']} ms")
    print(f"results: {write_results('scale', figures, machine_info())}")


if __name__ == "__main__":
    asyncio.run(main())
