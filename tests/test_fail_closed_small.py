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
