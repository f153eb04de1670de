"""Small fail-closed cases of issue 30: a busy PORT, an interrupted run's listing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ragbot_run_with_its_port_in_use_prints_one_line_naming_port(fresh_database, ragbot_home):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**os.environ, "DATABASE_URL": fresh_database(), "RAGBOT_HOME": str(ragbot_home), "PORT": str(port),
               "HOST": "127.0.0.1", "DISCORD_TOKEN": "unused-the-port-fails-first",
               "DISCORD_API_URL": "http://127.0.0.1:9/api/v10", "PYTHONPATH": str(REPO),
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        done = subprocess.run([sys.executable, "-m", "bot.cli", "run"], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("Error:"), done.stderr
    assert f"port {port}" in errors[0] and "already in use" in errors[0] and "PORT" in errors[0]


# A sync in a process of its own, as the tests' own syncs run (tests/conftest.py): documents parse in a thread and the
# model's vectors come from the tests' embedding cache (tests/embedding_cache.py), so the child pays neither parsing
# workers nor torch (on the CPU, EMBEDDING_DEVICE=cpu: no torch import to look for a GPU) once the cache is warm.
CHILD = r"""
import asyncio, sys, time
sys.path.insert(0, "tests")
from embedding_cache import install
install()
from db.settings import DatabaseSettings
from knowledge.kb import KnowledgeBase
from knowledge.settings import KnowledgeSettings
from knowledge.sources.base import SourceItem, SourceSpec, StaticSource

def read(n):
    if n >= 16:  # the second batch never arrives: the process is killed while waiting for it
        time.sleep(3600)
    return f"# Room {n}\n\nMeeting room {n} seats {n + 4} people.".encode()

async def main():
    kb = await KnowledgeBase.open(KnowledgeSettings(_env_file=None, parse_workers=0, embedding_device="cpu"), DatabaseSettings(_env_file=None,
                                  database_url=sys.argv[1]))
    items = [SourceItem(external_id=f"room{n}.md", filename=f"room{n}.md", read=lambda n=n: read(n))
             for n in range(40)]
    await kb.sync(StaticSource(SourceSpec("rooms", "test"), items))

asyncio.run(main())
"""


def test_a_killed_run_that_committed_documents_is_listed_with_them_not_as_no_changes(fresh_database, ragbot_home):
    import json
    import signal
    import time

    import psycopg
    from typer.testing import CliRunner

    from bot.cli import app

    url = fresh_database()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, url], env=env, cwd=REPO)
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    try:
        for _ in range(600):
            with psycopg.connect(plain) as conn:
                committed = conn.execute("SELECT count(*) FROM documents").fetchone()[0]
            if committed >= 16 or child.poll() is not None:
                break
            time.sleep(0.5)
        assert committed == 16
        time.sleep(1)  # the progress record follows the commit
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    result = CliRunner().invoke(app, ["sync-runs", "--json"], env={"DATABASE_URL": url})
    assert result.exit_code == 0, result.output
    [run] = json.loads(result.stdout)["runs"]
    assert run["status"] == "running" and run["added"] == 16  # nobody has noticed the death yet

    # The next run of the source finds the dead one and marks it interrupted, keeping what it committed.
    resumed = subprocess.run([sys.executable, "-c", CHILD.replace("n >= 16", "False"), url], env=env, cwd=REPO,
                             timeout=600)
    assert resumed.returncode == 0
    result = CliRunner().invoke(app, ["sync-runs", "--json"], env={"DATABASE_URL": url})
    latest, killed = json.loads(result.stdout)["runs"]
    assert (killed["status"], killed["added"]) == ("interrupted", 16)
    assert (latest["status"], latest["added"], latest["unchanged"]) == ("ok", 24, 16)
    table = CliRunner().invoke(app, ["sync-runs"], env={"DATABASE_URL": url, "COLUMNS": "200"}).stdout
    assert "interrupted" in table and "16 added" in table and "no changes" not in table
