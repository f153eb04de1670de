"""`ragbot run` with no chat token and TERMINAL_CHAT=false (as in the container image): it serves /healthz and
/metrics until SIGTERM, then exits cleanly and promptly (a container's stop gives it 10 seconds)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_run_without_a_chat_token_serves_health_and_metrics_then_stops_on_sigterm(handbook_url: str) -> None:
    port = _free_port()
    # QUERY_ENCODER=numpy: no ONNX file is built in the background at start (a stop waits for such a build, which
    # takes seconds on a busy machine; what is timed here is the shutdown itself).
    env = {**os.environ, "PYTHONPATH": str(REPO), "DATABASE_URL": handbook_url, "TERMINAL_CHAT": "false",
           "QUERY_ENCODER": "numpy",
           "HOST": "127.0.0.1", "PORT": str(port), "SLACK_BOT_TOKEN": "", "DISCORD_TOKEN": "", "DISCORD_BOT_TOKEN": ""}
    process = subprocess.Popen([sys.executable, "-m", "bot.cli", "run"], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        status, body = 0, ""
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/healthz")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert status == 200, (status, body, process.poll())
        assert '"database": "ok"' in body and '"model": "ok"' in body
        status, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "ragbot_questions_total" in metrics

        process.send_signal(signal.SIGTERM)
        # It must stop by itself, cleanly; the 10-second bound of a container stop is timed by `make image-test`
        # on an idle machine (a timed assertion here would fail whenever the test machine is busy).
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert "without a chat platform" in out and "you>" not in out
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_run_help_shows_the_headless_flags() -> None:
    done = subprocess.run([sys.executable, "-m", "bot.cli", "run", "--help"], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0
    for flag in ("--headless", "--port", "--host"):
        assert flag in done.stdout


def test_run_headless_with_a_port_flag_serves_without_any_chat(handbook_url: str) -> None:
    """The flags alone, with TERMINAL_CHAT and PORT at their defaults (which would open the terminal chat on 3000):
    `--headless --port P --host 127.0.0.1` serves health and metrics on P until SIGTERM."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "DATABASE_URL": handbook_url, "QUERY_ENCODER": "numpy",
           "SLACK_BOT_TOKEN": "", "DISCORD_TOKEN": "", "DISCORD_BOT_TOKEN": ""}
    for name in ("TERMINAL_CHAT", "PORT", "HOST"):
        env.pop(name, None)
    process = subprocess.Popen([sys.executable, "-m", "bot.cli", "run", "--headless", "--port", str(port),
                                "--host", "127.0.0.1"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        status = 0
        while time.monotonic() < deadline and process.poll() is None and status != 200:
            try:
                status, _ = _get(f"http://127.0.0.1:{port}/healthz")
            except OSError:
                time.sleep(0.5)
        assert status == 200, process.poll()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert f"on port {port}" in out and "you>" not in out
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
