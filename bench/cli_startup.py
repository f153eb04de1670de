"""Cold start of the `ragbot` CLI: wall time of whole commands, and where the time of one goes, phase by phase.

    RAGBOT_HOME=/tmp/bench-home python bench/cli_startup.py [--runs 5] [--folder examples/handbook]

Every run is a fresh interpreter, as when a person types the command. The embedded database is started once
before measuring (later commands reuse it, as they do in real use). Prints the best and the median of the runs and
the load average, because other work on the machine moves these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PHASES = r"""
import time, json, asyncio
t0 = time.perf_counter()
marks = {}
import bot.cli  # the CLI module, as `ragbot` imports it
from knowledge.kb import KnowledgeBase
from knowledge.search.retrieval import SearchFilters
marks["imports"] = time.perf_counter() - t0
from db.engine import create_engine, database_url
t = time.perf_counter(); url = database_url(); marks["database start/reuse"] = time.perf_counter() - t
async def go():
    from db.migrate import ensure_schema
    engine = create_engine(url)
    t = time.perf_counter(); await ensure_schema(engine); marks["migration check"] = time.perf_counter() - t
    await engine.dispose()
    kb = await KnowledgeBase.open()
    t = time.perf_counter(); kb.embedder.embed(["warm up"]); marks["model load"] = time.perf_counter() - t
    t = time.perf_counter()
    await kb.search("How many PTO days do I get in my first year?", SearchFilters(), k=10)
    marks["query (embed + SQL)"] = time.perf_counter() - t
    t = time.perf_counter()
    await kb.answer("How many PTO days do I get in my first year?", ["everyone"], "bench")
    marks["offline answer"] = time.perf_counter() - t
    await kb.close()
asyncio.run(go())
print("PHASES=" + json.dumps(marks))
"""

COMMANDS = {
    "ragbot --help": ["--help"],
    "ragbot status": ["status"],
    "ragbot search --mode lexical": ["search", "carry over unused days", "--mode", "lexical"],
    "ragbot search (hybrid)": ["search", "How many PTO days do I get in my first year?"],
    "ragbot ask (offline)": ["ask", "How many PTO days do I get in my first year?"],
}


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "ANTHROPIC_API_KEY": ""}


def timed(args: list[str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one command. On a busy shared machine the wall time mostly
    measures the queue for the CPU; the CPU time is what the command itself costs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bot.cli", *args], env=env(), cwd=REPO, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--folder", default=str(REPO / "examples" / "handbook"))
    options = parser.parse_args()

    # Index the folder once (and start the embedded database): cold start is about later commands.
    subprocess.run([sys.executable, "-m", "bot.cli", "ingest", options.folder], env=env(), cwd=REPO, check=True,
                   capture_output=True)

    print(f"load average before: {os.getloadavg()[0]:.2f} (2-core machine)")
    print(f"{'command':32} {'wall best':>9} {'median':>7} {'CPU best':>9} {'median':>7}   ({options.runs} runs, fresh process each)")
    for label, args in COMMANDS.items():
        runs = [timed(args) for _ in range(options.runs)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"{label:32} {min(walls):8.2f}s {statistics.median(walls):6.2f}s {min(cpus):8.2f}s {statistics.median(cpus):6.2f}s")

    phase_runs: list[dict[str, float]] = []
    for _ in range(options.runs):
        done = subprocess.run([sys.executable, "-c", PHASES], env=env(), cwd=REPO, check=True, capture_output=True,
                              text=True)
        phase_runs.append(json.loads(done.stdout.split("PHASES=")[-1]))
    print(f"\n{'phase (one search/ask)':32} {'best':>7} {'median':>7}")
    for phase in phase_runs[0]:
        values = [run[phase] for run in phase_runs]
        print(f"{phase:32} {min(values) * 1000:5.0f}ms {statistics.median(values) * 1000:5.0f}ms")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
