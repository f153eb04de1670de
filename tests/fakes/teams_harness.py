"""Running the real Teams bot against the fake Bot Connector (tests/fakes/teams_connector.py), shared by the tests
that drive Teams (tests/test_teams.py, tests/test_teams_primitives.py, tests/test_chat_core.py) and by
bench/bot_bench.py.

The fake is imported here only as `fakes.teams_connector`: its signing keys are made once per process, and a second
import path would make a second key set that the SDK's cached JWKS (one PyJWKClient per address) rejects.

    with reachable_connector() as fake:                      # the SDK's and MSAL's https calls reach the fake
        async with running_teams_bot(kb, fake) as bot:      # TeamsAdapter serving /api/messages on a free port
            question = await ask_in_channel(fake, bot, channel, user, "How many vacation days?")
"""

from __future__ import annotations

import contextlib
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.web_routedef import AbstractRouteDef

from bot.chat.state import BotState
from bot.context import BotContext
from bot.server import BotMetrics
from bot.settings import BotSettings
from bot.teams.adapter import TeamsAdapter
from bot.teams.settings import TeamsSettings
from fakes.graph_api import FakeGraph
from fakes.server import serve_app
from fakes.teams_connector import FakeTeamsConnector, Member, Message


@contextlib.contextmanager
def reachable_connector() -> Iterator[FakeTeamsConnector]:
    """The fake Bot Connector, with the SDK's and MSAL's https calls sent to it (HTTPS_PROXY and its CA, as a
    company proxy would), undone on exit."""
    with FakeTeamsConnector() as connector, pytest.MonkeyPatch.context() as env:
        for name, value in connector.environ().items():
            env.setenv(name, value)
        # urllib (pyjwt's key fetch) caches one opener with the proxies it read first: build it anew.
        urllib.request.install_opener(urllib.request.build_opener())
        try:
            yield connector
        finally:
            urllib.request.install_opener(None)


@contextlib.asynccontextmanager
async def serving(routes: Iterable[AbstractRouteDef]) -> AsyncIterator[str]:
    """An aiohttp server on a free local port with these routes; yields its /api/messages URL (the messaging
    endpoint a bot registration names)."""
    app = web.Application()
    app.add_routes(routes)
    runner, port = await serve_app(app)
    try:
        yield f"http://127.0.0.1:{port}/api/messages"
    finally:
        await runner.cleanup()


@dataclass
class Bot:
    adapter: TeamsAdapter
    url: str


@contextlib.asynccontextmanager
async def running_teams_bot(kb: Any, fake: FakeTeamsConnector, *, graph: FakeGraph | None = None,
                            **overrides: object) -> AsyncIterator[Bot]:
    """A Teams adapter serving /api/messages on a free port (its sweeper off unless overridden: the test sweeps);
    with `graph`, its Microsoft Graph base URL points at that fake (team owners; the Graph token comes from the
    connector's identity platform, as the bot's own does)."""
    settings = BotSettings(_env_file=None, **{"answer_sweep_seconds": 0, **overrides})  # type: ignore[arg-type]
    hosts = {"graph_base_url": graph.url} if graph is not None else {}
    teams = TeamsSettings(_env_file=None, app_id=fake.app_id,  # type: ignore[call-arg]
                          app_password=fake.app_password, tenant_id=fake.tenant_id, **hosts)
    adapter = TeamsAdapter(BotContext(kb, settings, BotMetrics(), BotState(kb.engine)), teams=teams)
    async with serving(adapter.routes()) as url:
        await adapter.start()
        try:
            yield Bot(adapter, url)
        finally:
            await adapter.stop()


def new_id(kind: str) -> str:
    """A new Teams channel / chat id, shaped like Teams' (`19:...@thread.tacv2`)."""
    return f"19:{kind}-{uuid.uuid4().hex[:10]}@thread.tacv2"


def finished(message: Message) -> bool:
    """A message of the bot's that is an answer, not the "Searching the documents…" placeholder."""
    return message.from_bot and "Searching the documents" not in message.text


async def ask_in_channel(fake: FakeTeamsConnector, bot: Bot, channel: str, user: Member, text: str,
                         **kwargs: Any) -> dict[str, Any]:
    """`user` @mentions the bot in `channel` with `text`; the delivered activity (its id roots the reply thread)."""
    activity = fake.channel_message(f"<at>ragbot</at> {text}", channel, user, **kwargs)
    status, _ = await fake.deliver(bot.url, activity)
    assert status == 202
    return activity
