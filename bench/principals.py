"""Resolving a person's principals at company scale, and a directory sync of that size (issue 33). Prints figures
and writes bench/results/principals.json; asserts nothing.

    .venv/bin/python bench/principals.py [--people 10000] [--groups 2000] [--questions 2000]

A synthetic Google Workspace: `--people` people, each a direct member of 3 of the leaf groups; `--groups` groups in
five levels (60% leaves, then 24%, 10%, 4.5%, 1.5%), each group below the top a member of one group of the next level
(nesting depth 4), one in ten of a second one too, and one cycle. It is served by the fake Directory API
(tests/fakes/directory_api.py, pages of 200 as Google's maximum) and refreshed through the real
google-api-python-client and service-account flow, as `ragbot access refresh` does (time, API calls). Then
`KnowledgeBase.principals_for` for `--questions` random people: *cold* (the person not cached; the directories
already in memory), *warm* (asked again within the cache TTL: the chat case, target p95 <= 5 ms), and the one-off
load of the directories into memory. Uses DATABASE_URL if set, else a throwaway embedded Postgres.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench.common import machine_info, summary, use_throwaway_home, write_results  # noqa: E402

use_throwaway_home()

from fakes.drive_api import FakeDrive  # noqa: E402

LEVELS = (0.60, 0.24, 0.10, 0.045, 0.015)


def build_org(drive: FakeDrive, people: int, groups: int, seed: int = 7) -> tuple[list[str], int]:
    """The synthetic org in the fake directory. Returns (people's emails, direct memberships)."""
    rng = random.Random(seed)
    counts = [max(1, round(groups * share)) for share in LEVELS]
    counts[0] += groups - sum(counts)
    levels = [[f"g{level}-{i}@acme.example" for i in range(n)] for level, n in enumerate(counts)]
    members: dict[str, list[object]] = {g: [] for level in levels for g in level}
    emails = [f"person{i}@acme.example" for i in range(people)]
    for email in emails:
        for group in rng.sample(levels[0], 3):
            members[group].append(email)
    for level in range(len(levels) - 1):
        for group in levels[level]:
            parents = [rng.choice(levels[level + 1])]
            if rng.random() < 0.1:
                parents.append(rng.choice(levels[level + 1]))
            for parent in set(parents):
                members[parent].append(("group", group))
    members[levels[0][0]].append(("group", levels[-1][0]))  # a cycle: the top contains a leaf that reaches it
    for group, listed in members.items():
        drive.directory.add_group(group, listed)
    return emails, sum(len(v) for v in members.values())


async def main(people: int, groups: int, questions: int) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from bench.common import database_versions, drop_database, open_fresh_kb
    from knowledge.access import AccessResolver

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    figures: dict[str, object] = {"people": people, "groups": groups}
    with FakeDrive(require_auth=True) as drive:
        drive.directory.page_size = 200
        os.environ["GOOGLE_SERVICE_ACCOUNT_JSON"] = json.dumps({
            "type": "service_account", "project_id": "bench", "private_key_id": "k", "private_key": pem,
            "client_email": "bench@bench.iam.gserviceaccount.com", "client_id": "1", "token_uri": drive.token_uri})
        os.environ["GDRIVE_DIRECTORY_API_ENDPOINT"] = drive.base_url + "/"
        emails, memberships = build_org(drive, people, groups)
        figures["direct_memberships"] = memberships
        kb = await open_fresh_kb("ragbot_bench_principals")
        try:
            await kb.add_source("org", "gdrive", {"folders": ["0Bench"], "admin_email": "admin@acme.example"},
                                check=False)
            before = len(drive.requests)
            started = time.perf_counter()
            report = await kb.refresh_groups("org")
            sync_seconds = time.perf_counter() - started
            calls = Counter(r.path.rsplit("/", 1)[-1] for r in drive.requests[before:] if "/admin/" in r.path)
            figures["directory_sync"] = {"seconds": round(sync_seconds, 2), "api_calls": report.api_calls,
                                         "by_endpoint": dict(calls), "groups": report.groups,
                                         "memberships": report.memberships}
            print(f"directory sync: {report.groups} groups, {report.memberships} memberships in {sync_seconds:.2f} s, "
                  f"{report.api_calls} API calls {dict(calls)}")

            resolver = AccessResolver(kb.search_engine, ttl_seconds=7200, cache_seconds=3600)
            started = time.perf_counter()
            await resolver.principals_for("user:nobody@acme.example")  # loads the directories into memory
            load_ms = (time.perf_counter() - started) * 1000
            rng = random.Random(3)
            sample = [f"user:{e}" for e in rng.sample(emails, min(questions, len(emails)))]
            cold, warm, sizes = [], [], []
            for person in sample:
                started = time.perf_counter()
                resolved = await resolver.principals_for(person)
                cold.append((time.perf_counter() - started) * 1000)
                sizes.append(len(resolved.principals))
            for person in sample:
                started = time.perf_counter()
                await resolver.principals_for(person)
                warm.append((time.perf_counter() - started) * 1000)
            figures["resolve_ms"] = {"cold": summary(cold), "warm": summary(warm), "load_directories": round(load_ms, 1)}
            figures["principals_per_person"] = summary([float(s) for s in sizes])
            print(f"load directories into memory: {load_ms:.1f} ms")
            print(f"resolve, cold (person not cached): {summary(cold)} ms")
            print(f"resolve, warm (cached):            {summary(warm)} ms   target p95 <= 5 ms")
            print(f"principals per person:             {summary([float(s) for s in sizes])}")
            versions = await database_versions(kb.engine)
        finally:
            await kb.close()
            drop_database("ragbot_bench_principals")
    path = write_results("principals", figures, machine_info(versions))
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=2_000)
    parser.add_argument("--questions", type=int, default=2_000)
    args = parser.parse_args()
    asyncio.run(main(args.people, args.groups, args.questions))
