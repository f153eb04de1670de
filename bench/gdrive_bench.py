"""Google Drive sync figures against the local fake Drive v3 (tests/fakes/drive_api.py), through the real
google-api-python-client. Prints numbers; asserts nothing.

    .venv/bin/python bench/gdrive_bench.py [--docs 240] [--latency-ms 80]

1. First sync of N Google Docs in nested folders (listing, permissions, HTML export, parsing, embedding).
2. An incremental sync with nothing changed (one changes.list call).
3. One Doc edited, one sharing change: what is fetched again and how many API calls it takes.
`--latency-ms` adds a delay to every fake API answer, to show what the bounded concurrency buys against a real
Drive's round trips. Uses DATABASE_URL if set, else a throwaway embedded Postgres.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

if not os.environ.get("DATABASE_URL"):
    os.environ["RAGBOT_HOME"] = tempfile.mkdtemp(prefix="ragbot-bench-")
os.environ["ANTHROPIC_API_KEY"] = ""
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fakes.drive_api import FakeDrive  # noqa: E402

from knowledge.kb import KnowledgeBase  # noqa: E402

TOPICS = ["expenses", "travel", "security", "onboarding", "benefits", "payroll", "hardware", "support"]


def build(drive: FakeDrive, docs: int) -> tuple[str, list[str]]:
    root = drive.add_folder("Company")
    folders = [drive.add_folder(topic.title(), root) for topic in TOPICS]
    ids = []
    for i in range(docs):
        topic = TOPICS[i % len(TOPICS)]
        paragraphs = "".join(f"<p>Rule {j} of the {topic} policy number {i}: keep receipts for {j + 3} months and "
                             f"ask the {topic} team in channel #{topic}-{j} when unsure.</p>" for j in range(6))
        html = f"<h1>{topic.title()} policy {i}</h1><h2>Scope</h2>{paragraphs}<h2>Contacts</h2><ul><li>{topic}@acme.example</li></ul>"
        permissions = [drive.domain("acme.example")] if i % 3 else [drive.group(f"{topic}@acme.example")]
        ids.append(drive.add_doc(f"{topic.title()} policy {i}", folders[i % len(folders)], html=html,
                                 permissions=permissions))
    return root, ids


async def main(docs: int, latency_ms: float) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    with FakeDrive(require_auth=True) as drive:
        # A throwaway service-account key whose token endpoint is the fake's: the real google-auth flow runs.
        os.environ["GOOGLE_SERVICE_ACCOUNT_JSON"] = json.dumps({
            "type": "service_account", "project_id": "bench", "private_key_id": "k", "private_key": pem,
            "client_email": "bench@bench.iam.gserviceaccount.com", "client_id": "1", "token_uri": drive.token_uri})
        os.environ.update(GDRIVE_API_ENDPOINT=drive.endpoint, GDRIVE_EVERYONE_DOMAINS="acme.example")
        root, ids = build(drive, docs)
        drive.latency_seconds = latency_ms / 1000
        kb = await KnowledgeBase.open()
        try:
            await kb.add_source("bench", "gdrive", {"folders": [root]})

            async def timed(label: str) -> None:
                before = len(drive.requests)
                started = time.perf_counter()
                report = await kb.sync_source("bench")
                seconds = time.perf_counter() - started
                calls = Counter(r.endpoint for r in drive.requests[before:])
                print(f"{label:<34} {seconds:7.2f} s  added {len(report.added):4d}  updated {len(report.updated):3d}  "
                      f"access-only {len(report.metadata_updated):3d}  API calls {sum(calls.values()):5d} "
                      f"{json.dumps(dict(sorted(calls.items())))}")

            await timed(f"first sync ({docs} Docs)")
            await timed("nothing changed")
            drive.edit_doc(ids[0], "<h1>Expenses policy 0</h1><p>Receipts are now kept for one year.</p>")
            drive.set_permissions(ids[1], [drive.group("travel@acme.example")])
            await timed("one edit + one sharing change")
        finally:
            await kb.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=240)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(main(args.docs, args.latency_ms))
