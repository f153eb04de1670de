"""The chat core's behaviour, tested once for every platform (issue 42): each case is written against the core's
promise and run through each platform's real adapter and its fake (Slack: slack-bolt over signed HTTP against
tests/fakes/slack_api.py; Discord: discord.py against tests/fakes/discord_api.py and the gateway harness; Teams:
the Microsoft 365 Agents SDK against the signed fake Bot Connector, tests/fakes/teams_connector.py), with real
Postgres. A new platform joins these tests by adding its side to `SIDES` and `ANSWERS`.

- A decline shows the closest documents the asker may see (bot.chat.render.answer_view decides; each adapter only
  renders). Before, Slack dropped them while Discord and the terminal showed them.
- Crash resume rebuilds the question in the core from its stored target, so a resumed answer has the SAME readers
  as the live one. Before, Discord's resume answered a restricted channel from `everyone` + grants while its live
  path used what the channel's members may all see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from importlib.metadata import EntryPoint
from typing import Any

import pytest
import test_answer_lease as lease_tests
import test_chat_permissions as perms
from fakes.discord_api import FakeDiscordAPI
from fakes.slack_api import FakeSlackAPI
from fakes.teams_connector import Member as TeamsUser
from fakes.teams_harness import ask_in_channel, finished, new_id, running_teams_bot
from fakes.teams_harness import reachable_connector as teams_connector
from slack_harness import answer_in, mention, running_bot

import bot.platforms as registry
from bot.app import configured_adapters
from bot.context import BotContext
from bot.platforms import PlatformSpec
from bot.settings import BotSettings, known_settings
from knowledge import InvalidPrincipal, check_as_principal

QUESTION, SECRET = perms.DOCUMENTS["group"]  # a document only group:docs/finance (∋ fin@example.com) may see


async def slack_crash_and_resume(kb: Any, _discord: FakeDiscordAPI) -> str:
    """Fin asks in a private channel whose only member is Fin; the process dies mid-answer; a new process's sweeper
    answers it. Returns the text of the answer in the thread."""
    with FakeSlackAPI() as fake:
        for user_id, email, _, _ in perms.PEOPLE.values():
            fake.add_user(user_id, email=email)
        channel = perms.new_channel("G")
        fake.add_channel(channel, private=True, members=["UFIN"])
        event = mention(QUESTION, user="UFIN", channel=channel)
        crashing = lease_tests.CrashesMidAnswer(kb)
        async with running_bot(crashing, fake, answer_lease_seconds=0.3, answer_sweep_seconds=0) as dead:
            assert await dead.send_event(event) == 200
            await asyncio.wait_for(crashing.crashed.wait(), 30)
        await asyncio.sleep(0.4)  # the dead holder's lease runs out
        async with running_bot(kb, fake, answer_sweep_seconds=0) as restarted:
            adapter = restarted.app.adapters[0]
            assert await adapter.flow.sweep(adapter.resume) == 1
            answer = await answer_in(fake, channel, event["ts"])
        return answer.visible_text


async def discord_crash_and_resume(kb: Any, fake: FakeDiscordAPI) -> str:
    """The same on Discord: a channel hidden from @everyone and visible to one role, which only Fin holds."""
    fin = perms.PEOPLE["fin"][2]
    channel, role = 820000000000000101, 830000000000000101
    fake.add_member(perms.GUILD, fin, [role])
    crashing = lease_tests.CrashesMidAnswer(kb)
    dead, harness = await perms.start_discord(crashing, fake, {channel: role}, answer_lease_seconds=0.3,
                                              answer_sweep_seconds=0)
    try:
        sent = await harness.message(QUESTION, mention_bot=True, channel_id=channel, guild_id=perms.GUILD,
                                     author_id=fin, roles=[role])
        await asyncio.wait_for(crashing.crashed.wait(), 30)
    finally:
        await dead.close()
    await asyncio.sleep(0.4)
    restarted, _ = await perms.start_discord(kb, fake, {channel: role}, answer_sweep_seconds=0)
    try:
        assert await restarted.flow.sweep(restarted.resume) == 1
    finally:
        await restarted.close()
    thread = int(sent["id"])  # answered in the thread started from the question
    return "\n".join((m.get("content") or "") + " ".join(e.get("description") or "" for e in m.get("embeds") or [])
                     for m in fake.bot_messages(thread))


async def teams_crash_and_resume(kb: Any, _discord: FakeDiscordAPI) -> str:
    """The same on Teams: a private channel whose only member is Fin (the roster gives fin@'s email)."""
    fin = TeamsUser("aad-fin", "Fin Ance", email=perms.PEOPLE["fin"][1])
    with teams_connector() as fake:
        channel = new_id("private")
        fake.add_conversation(channel, "channel", members=[fin], team_id=new_id("team"), channel_type="private")
        crashing = lease_tests.CrashesMidAnswer(kb)
        async with running_teams_bot(crashing, fake, answer_lease_seconds=0.3) as dead:
            question = await ask_in_channel(fake, dead, channel, fin, QUESTION)
            await asyncio.wait_for(crashing.crashed.wait(), 30)
        await asyncio.sleep(0.4)
        async with running_teams_bot(kb, fake) as restarted:  # a new process: it has seen no conversation yet
            assert await restarted.adapter.flow.sweep(restarted.adapter.resume) == 1
            await restarted.adapter.platform.drain()
        return "\n".join(m.text for m in fake.thread(channel, question["id"]) if finished(m))


SIDES: dict[str, Callable[[Any, FakeDiscordAPI], Awaitable[str]]] = {
    "slack": slack_crash_and_resume,
    "discord": discord_crash_and_resume,
    "teams": teams_crash_and_resume,
}


@pytest.mark.parametrize("platform", sorted(SIDES))
async def test_a_resumed_answer_in_a_restricted_channel_reads_what_its_members_may_see(
        platform, kb_factory, tmp_path, discord_api) -> None:
    kb = await perms.open_world(kb_factory, tmp_path)
    text = await SIDES[platform](kb, discord_api)
    # The live path answers this channel from its members' common access (test_chat_permissions); so must the
    # answer a new process finishes after a crash.
    assert SECRET in text


# ---- what an answer shows ------------------------------------------------------------------------------------------

DECLINED = "Who won the 2024 internal hackathon?"  # the handbook does not say: declined, with related documents


async def slack_answer(kb: Any, _discord: FakeDiscordAPI, question: str) -> str:
    """Ann mentions the bot in a public channel; the text of the finished answer in its thread."""
    with FakeSlackAPI() as fake:
        fake.add_user("UANN", email="ann@example.com")
        channel = perms.new_channel("C")
        fake.add_channel(channel, private=False, members=["UANN"])
        event = mention(question, user="UANN", channel=channel)
        async with running_bot(kb, fake) as bot:
            assert await bot.send_event(event) == 200
            answer = await answer_in(fake, channel, event["ts"])
        return answer.visible_text


async def discord_answer(kb: Any, fake: FakeDiscordAPI, question: str) -> str:
    """The same on Discord: a mention in a channel @everyone may view, answered in a thread (embeds included)."""
    channel = 820000000000000201
    bot, harness = await perms.start_discord(kb, fake, {channel: None})
    try:
        sent = await harness.message(question, mention_bot=True, channel_id=channel, guild_id=perms.GUILD,
                                     author_id=perms.PEOPLE["out"][2])
    finally:
        await bot.close()
    return "\n".join("\n".join([m.get("content") or "", *(f"{e.get('title') or ''}\n{e.get('description') or ''}"
                                                         for e in m.get("embeds") or [])])
                     for m in fake.bot_messages(int(sent["id"])))


async def teams_answer(kb: Any, _discord: FakeDiscordAPI, question: str) -> str:
    """The same on Teams: a mention in a standard channel, answered in its reply thread."""
    ann = TeamsUser("aad-ann", "Ann Lee", email="ann@example.com")
    with teams_connector() as fake:
        channel = new_id("general")
        fake.add_conversation(channel, "channel", members=[ann], team_id=new_id("team"), channel_type="standard")
        async with running_teams_bot(kb, fake) as bot:
            sent = await ask_in_channel(fake, bot, channel, ann, question)
            [answer] = await fake.wait_for(
                timeout=90, condition=lambda: [m for m in fake.thread(channel, sent["id"]) if finished(m)])
        return answer.text


ANSWERS: dict[str, Callable[[Any, FakeDiscordAPI, str], Awaitable[str]]] = {
    "slack": slack_answer,
    "discord": discord_answer,
    "teams": teams_answer,
}


@pytest.mark.parametrize("platform", sorted(ANSWERS))
async def test_a_decline_shows_the_closest_documents_on_every_platform(platform, handbook_kb, discord_api) -> None:
    expected = await handbook_kb.answer(DECLINED, ["everyone"], "t:expected")
    assert expected.abstained and expected.related  # the premise (test_first_run pins it too)
    shown = await ANSWERS[platform](handbook_kb, discord_api, DECLINED)
    assert "couldn't find" in shown  # declined...
    assert "Closest documents" in shown  # ...with the documents nearest to the question
    assert (expected.related[0].title or expected.related[0].path) in shown


# ---- the registry: a platform is one package (or a third-party distribution's entry point) ------------------------


class _ThirdParty:
    """An adapter a third-party distribution would ship."""

    name = "mattermost"

    def __init__(self, context: Any) -> None:
        self.context = context


THIRD_PARTY = PlatformSpec("mattermost", None, lambda settings: True, _ThirdParty, title="Mattermost")


def test_the_built_in_platforms_register_themselves_and_name_the_chat_identity_kinds() -> None:
    assert [spec.name for spec in registry.platforms()][:3] == ["slack", "discord", "teams"]
    settings = BotSettings(_env_file=None, slack_bot_token="xoxb-1", DISCORD_TOKEN="d")  # type: ignore[call-arg]
    assert settings.chat_platforms == ["slack", "discord"]  # Teams: no TEAMS_APP_ID
    assert BotSettings(_env_file=None).chat_platforms == []  # type: ignore[call-arg]
    assert {"SLACK_BOT_TOKEN", "DISCORD_TOKEN", "TEAMS_APP_ID"} <= known_settings()
    assert check_as_principal("slack:U1") == "slack:U1" and check_as_principal("discord:42") == "discord:42"
    with pytest.raises(InvalidPrincipal) as refused:
        check_as_principal("grp:eng")
    assert "slack:<id>, discord:<id>, teams:<id>" in str(refused.value)


def test_a_third_party_platform_found_through_its_entry_point_is_started_and_asked_as(monkeypatch) -> None:
    entry = EntryPoint("mattermost", f"{__name__}:THIRD_PARTY", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [entry] if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(registry, "_discovered", False)
    monkeypatch.setattr(registry, "_registry", {})
    assert registry.platform("mattermost") is THIRD_PARTY
    assert "Mattermost" in registry.display_names()
    settings = BotSettings(_env_file=None)  # type: ignore[call-arg]
    assert settings.chat_platforms == ["mattermost"]
    [adapter] = configured_adapters(BotContext(None, settings, None, None))  # type: ignore[arg-type]
    assert isinstance(adapter, _ThirdParty)
    assert check_as_principal("mattermost:u1") == "mattermost:u1"
    with pytest.raises(KeyError, match="no chat platform named 'irc'"):
        registry.platform("irc")
