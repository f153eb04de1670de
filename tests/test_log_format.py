"""LOG_FORMAT=json: one JSON object per line (time, level, logger, message), and no secret in any log line."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from pydantic import SecretStr

from bot.logs import configure_logging, secret_values
from bot.settings import BotSettings

REPO = Path(__file__).resolve().parent.parent


def test_json_lines_carry_time_level_logger_message_and_no_secret() -> None:
    settings = BotSettings(slack_bot_token=SecretStr("xoxb-1111-2222-abcdefSECRET"),
                           slack_signing_secret=SecretStr("signing-s3cret-value"))
    stream = io.StringIO()
    logger = logging.getLogger("ragbot.test.json")
    logger.propagate = False
    try:
        assert configure_logging("INFO", "json", secret_values(settings), stream=stream, root=logger) is not None
        logger.info("posting with %s", "signing-s3cret-value")
        logger.warning("connect to postgresql://ragbot:pa55word@db:5432/ragbot failed")
        logger.debug("below the level: not written")
        try:
            raise RuntimeError("token xoxb-1111-2222-abcdefSECRET refused")
        except RuntimeError:
            logger.exception("Slack said no")
    finally:
        logger.handlers.clear()
        logger.propagate = True

    output = stream.getvalue()
    lines = [json.loads(line) for line in output.splitlines() if line.strip().startswith("{")]
    assert [(e["level"], e["logger"]) for e in lines] == [
        ("INFO", "ragbot.test.json"), ("WARNING", "ragbot.test.json"), ("ERROR", "ragbot.test.json")]
    assert all(set(e) >= {"time", "level", "logger", "message"} for e in lines)
    assert lines[0]["time"].endswith("+00:00")
    assert lines[0]["message"] == "posting with ***"
    assert lines[1]["message"] == "connect to postgresql://ragbot:***@db:5432/ragbot failed"
    assert lines[2]["message"] == "Slack said no" and "RuntimeError: token *** refused" in lines[2]["exception"]
    # Every line is one object: the traceback is inside it, not on lines of its own.
    assert len(output.strip().splitlines()) == 3
    for secret in ("abcdefSECRET", "signing-s3cret-value", "pa55word"):
        assert secret not in output


def _ragbot(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "bot.cli", *args], env=environment, capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_cli_logs_json_and_hides_the_database_password(tmp_path: Path) -> None:
    # Nothing listens on port 1: the command fails at once, after asyncio has logged its selector at DEBUG.
    done = _ragbot("db", "upgrade", LOG_FORMAT="json", LOG_LEVEL="DEBUG", RAGBOT_HOME=str(tmp_path),
                   DATABASE_URL="postgresql://ragbot:hunter2secret@127.0.0.1:1/ragbot")
    assert done.returncode != 0
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert records, done.stderr
    assert {"asyncio"} <= {r["logger"] for r in records}
    assert all(r["level"] in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"} for r in records)
    assert "hunter2secret" not in done.stderr + done.stdout


def test_an_unknown_log_format_is_one_clear_line() -> None:
    done = _ragbot("status", LOG_FORMAT="xml")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "LOG_FORMAT" in lines[0] and "'text' or 'json'" in lines[0], done.stderr
