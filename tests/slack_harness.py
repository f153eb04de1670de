"""Helpers for Slack tests: build the real bot (bot.app.BotApp with the Slack adapter) against the fake Slack Web
API, and send it signed requests over real HTTP, the way Slack does."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlencode

import aiohttp
from fakes.slack_api import BOT_USER_ID, TEAM_ID, FakeSlackAPI, Message
from slack_sdk.signature import SignatureVerifier

from bot.app import BotApp
from bot.settings import BotSettings

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
_ids = itertools.count(1)
_ts = itertools.count(1)


def new_ts() -> str:
    return f"1760000000.{next(_ts):06d}"


def settings_for(fake: FakeSlackAPI, **overrides: Any) -> BotSettings:
    values: dict[str, Any] = dict(slack_bot_token="xoxb-test-token", slack_signing_secret=SECRET,
                                  slack_api_url=fake.api_url, host="127.0.0.1", port=0, user_cache_seconds=60)
    values.update(overrides)
    return BotSettings(_env_file=None, **values)  # type: ignore[call-arg]


@asynccontextmanager
async def running_bot(kb: Any, fake: FakeSlackAPI, **overrides: Any) -> AsyncIterator[SlackClient]:
    app = BotApp(settings_for(fake, **overrides), kb=kb)
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield SlackClient(app, http, fake)
    finally:
        await app.stop()


def event_body(event: dict[str, Any], *, event_id: str | None = None) -> dict[str, Any]:
    return {
        "token": "legacy", "team_id": TEAM_ID, "api_app_id": "A1", "type": "event_callback",
        "event_id": event_id or f"Ev{next(_ids):08d}", "event_time": int(time.time()),
        "authorizations": [{"team_id": TEAM_ID, "user_id": BOT_USER_ID, "is_bot": True}],
        "event": event,
    }


def mention(text: str, *, user: str, channel: str = "C1", ts: str | None = None, thread_ts: str | None = None) -> dict[str, Any]:
    event = {"type": "app_mention", "user": user, "text": f"<@{BOT_USER_ID}> {text}", "ts": ts or new_ts(),
             "channel": channel, "event_ts": ts or new_ts(), "team": TEAM_ID}
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


def message(text: str, *, user: str, channel: str, channel_type: str, ts: str | None = None,
            thread_ts: str | None = None, **extra: Any) -> dict[str, Any]:
    ts = ts or new_ts()
    event = {"type": "message", "user": user, "text": text, "ts": ts, "channel": channel,
             "channel_type": channel_type, "event_ts": ts, "team": TEAM_ID, **extra}
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


class SlackClient:
    """Plays Slack: signs and posts events, slash commands and interactions to the bot."""

    def __init__(self, app: BotApp, http: aiohttp.ClientSession, fake: FakeSlackAPI) -> None:
        self.app = app
        self.http = http
        self.fake = fake

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.app.port}"

    async def post_raw(self, body: str, content_type: str = "application/json", *, secret: str = SECRET,
                       timestamp: int | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
        timestamp = int(time.time()) if timestamp is None else timestamp
        signature = SignatureVerifier(secret).generate_signature(timestamp=str(timestamp), body=body)
        all_headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": str(timestamp),
                       "X-Slack-Signature": signature, **(headers or {})}
        async with self.http.post(f"{self.url}/slack/events", data=body.encode(), headers=all_headers) as response:
            return response.status, await response.text()

    async def send_event(self, event: dict[str, Any], *, event_id: str | None = None, **kwargs: Any) -> int:
        status, _ = await self.post_raw(json.dumps(event_body(event, event_id=event_id)), **kwargs)
        return status

    async def slash(self, text: str, *, user: str, channel: str = "C1") -> tuple[int, dict[str, Any]]:
        form = {"token": "legacy", "team_id": TEAM_ID, "team_domain": "acme", "channel_id": channel,
                "channel_name": "general", "user_id": user, "user_name": user.lower(), "command": "/kb",
                "text": text, "api_app_id": "A1", "response_url": self.fake.response_url,
                "trigger_id": f"trig{next(_ids)}"}
        status, body = await self.post_raw(urlencode(form), "application/x-www-form-urlencoded")
        return status, (json.loads(body) if body.startswith("{") else {"text": body})

    async def click_feedback(self, answer: Message, *, user: str, positive: bool) -> int:
        element = next(e for b in answer.blocks if b.get("type") == "context_actions" for e in b["elements"])
        button = element["positive_button" if positive else "negative_button"]
        payload = {
            "type": "block_actions", "team": {"id": TEAM_ID, "domain": "acme"},
            "user": {"id": user, "username": user.lower(), "team_id": TEAM_ID}, "api_app_id": "A1",
            "token": "legacy", "container": {"type": "message", "message_ts": answer.ts, "channel_id": answer.channel,
                                            "is_ephemeral": False},
            "trigger_id": f"trig{next(_ids)}", "channel": {"id": answer.channel, "name": "general"},
            "message": {"type": "message", "ts": answer.ts, "thread_ts": answer.thread_ts, "text": answer.text,
                        "blocks": answer.blocks, "bot_id": "BBOT", "user": BOT_USER_ID},
            "response_url": self.fake.response_url,
            "actions": [{"type": "feedback_buttons", "action_id": element["action_id"], "block_id": "fb",
                         "value": button["value"], "action_ts": str(time.time())}],
        }
        status, _ = await self.post_raw(urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded")
        return status


def finished(message: Message) -> bool:
    """An answer is finished when it shows feedback buttons, or when it is an apology."""
    return any(b.get("type") == "context_actions" for b in message.blocks) or "error id" in message.visible_text


async def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def answer_in(fake: FakeSlackAPI, channel: str, thread_ts: str | None, timeout: float = 30.0) -> Message:
    """Wait for the bot's finished answer in a thread and return it (the last finished message there)."""
    def done() -> Message | None:
        found = [m for m in fake.thread(channel, thread_ts) if finished(m)]
        return found[-1] if found else None

    return await wait_for(done, timeout, f"an answer in {channel}/{thread_ts}")


async def settle(seconds: float = 0.4) -> None:
    """Let any (wrongly) duplicated work show itself before asserting there was none."""
    await asyncio.sleep(seconds)
