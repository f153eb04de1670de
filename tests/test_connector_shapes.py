"""The chat platforms' paging and rate-limit shapes, through the real client libraries against the fakes (issue 29).

Each fake serves the vendor's documented shapes (see the docstrings of tests/fakes/slack_api.py and
discord_api.py); these tests page through at least three pages at the fake's smallest page size, so a fake or a
client that stopped after one page, or read the cursor from the wrong field, fails here.
"""

from __future__ import annotations

import time

import aiohttp
import discord
import pytest
from fakes.discord_api import FakeDiscordAPI
from fakes.slack_api import FakeSlackAPI
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient


@pytest.fixture
def slack():
    with FakeSlackAPI() as fake:
        fake.page_size = 2
        for n in range(5):
            fake.add_user(f"U{n}", email=f"u{n}@example.com")
        yield fake


def client_for(fake: FakeSlackAPI) -> AsyncWebClient:
    return AsyncWebClient(token="xoxb-test", base_url=fake.api_url,
                          retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=2)])


async def test_slack_cursor_paging_of_users_members_and_thread_replies(slack):
    client = client_for(slack)
    users = [m["id"] async for page in await client.users_list(limit=2) for m in page["members"]]
    assert users == [f"U{n}" for n in range(5)] and len(slack.calls_to("users.list")) == 3
    assert [c.args.get("cursor") for c in slack.calls_to("users.list")][1:] == ["dXNlcjpV_2", "dXNlcjpV_4"]

    slack.members["C1"] = [f"U{n}" for n in range(5)]
    members = [m async for page in await client.conversations_members(channel="C1", limit=2) for m in page["members"]]
    assert members == slack.members["C1"] and len(slack.calls_to("conversations.members")) == 3

    parent = slack.add_message("C1", "the question", user="U0")
    for n in range(4):
        slack.add_message("C1", f"reply {n}", user="U1", thread_ts=parent)
    # slack_sdk's response iterates by re-filling itself: copy each page's data.
    pages = [dict(page.data) async for page in await client.conversations_replies(channel="C1", ts=parent, limit=2)]
    assert [p["has_more"] for p in pages] == [True, True, False]
    assert pages[-1]["response_metadata"]["next_cursor"] == ""
    assert [m["text"] for p in pages for m in p["messages"]] == ["the question"] + [f"reply {n}" for n in range(4)]


async def test_slack_users_info_is_a_get_with_a_query_string_and_ratelimited_is_retried(slack):
    client = client_for(slack)
    slack.rate_limit("users.info", retry_after=1)
    started = time.monotonic()
    response = await client.users_info(user="U3")
    assert response["user"]["profile"]["email"] == "u3@example.com"
    assert time.monotonic() - started >= 1.0  # Retry-After was honoured by the retry handler
    calls = slack.calls_to("users.info")
    assert len(calls) == 2 and all(c.args == {"user": "U3"} for c in calls)  # from the query string of a GET


@pytest.mark.parametrize("is_global", [False, True])
async def test_discord_429_with_retry_after_and_the_global_flag_is_waited_out_and_retried(is_global):
    previous = discord.http.Route.BASE
    async with FakeDiscordAPI() as fake:
        discord.http.Route.BASE = fake.base_url
        fake.add_channel(4242, None)
        http = discord.http.HTTPClient(aiohttp.TCPConnector(limit=4))
        try:
            await http.static_login(fake.token)
            fake.rate_limit_next("POST", "/channels/4242/messages", retry_after=0.3, is_global=is_global)
            started = time.monotonic()
            await http.send_message(4242, params=discord.http.handle_message_parameters(content="hello"))
            assert time.monotonic() - started >= 0.3
        finally:
            await http.close()
            discord.http.Route.BASE = previous
        posts = [c for c in fake.calls if c.method == "POST" and c.path == "/channels/4242/messages"]
        assert len(posts) == 2 and [m["content"] for m in fake.messages[4242]] == ["hello"]
