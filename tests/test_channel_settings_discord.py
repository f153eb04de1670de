"""Channel settings through the real discord.py client (CommandTree, on_message) against the fake Discord API:
`/kb channel sources|auto|mode|show`, help-channel auto-answers in a thread (no thread at all on a decline),
`/kb gaps`, and members refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest_asyncio
from conftest import write
from fakes.discord_api import FakeDiscordAPI
from fakes.discord_gateway import MANAGE_GUILD, MEMBER_PERMISSIONS, DiscordHarness

from bot.discord.adapter import RagbotDiscord, configure_api_url
from bot.server import BotMetrics
from bot.settings import BotSettings
from knowledge.sources.folder import FolderSource

GUILD = 800000000000000001
HELP = 800000000000000010
OTHER = 800000000000000011
ALICE = 800000000000000100
ADMIN = 800000000000000300
ADMIN_PERMS = MEMBER_PERMISSIONS | MANAGE_GUILD
VACATION = "How many vacation days do full-time employees get?"


def option(name: str, value: Any) -> dict[str, Any]:
    return {"type": 3, "name": name, "value": value}


@pytest_asyncio.fixture
async def bot(kb_factory, tmp_path: Path, discord_api: FakeDiscordAPI):
    write(tmp_path / "hr", "vacation.md", "# Vacation policy\n\nFull-time employees get 25 days of paid vacation "
                                          "per year. Up to 5 unused vacation days carry over into the next year.\n")
    write(tmp_path / "it", "vpn.md", "# VPN setup\n\nInstall the WireGuard client and import the configuration "
                                     "file from the IT portal. The VPN is required to reach internal dashboards.\n")
    kb = await kb_factory()
    for name in ("hr", "it"):
        assert not (await kb.sync(FolderSource(tmp_path / name, name))).failed
    settings = BotSettings(_env_file=None, discord_bot_token=discord_api.token,  # type: ignore[call-arg]
                           discord_api_url=discord_api.base_url, discord_guild_id=GUILD,
                           discord_edit_interval_seconds=0.0)
    configure_api_url(settings.discord_api_url)
    client = RagbotDiscord(kb, settings, BotMetrics())
    await client.login(discord_api.token)
    harness = DiscordHarness(client, discord_api)
    harness.guild_create(GUILD, [HELP, OTHER])
    yield kb, harness
    await client.close()


def reply_text(discord_api: FakeDiscordAPI, payload: dict[str, Any]) -> str:
    calls = [c for c in discord_api.calls if payload["token"] in c.path]
    texts = [(c.body.get("data") or {}).get("content") or c.body.get("content") or "" for c in calls if c.body]
    return "\n".join(texts)


async def test_members_are_refused_and_nothing_changes(bot, discord_api) -> None:
    kb, harness = bot
    for name, options in (("kb channel sources", [option("action", "add"), option("source", "it")]),
                          ("kb channel auto", [option("state", "on")]), ("kb channel show", []), ("kb gaps", [])):
        sent = await harness.slash(name, options, guild_id=GUILD, channel_id=HELP, user_id=ALICE)
        assert "needs an admin" in reply_text(discord_api, sent), name
    settings = await harness.client.flow.channel_settings(f"discord:{GUILD}:{HELP}")
    assert (settings.sources, settings.auto) == (None, False)


async def test_sources_limit_answers_in_that_channel(bot, discord_api) -> None:
    kb, harness = bot
    sent = await harness.slash("kb channel sources", [option("action", "add"), option("source", "it")],
                               guild_id=GUILD, channel_id=HELP, user_id=ADMIN, permissions=ADMIN_PERMS)
    assert "only from `it`" in reply_text(discord_api, sent)
    shown = await harness.slash("kb channel show", guild_id=GUILD, channel_id=HELP, user_id=ADMIN,
                                permissions=ADMIN_PERMS)
    assert "Sources: `it`" in reply_text(discord_api, shown)
    limited = await harness.message(VACATION, mention_bot=True, channel_id=HELP, guild_id=GUILD, author_id=ALICE)
    unlimited = await harness.message(VACATION, mention_bot=True, channel_id=OTHER, guild_id=GUILD, author_id=ALICE)
    [in_help] = discord_api.bot_messages(int(limited["id"]))
    [in_other] = discord_api.bot_messages(int(unlimited["id"]))
    assert "25 days" in in_other["content"]
    assert "25 days" not in in_help["content"]


async def test_auto_answers_questions_in_a_thread_and_stays_silent_otherwise(bot, discord_api) -> None:
    kb, harness = bot
    sent = await harness.slash("kb channel auto", [option("state", "on")], guild_id=GUILD, channel_id=HELP,
                               user_id=ADMIN, permissions=ADMIN_PERMS)
    assert "Auto-answer is on" in reply_text(discord_api, sent)
    mode = await harness.slash("kb channel mode", [option("mode", "private")], guild_id=GUILD, channel_id=HELP,
                               user_id=ADMIN, permissions=ADMIN_PERMS)
    assert "private" in reply_text(discord_api, mode)
    before = len(discord_api.bot_messages(HELP))  # the ephemeral command replies

    await harness.message("Lunch is in the kitchen today, enjoy.", channel_id=HELP, guild_id=GUILD, author_id=ALICE)
    await harness.message("What is the airspeed velocity of an unladen swallow?", channel_id=HELP, guild_id=GUILD,
                          author_id=ALICE)
    await harness.message(VACATION, channel_id=OTHER, guild_id=GUILD, author_id=ALICE)  # auto is off there
    assert discord_api.calls_to("POST", "/threads") == []  # no thread opened for a decline or chatter
    assert len(discord_api.bot_messages(HELP)) == before and discord_api.bot_messages(OTHER) == []

    question = await harness.message(VACATION, channel_id=HELP, guild_id=GUILD, author_id=ALICE)
    harness.state.parse_message_create(dict(question))  # a replayed gateway event: still one answer
    await harness.settle()
    [create] = discord_api.calls_to("POST", f"/channels/{HELP}/messages/{question['id']}/threads")
    [answer] = discord_api.bot_messages(int(question["id"]))
    assert "25 days" in answer["content"]
    settings = await harness.client.flow.channel_settings(f"discord:{GUILD}:{HELP}")
    assert settings.auto and settings.mode == "private"


async def test_kb_gaps_lists_a_declined_question_for_an_admin(bot, discord_api) -> None:
    kb, harness = bot
    await harness.message("What is the airspeed velocity of an unladen swallow?", mention_bot=True, channel_id=HELP,
                          guild_id=GUILD, author_id=ALICE)
    sent = await harness.slash("kb gaps", guild_id=GUILD, channel_id=HELP, user_id=ADMIN, permissions=ADMIN_PERMS)
    text = reply_text(discord_api, sent)
    assert "Gaps, last 30 days" in text and "swallow" in text
