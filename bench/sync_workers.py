"""Several sync workers sharing the sources: `ragbot scheduler` processes on one database, one worker per source at a
time (its lease, db.leases). Measures one worker against two over the same four sources (each a copy of the
handbook's Markdown pages, so every source costs the same), from the first run's start to the last run's end as the
runs record them (worker start-up, the model's load, is left out: a worker stays up).

    .venv/bin/python bench/sync_workers.py [--sources 4] [--workers 1 2]

Each configuration gets a fresh database on a throwaway embedded server (or DATABASE_URL's server); the workers
are real `python -m bot.cli scheduler` processes, stopped with SIGINT (they finish what they run) when every source
has synced once. Results go to bench/results/sync_workers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, drop_database, machine_info, open_fresh_kb, use_throwaway_home, write_results  # noqa: E402

HANDBOOK = REPO / "examples" / "handbook"


def make_sources(root: Path, count: int) -> list[Path]:
    """`count` folders, each the handbook's Markdown pages with a line of its own (so no two chunks are equal)."""
    folders = []
    for n in range(count):
        folder = root / f"source{n}"
        for page in sorted(HANDBOOK.rglob("*.md")):
            target = folder / page.relative_to(HANDBOOK)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(page.read_text() + f"\n\nCopy {n} of this page, kept by team {n}.\n")
        folders.append(folder)
    return folders


async def measure(workers: int, folders: list[Path]) -> dict[str, object]:
    database = f"bench_workers_{workers}"
    kb = await open_fresh_kb(database)
    try:
        for n, folder in enumerate(folders):
            await kb.add_source(f"source{n}", "folder", {"path": str(folder)}, schedule_seconds=2)
        url = kb.url
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(REPO)}
        processes = [subprocess.Popen([sys.executable, "-m", "bot.cli", "scheduler", "--refresh", "1"], env=env,
                                      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for _ in range(workers)]
        try:
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                runs = [r for r in await kb.sync_runs(None, 200) if r.status == "ok" and r.added]
                if len({r.source for r in runs}) == len(folders):
                    break
                await asyncio.sleep(0.5)
            else:
                raise SystemExit("the workers did not sync every source within 30 minutes")
        finally:
            for process in processes:
                process.send_signal(signal.SIGINT)
            for process in processes:
                try:
                    process.wait(120)
                except subprocess.TimeoutExpired:
                    process.kill()
        first = {}
        for run in sorted(runs, key=lambda r: r.started_at):
            first.setdefault(run.source, run)
        chosen = list(first.values())
        start = min(r.started_at for r in chosen)
        end = max(r.finished_at for r in chosen if r.finished_at)
        busy = [r for r in await kb.sync_runs(None, 200) if r.status not in ("ok",)]
        return {
            "workers": workers,
            "sources": len(folders),
            "documents": sum(r.added for r in chosen),
            "all_sources_synced_s": round((end - start).total_seconds(), 1),
            "per_source_s": sorted(round(((r.finished_at or end) - r.started_at).total_seconds(), 1) for r in chosen),
            "other_runs": len(busy),
        }
    finally:
        await kb.close()
        drop_database(database)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    use_throwaway_home()
    root = Path(tempfile.mkdtemp(prefix="ragbot-bench-sources-"))
    try:
        folders = make_sources(root, args.sources)
        figures = {}
        for workers in args.workers:
            result = await measure(workers, folders)
            figures[f"{workers}_workers"] = result
            print(f"{workers} worker(s), {result['sources']} sources, {result['documents']} documents: all synced in "
                  f"{result['all_sources_synced_s']} s (each source {result['per_source_s']} s)")
        path = write_results("sync_workers", figures, machine_info())
        print(f"results: {path}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
