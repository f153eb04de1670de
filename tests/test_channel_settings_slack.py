"""Channel settings through the real slack-bolt app against the fake Slack Web API: `/kb channel sources|auto|mode
|show`, help-channel auto-answers (silent on a decline), `/kb gaps`, and non-admins refused."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from conftest import create_database, write
from conftest import test_settings as kb_settings
from fakes.slack_api import FakeSlackAPI
from slack_harness import answer_in, mention, message, new_ts, running_bot, settle

from bot.chat.channels import channel_settings
from bot.chat.state import BotState
from db.settings import DatabaseSettings
from knowledge.kb import KnowledgeBase
from knowledge.sources.folder import FolderSource

BOB, ADMIN = "UBOB", "UADMIN"
VACATION = "How many vacation days do full-time employees get?"
UNANSWERABLE = "What is the airspeed velocity of an unladen swallow?"


@pytest_asyncio.fixture(scope="module")
async def two_sources_kb(server_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[KnowledgeBase]:
    root = tmp_path_factory.mktemp("channel-docs")
    write(root / "hr", "vacation.md", "# Vacation policy\n\nFull-time employees get 25 days of paid vacation per "
                                      "year. Up to 5 unused vacation days carry over into the next year.\n")
    write(root / "it", "vpn.md", "# VPN setup\n\nInstall the WireGuard client and import the configuration file "
                                 "from the IT portal. The VPN is required to reach internal dashboards from home.\n")
    url = create_database(server_url, f"chan_{int(time.time() * 1000) % 10**9}", template_db)
    kb = await KnowledgeBase.open(kb_settings(), DatabaseSettings(_env_file=None, database_url=url))  # type: ignore[call-arg]
    for name in ("hr", "it"):
        assert not (await kb.sync(FolderSource(root / name, name))).failed
    yield kb
    await kb.close()


@pytest.fixture
def fake() -> Any:
    with FakeSlackAPI() as fake:
        fake.add_user(BOB, email="bob@example.com")
        fake.add_user(ADMIN, email="root@example.com", is_admin=True)
        yield fake


def channel_id() -> str:
    return f"C{new_ts().replace('.', '')[-9:]}"


async def test_a_non_admin_cannot_change_or_see_channel_settings(two_sources_kb, fake) -> None:
    channel = channel_id()
    async with running_bot(two_sources_kb, fake) as slack:
        for words in ("channel sources add it", "channel auto on", "channel mode private", "channel show", "gaps"):
            status, reply = await slack.slash(words, user=BOB, channel=channel)
            assert status == 200 and "needs an admin" in reply["text"], words
            assert reply["response_type"] == "ephemeral"
    settings = await channel_settings(two_sources_kb, f"slack:T1:{channel}")
    assert (settings.sources, settings.auto, settings.mode) == (None, False, "public")


async def test_channel_sources_limit_answers_to_those_sources_in_that_channel_only(two_sources_kb, fake) -> None:
    channel, other = channel_id(), channel_id()
    async with running_bot(two_sources_kb, fake) as slack:
        _, reply = await slack.slash("channel sources add nosuch", user=ADMIN, channel=channel)
        assert "Unknown source `nosuch`" in reply["text"]
        _, reply = await slack.slash("channel sources add it", user=ADMIN, channel=channel)
        assert "only from `it`" in reply["text"]
        _, shown = await slack.slash("channel show", user=ADMIN, channel=channel)
        assert "Sources: `it`" in shown["text"] and "Auto-answer: off" in shown["text"]

        event = mention(VACATION, user=BOB, channel=channel)
        await slack.send_event(event)
        limited = await answer_in(fake, channel, event["ts"])
        event = mention(VACATION, user=BOB, channel=other)
        await slack.send_event(event)
        unlimited = await answer_in(fake, other, event["ts"])
        assert "25 days" in unlimited.visible_text
        assert "25 days" not in limited.visible_text and "vacation.md" not in limited.visible_text

        _, reply = await slack.slash("channel sources remove it", user=ADMIN, channel=channel)
        assert "every source" in reply["text"]
        event = mention(VACATION, user=BOB, channel=channel)
        await slack.send_event(event)
        assert "25 days" in (await answer_in(fake, channel, event["ts"])).visible_text


async def test_auto_answers_top_level_questions_only_and_stays_silent_on_a_decline(two_sources_kb, fake) -> None:
    channel, quiet = channel_id(), channel_id()
    async with running_bot(two_sources_kb, fake) as slack:
        _, reply = await slack.slash("channel auto on", user=ADMIN, channel=channel)
        assert "Auto-answer is on" in reply["text"]
        # Not configured: the same question is left alone.
        await slack.send_event(message(VACATION, user=BOB, channel=quiet, channel_type="channel"))
        # Not questions, thread chatter, bots and edits: ignored.
        ignored = [
            message("Good morning everyone, the coffee machine is fixed.", user=BOB, channel=channel,
                    channel_type="channel"),
            message("thanks?", user=BOB, channel=channel, channel_type="channel"),
            message(VACATION, user=BOB, channel=channel, channel_type="channel", thread_ts=new_ts()),
            message(VACATION, user=BOB, channel=channel, channel_type="channel", bot_id="B999"),
            message(VACATION, user=BOB, channel=channel, channel_type="channel", subtype="message_changed"),
        ]
        for event in ignored:
            await slack.send_event(event)
        # A question the documents cannot answer: nothing is posted.
        await slack.send_event(message(UNANSWERABLE, user=BOB, channel=channel, channel_type="group"))
        await settle(1.5)
        assert fake.calls_to("chat.postMessage") == [] and fake.calls_to("chat.update") == []

        # A real question: answered once in a thread under it, even when Slack delivers it twice.
        question = message(VACATION, user=BOB, channel=channel, channel_type="channel")
        await slack.send_event(question)
        await slack.send_event(question, headers={"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"})
        answer = await answer_in(fake, channel, question["ts"])
        await settle()
    assert "25 days" in answer.visible_text
    posted = fake.calls_to("chat.postMessage")
    assert len(posted) == 1 and posted[0].args["thread_ts"] == question["ts"]  # no placeholder, no apology
    assert "Searching" not in posted[0].args["text"]
    # The declined question is still a gap, kept out of "conversations the bot is in".
    state = BotState(two_sources_kb.engine)
    gaps = [g for g in await state.gap_questions(since=__import__("datetime").datetime(2000, 1, 1))
            if g.question == UNANSWERABLE]
    assert len(gaps) == 1 and gaps[0].posted is False and gaps[0].outcome == "decline"
    assert not await state.bot_answered_in(gaps[0].conversation_id)


async def test_mode_is_stored_shown_and_read_by_the_flow(two_sources_kb, fake) -> None:
    channel = channel_id()
    async with running_bot(two_sources_kb, fake) as slack:
        _, reply = await slack.slash("channel mode private", user=ADMIN, channel=channel)
        assert "private" in reply["text"]
        _, shown = await slack.slash("channel show", user=ADMIN, channel=channel)
        _, bad = await slack.slash("channel mode secret", user=ADMIN, channel=channel)
        adapter = slack.app.adapters[0]
        read = await adapter.flow.channel_settings(f"slack:T1:{channel}")
    assert "Mode: private" in shown["text"] and "Usage" in bad["text"]
    assert read.mode == "private"


async def test_kb_gaps_shows_an_admin_the_declined_questions_by_topic(two_sources_kb, fake) -> None:
    channel = channel_id()
    fake.add_channel(channel, private=False, members=[BOB, ADMIN])  # a public channel: any member may read it
    async with running_bot(two_sources_kb, fake) as slack:
        for _ in range(2):
            event = mention("What is the airspeed velocity of a swallow carrying a coconut?", user=BOB,
                            channel=channel)
            await slack.send_event(event)
            await answer_in(fake, channel, event["ts"])
        _, reply = await slack.slash("gaps", user=ADMIN, channel=channel)
    assert "Gaps, last 30 days" in reply["text"] and "swallow" in reply["text"]
    assert reply["response_type"] == "ephemeral"
