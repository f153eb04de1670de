"""`ragbot run` that cannot start (issue 41, item 2): a refused token, an unreachable platform, a missing scope or a
busy port is one line on stderr naming the setting and the fix, a non-zero exit status, and no traceback unless
LOG_LEVEL=DEBUG (nor `ImportError: sys.meta_path is None` at exit). The platforms are the local fakes; the refusals
are the ones their references document (named beside each)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from fakes.slack_api import FakeSlackAPI

from bot.app import BotApp
from bot.server import StartupError
from bot.settings import BotSettings

REPO = Path(__file__).resolve().parent.parent


def run_env(database_url: str, **settings: str) -> dict[str, str]:
    """`ragbot run`'s environment: the test database, no terminal chat, numpy questions (no ONNX build at start)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DATABASE_URL": database_url, "TERMINAL_CHAT": "false",
           "QUERY_ENCODER": "numpy", "HOST": "127.0.0.1", "PORT": "0", "LOG_LEVEL": "WARNING"}
    for name in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET", "DISCORD_TOKEN", "DISCORD_BOT_TOKEN"):
        env.pop(name, None)
    env.update(settings)
    return env


async def ragbot_run(env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", env=env, cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), timeout=300)
    assert process.returncode is not None
    return process.returncode, err.decode()


def assert_one_line(status: int, stderr: str, *needles: str) -> None:
    assert status != 0, stderr
    assert "Traceback" not in stderr and "meta_path" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def slack() -> FakeSlackAPI:
    with FakeSlackAPI() as fake:
        yield fake


async def test_a_refused_slack_token_is_one_line_naming_slack_bot_token(slack: FakeSlackAPI, fresh_database) -> None:
    # auth.test answers invalid_auth for a token it does not know (https://api.slack.com/methods/auth.test, Errors).
    slack.refuse("auth.test", "invalid_auth")
    status, stderr = await ragbot_run(run_env(fresh_database(), SLACK_BOT_TOKEN="xoxb-fake", SLACK_SIGNING_SECRET="x",
                                              SLACK_API_URL=slack.api_url))
    assert_one_line(status, stderr, "Slack refused SLACK_BOT_TOKEN (invalid_auth)", "OAuth & Permissions")
    assert "xoxb-fake" not in stderr


async def test_an_unreachable_slack_is_one_line_and_debug_shows_the_traceback(fresh_database) -> None:
    unreachable = "http://127.0.0.1:9/api/"  # the discard port: connection refused
    env = run_env(fresh_database(), SLACK_BOT_TOKEN="xoxb-fake", SLACK_SIGNING_SECRET="x", SLACK_API_URL=unreachable)
    status, stderr = await ragbot_run(env)
    assert_one_line(status, stderr, "could not reach Slack at http://127.0.0.1:9/api/", "SLACK_API_URL")

    status, stderr = await ragbot_run({**env, "LOG_LEVEL": "DEBUG"})
    assert status != 0 and "Traceback" in stderr
    assert stderr.strip().splitlines()[-1].startswith("Error: could not reach Slack")


async def test_a_refused_discord_token_is_one_line_without_an_import_error_at_exit(discord_api, fresh_database):
    # GET /users/@me with a wrong bot token answers 401 (https://discord.com/developers/docs/topics/opcodes-and-status-codes#http).
    status, stderr = await ragbot_run(run_env(fresh_database(), DISCORD_TOKEN="not-the-token",
                                              DISCORD_API_URL=discord_api.base_url,
                                              DISCORD_GATEWAY_URL=discord_api.gateway_url))
    assert_one_line(status, stderr, "Discord refused DISCORD_TOKEN", "Reset Token")


async def test_an_unreachable_discord_names_discord_api_url(kb_factory) -> None:
    kb = await kb_factory()
    app = BotApp(BotSettings(_env_file=None, DISCORD_TOKEN="a-token", discord_api_url="http://127.0.0.1:9/api/v10",  # type: ignore[call-arg]
                             port=0, host="127.0.0.1"), kb=kb)
    with pytest.raises(StartupError, match=r"could not reach Discord at http://127.0.0.1:9/api/v10 .*DISCORD_API_URL"):
        await app.serve_forever()
    assert app.port is not None and app._runner is None  # the HTTP server it had started is stopped again


async def test_a_missing_scope_names_the_scope_and_the_token(slack: FakeSlackAPI, kb_factory) -> None:
    # Every Web API method may answer missing_scope with the scope `needed` (https://api.slack.com/web#errors); the
    # fake sends the error alone, so the message falls back to "a scope" but still names the token to replace.
    slack.refuse("apps.connections.open", "missing_scope")
    kb = await kb_factory()
    app = BotApp(BotSettings(_env_file=None, slack_bot_token="xoxb-1", slack_app_token="xapp-1",  # type: ignore[call-arg]
                             slack_api_url=slack.api_url, port=0, host="127.0.0.1"), kb=kb)
    with pytest.raises(StartupError, match=r"SLACK_APP_TOKEN lacks the scope .*reinstall the app"):
        await app.serve_forever()


async def test_a_refused_token_is_reported_before_the_embedding_model_loads(slack: FakeSlackAPI, kb_factory) -> None:
    # auth.test answers invalid_auth for a token it does not know (https://api.slack.com/methods/auth.test, Errors).
    # The platforms are checked first: a start that fails never pays for torch and the weights (seconds of CPU).
    from knowledge.embedding.encoder import Embedder
    from knowledge.kb import KnowledgeBase

    slack.refuse("auth.test", "invalid_auth")
    opened = await kb_factory()
    unloaded = Embedder(opened.embedder.name)  # not the process-wide one, which other tests may have loaded
    kb = KnowledgeBase(opened.engine, opened.settings, unloaded, opened.url)
    app = BotApp(BotSettings(_env_file=None, slack_bot_token="xoxb-fake", slack_signing_secret="x",  # type: ignore[call-arg]
                             slack_api_url=slack.api_url, port=0, host="127.0.0.1"), kb=kb)
    try:
        with pytest.raises(StartupError, match=r"Slack refused SLACK_BOT_TOKEN \(invalid_auth\)"):
            await app.serve_forever()
        assert "model" not in vars(unloaded), "the model was loaded for a start that could not succeed"
    finally:
        await kb.search_engine.dispose()  # its own pool; the engine is the fixture's
