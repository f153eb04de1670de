"""Several sync workers: real `ragbot scheduler` processes on one database, one worker per source at a
time (its lease, db.leases). Two cases, each measured with one worker and with two:

- `sources`: four sources (each a copy of the handbook's Markdown pages, so every source costs the same), from the
  first run's start to the last run's end as the runs record them (SYNC_SPLIT_FIRST=false: one source, one worker).
- `big`: one source of `--folders` top-level folders (each `--pages` of the handbook's Markdown pages): its first
  sync split into parts by folder (knowledge.ingest.split), from the first run's start to the end of the run that
  published the source (worker start-up, the model's load, counts here: the second worker joins cold).

    .venv/bin/python bench/sync_workers.py [--case sources big] [--sources 4] [--folders 8] [--pages 4] [--workers 1 2]
    .venv/bin/python bench/sync_workers.py --case big --workers 1 --no-split   # the same source as one unit

Each configuration gets a fresh database on a throwaway embedded server (or DATABASE_URL's server); the workers
are real `python -m bot.cli scheduler` processes, stopped with SIGINT (they finish what they run) when every source
has synced once. Results go to bench/results/sync_workers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, RESULTS, drop_database, machine_info, open_fresh_kb, use_throwaway_home, write_results  # noqa: E402
from knowledge import SyncRun  # noqa: E402

HANDBOOK = REPO / "examples" / "handbook"


def make_big_source(root: Path, folders: int, pages: int) -> Path:
    """One source folder with `folders` top-level folders, each `pages` of the handbook's Markdown pages with a line of
    its own."""
    source = root / "big"
    handbook = sorted(HANDBOOK.rglob("*.md"))
    for n in range(folders):
        for page in handbook[:pages]:
            target = source / f"team{n}" / page.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(page.read_text() + f"\n\nCopy {n} of this page, kept by team {n}.\n")
    return source


def stop_workers(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGINT every worker (a scheduler ends its run cleanly on it), then kill any still running after 120 s."""
    for process in processes:
        process.send_signal(signal.SIGINT)
    for process in processes:
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()


async def measure_big(workers: int, folder: Path, split: bool = True) -> dict[str, object]:
    """One big source's first sync, split by folder (or, `split=False`, as one unit), with `workers` scheduler
    processes."""
    database = f"bench_big_{workers}"
    kb = await open_fresh_kb(database)
    try:
        await kb.add_source("big", "folder", {"path": str(folder)}, schedule_seconds=2)
        env = {**os.environ, "DATABASE_URL": kb.url, "PYTHONPATH": str(REPO), "SYNC_SPLIT_FIRST": str(split).lower()}
        processes = [subprocess.Popen([sys.executable, "-m", "bot.cli", "scheduler", "--refresh", "1"], env=env,
                                      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for _ in range(workers)]
        try:
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                runs = await kb.sync_runs("big", 200)
                if (any(r.status == "ok" and r.added for r in runs) and not await kb.open_split_syncs()
                        and not any(r.status == "running" for r in runs)):
                    break  # published (the plan goes in the same transaction), and the publishing run recorded
                await asyncio.sleep(0.5)
            else:
                raise SystemExit("the workers did not publish the big source within 30 minutes")
        finally:
            stop_workers(processes)
        done = [r for r in runs if r.status == "ok" and r.finished_at]
        start = min(r.started_at for r in runs)
        end = max(r.finished_at for r in done if r.finished_at)
        return {
            "workers": workers,
            "split": split,
            "folders": len([p for p in folder.iterdir() if p.is_dir()]),
            "documents": (await kb.status()).documents,
            "published_s": round((end - start).total_seconds(), 1),
            "documents_per_run": sorted((r.added for r in done), reverse=True),
        }
    finally:
        await kb.close()
        drop_database(database)


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
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(REPO), "SYNC_SPLIT_FIRST": "false"}
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
            stop_workers(processes)
        first: dict[str, SyncRun] = {}
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
    parser.add_argument("--case", nargs="+", choices=["sources", "big"], default=["sources", "big"])
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--folders", type=int, default=8)
    parser.add_argument("--pages", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-split", action="store_true", help="the big source's first sync as one unit "
                        "(SYNC_SPLIT_FIRST=false), to see what splitting costs one worker")
    args = parser.parse_args()
    use_throwaway_home()
    root = Path(tempfile.mkdtemp(prefix="ragbot-bench-sources-"))
    try:
        figures: dict[str, object] = {}
        if "sources" in args.case:
            folders = make_sources(root, args.sources)
            for workers in args.workers:
                result = await measure(workers, folders)
                figures[f"{workers}_workers"] = result
                print(f"{workers} worker(s), {result['sources']} sources, {result['documents']} documents: all synced "
                      f"in {result['all_sources_synced_s']} s (each source {result['per_source_s']} s)")
        if "big" in args.case:
            big = make_big_source(root, args.folders, args.pages)
            for workers in args.workers:
                result = await measure_big(workers, big, split=not args.no_split)
                figures[f"big_{workers}_workers{'_unsplit' if args.no_split else ''}"] = result
                print(f"{workers} worker(s), one source of {result['folders']} folders, {result['documents']} "
                      f"documents: published in {result['published_s']} s (documents per run "
                      f"{result['documents_per_run']})")
        machine = machine_info()
        previous = RESULTS / "sync_workers.json"
        kept = json.loads(previous.read_text()) if previous.exists() and "sources" not in args.case else {}
        if "big" in args.case:  # the big case's own machine line; the sources case's stays unless it ran again
            figures["big_machine"] = {"machine": machine, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                       time.gmtime())}
        path = write_results("sync_workers", figures, kept.get("machine", machine))
        if kept.get("measured_at"):
            merged = json.loads(path.read_text())
            merged["measured_at"] = kept["measured_at"]
            path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
        print(f"results: {path}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
