"""Speed and request figures for Confluence syncs. Prints numbers; asserts nothing.

    .venv/bin/python bench/confluence_sync_bench.py [--pages 300] [--restricted 30]

Against the fake Confluence (tests/fakes/confluence_api.py, Cloud shapes, 25 results per search page) on
127.0.0.1: a first sync of N pages with permissions, a no-change incremental sync, a sync after editing one page,
a prune pass after deleting one page (re-reading permissions), and a full sync. For each: seconds, HTTP requests,
chunks embedded. Uses DATABASE_URL if set, else a throwaway embedded Postgres.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

if not os.environ.get("DATABASE_URL"):
    os.environ["RAGBOT_HOME"] = tempfile.mkdtemp(prefix="ragbot-bench-")
os.environ["ANTHROPIC_API_KEY"] = ""
os.environ["CONFLUENCE_API_TOKEN"] = "good-token"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fakes.confluence_api import FakeConfluence  # noqa: E402

from knowledge.kb import KnowledgeBase  # noqa: E402

TOPICS = ["deploys", "on-call", "expenses", "travel", "security", "hiring", "laptops", "vpn", "payroll", "offsites"]


def page_body(n: int) -> str:
    topic = TOPICS[n % len(TOPICS)]
    return (f"<h2>{topic.title()} {n}</h2><p>Team {n} handles {topic} requests within {n % 5 + 1} working days.</p>"
            f"<ul><li>Ask in #{topic}-{n}.</li><li>Escalate to the lead after {n % 3 + 2} days.</li></ul>"
            f'<ac:structured-macro ac:name="info"><ac:rich-text-body><p>Owner: squad {n % 17}.</p>'
            "</ac:rich-text-body></ac:structured-macro>")


async def measure(label: str, wiki: FakeConfluence, run) -> None:  # type: ignore[no-untyped-def]
    before = len(wiki.requests)
    started = time.perf_counter()
    report = await run()
    seconds = time.perf_counter() - started
    print(f"{label:<34} {seconds:7.2f} s  {len(wiki.requests) - before:5d} requests  "
          f"+{len(report.added)} ~{len(report.updated)} -{len(report.deleted)} ={report.unchanged} "
          f"access-only {len(report.metadata_updated)}  embedded {report.chunks_embedded}")


async def main(pages: int, restricted: int) -> None:
    with FakeConfluence(edition="cloud", page_size=25) as wiki:
        wiki.add_space("ENG", "Engineering")
        roots = [wiki.add_page("ENG", f"Area {i}", f"<p>Area {i} overview.</p>") for i in range(10)]
        ids = [wiki.add_page("ENG", f"Page {n}", page_body(n), parent=roots[n % 10]) for n in range(pages)]
        for root in roots[: max(1, restricted // max(1, pages // 10))]:
            wiki.restrict(root, groups=["leads"])
        kb = await KnowledgeBase.open()
        try:
            await kb.add_source("bench", "confluence", {"url": wiki.base_url, "spaces": ["ENG"], "email": wiki.email})
            print(f"{pages + 10} pages, 25 per search page, permissions on")
            await measure("first sync", wiki, lambda: kb.sync_source("bench"))
            await measure("no-change incremental sync", wiki, lambda: kb.sync_source("bench"))
            wiki.edit_page(ids[0], page_body(0) + "<p>Edited.</p>")
            await measure("one page edited", wiki, lambda: kb.sync_source("bench"))
            wiki.delete_page(ids[1])
            wiki.restrict(roots[-1], groups=["leads"])
            await measure("prune (1 deleted, 1 area restricted)", wiki, lambda: kb.sync_source("bench", prune=True))
            await measure("full sync", wiki, lambda: kb.sync_source("bench", full=True))
        finally:
            await kb.remove_source("bench")
            await kb.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--restricted", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(main(args.pages, args.restricted))
