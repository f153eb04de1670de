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
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import EntryPoint
from typing import Any

import pytest
import test_answer_lease as lease_tests
import test_chat_permissions as perms
from conftest import write
from fakes.discord_api import FakeDiscordAPI, user_payload
from fakes.discord_gateway import MANAGE_GUILD, MEMBER_PERMISSIONS, message_payload
from fakes.slack_api import TEAM_ID, FakeSlackAPI
from fakes.teams_connector import Member as TeamsUser
from fakes.teams_harness import ask_in_channel, finished, new_id, running_teams_bot
from fakes.teams_harness import reachable_connector as teams_connector
from slack_harness import answer_in, mention, running_bot, wait_for
from slack_harness import finished as finished_slack

import bot.platforms as registry
from bot.app import configured_adapters
from bot.chat.channels import set_auto, set_mode, set_sources
from bot.chat.feedback import THANKS
from bot.chat.state import BotState
from bot.context import BotContext
from bot.platforms import PlatformSpec
from bot.settings import BotSettings, known_settings
from knowledge import InvalidPrincipal, check_as_principal
from knowledge.sources.folder import FolderSource

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


# ---- moved into the core: the empty-question hint, /kb, Share, thread history --------------------------------------
# Each was written once per adapter and had drifted (Discord's hint, its own admin refusal, Teams had no Share, the
# adapters kept different thread messages as history); each is now decided in bot/chat and pinned here per platform.


def _slack_world(fake: FakeSlackAPI) -> str:
    for user_id, email, _, _ in perms.PEOPLE.values():
        fake.add_user(user_id, email=email)
    fake.add_user("UADMIN", email="root@example.com", is_admin=True)
    channel = perms.new_channel("C")
    fake.add_channel(channel, private=False, members=["UFIN", "UOUT", "UADMIN"])
    return channel


async def slack_empty_mention(kb: Any, _discord: FakeDiscordAPI) -> str:
    with FakeSlackAPI() as fake:
        channel = _slack_world(fake)
        event = mention("", user="UOUT", channel=channel)
        async with running_bot(kb, fake) as bot:
            assert await bot.send_event(event) == 200
            [hint] = await wait_for(lambda: fake.thread(channel, event["ts"]), what="the hint")
        return hint.visible_text


async def discord_empty_mention(kb: Any, fake: FakeDiscordAPI) -> str:
    channel = 820000000000000301
    bot, harness = await perms.start_discord(kb, fake, {channel: None})
    try:
        await harness.message("", mention_bot=True, channel_id=channel, guild_id=perms.GUILD,
                              author_id=perms.PEOPLE["out"][2])
    finally:
        await bot.close()
    return "\n".join(m.get("content") or "" for m in fake.bot_messages(channel))


async def teams_empty_mention(kb: Any, _discord: FakeDiscordAPI) -> str:
    ann = TeamsUser("aad-ann", "Ann Lee", email="ann@example.com")
    with teams_connector() as fake:
        channel = new_id("general")
        fake.add_conversation(channel, "channel", members=[ann], team_id=new_id("team"), channel_type="standard")
        async with running_teams_bot(kb, fake) as bot:
            sent = await ask_in_channel(fake, bot, channel, ann, "")
            [hint] = await fake.wait_for(timeout=30, condition=lambda: fake.thread(channel, sent["id"]))
        return hint.text


EMPTY_MENTIONS: dict[str, Callable[[Any, FakeDiscordAPI], Awaitable[str]]] = {
    "slack": slack_empty_mention, "discord": discord_empty_mention, "teams": teams_empty_mention,
}


@pytest.mark.parametrize("platform", sorted(EMPTY_MENTIONS))
async def test_a_mention_without_a_question_gets_the_same_hint_on_every_platform(
        platform, kb_factory, tmp_path, discord_api) -> None:
    kb = await perms.open_world(kb_factory, tmp_path)
    shown = await EMPTY_MENTIONS[platform](kb, discord_api)
    assert "Ask me a question about your documents" in shown and "How many vacation days do I get?" in shown


REFUSAL = "needs an admin (an admin or owner of this workspace, server or team, or a user listed in ADMIN_USER_IDS)"


async def slack_kb_status(kb: Any, _discord: FakeDiscordAPI) -> tuple[str, str, str]:
    """`/kb status` by a member, by a workspace admin and by a user listed in ADMIN_USER_IDS."""
    with FakeSlackAPI() as fake:
        channel = _slack_world(fake)
        async with running_bot(kb, fake, admin_user_ids="slack:UFIN") as bot:
            replies = [(await bot.slash("status", user=user, channel=channel))[1]["text"]
                       for user in ("UOUT", "UADMIN", "UFIN")]
        return replies[0], replies[1], replies[2]


async def discord_kb_status(kb: Any, fake: FakeDiscordAPI) -> tuple[str, str, str]:
    channel = 820000000000000302
    bot, harness = await perms.start_discord(kb, fake, {channel: None},
                                             admin_user_ids=f"discord:{perms.PEOPLE['fin'][2]}")
    replies = []
    try:
        for user, permissions in ((perms.PEOPLE["out"][2], MEMBER_PERMISSIONS),
                                  (perms.PEOPLE["cfo"][2], MEMBER_PERMISSIONS | MANAGE_GUILD),
                                  (perms.PEOPLE["fin"][2], MEMBER_PERMISSIONS)):
            ran = await harness.slash("kb status", guild_id=perms.GUILD, channel_id=channel, user_id=user,
                                      permissions=permissions)
            replies.append("\n".join(m.get("content") or "" for m in fake.interaction_messages(ran["token"])))
    finally:
        await bot.close()
    return replies[0], replies[1], replies[2]


async def teams_kb_status(kb: Any, _discord: FakeDiscordAPI) -> tuple[str, str, str]:
    """A group chat has no team, so no owner (team owners are admins in their team's channels, found through
    Microsoft Graph: tests/test_teams.py): the member and the listed admin; the middle case is a member of the
    group chat asking there (a targeted reply)."""
    out = TeamsUser("aad-out", "Out Sider", email="out@example.com")
    fin = TeamsUser("aad-fin", "Fin Ance", email="fin@example.com")
    with teams_connector() as fake:
        chat = f"19:chat-{new_id('x')[3:13]}@thread.v2"
        fake.add_conversation(chat, "groupChat", members=[out, fin])
        async with running_teams_bot(kb, fake, admin_user_ids=f"teams:{fin.aad_object_id}") as bot:
            texts = []
            for user in (out, fin):
                before = len(fake.bot_messages(chat))
                assert (await fake.deliver(bot.url, fake.group_message("<at>ragbot</at> kb status", chat, user)))[0] \
                    == 202
                [reply] = await fake.wait_for(timeout=30, condition=lambda n=before: fake.bot_messages(chat)[n:])
                assert reply.seen_by(user.id) and not reply.seen_by((fin if user is out else out).id)
                texts.append(reply.text)
        return texts[0], texts[1], texts[1]


KB_STATUS: dict[str, Callable[[Any, FakeDiscordAPI], Awaitable[tuple[str, str, str]]]] = {
    "slack": slack_kb_status, "discord": discord_kb_status, "teams": teams_kb_status,
}


@pytest.mark.parametrize("platform", sorted(KB_STATUS))
async def test_kb_status_is_refused_to_a_member_in_the_same_words_and_runs_for_admins(
        platform, kb_factory, tmp_path, discord_api) -> None:
    kb = await perms.open_world(kb_factory, tmp_path)
    member, platform_admin, listed = await KB_STATUS[platform](kb, discord_api)
    assert REFUSAL in member and "documents," not in member
    for shown in (platform_admin, listed):
        assert "documents," in shown and "needs an admin" not in shown  # "**Index**: N documents, M chunks"


async def slack_share(kb: Any, _discord: FakeDiscordAPI) -> tuple[str, str]:
    """Fin asks privately in a public channel; Out's click on Share is refused, Fin's posts the answer publicly.
    Returns the private answer's text and the public one's."""
    with FakeSlackAPI() as fake:
        channel = _slack_world(fake)
        event = mention(f"privately, {QUESTION}", user="UFIN", channel=channel)
        async with running_bot(kb, fake) as bot:
            assert await bot.send_event(event) == 200
            [private] = await wait_for(lambda: perms.ephemeral_done(fake, "UFIN", channel), what="the private answer")
            share = next(e for b in private.blocks if b.get("type") == "actions" for e in b["elements"])
            assert share["text"]["text"] == "Share in channel"
            assert await perms.click(bot, private, share, user="UOUT") == 200
            assert await perms.click(bot, private, share, user="UFIN") == 200
            [public] = await wait_for(lambda: [m for m in fake.thread(channel, event["ts"]) if finished_slack(m)],
                                      what="the shared answer")
        return private.visible_text, public.visible_text


async def discord_share(kb: Any, fake: FakeDiscordAPI) -> tuple[str, str]:
    channel = 820000000000000303
    fin, out = perms.PEOPLE["fin"][2], perms.PEOPLE["out"][2]
    bot, harness = await perms.start_discord(kb, fake, {channel: None})
    try:
        ask = await harness.slash("ask", [{"type": 3, "name": "question", "value": QUESTION},
                                          {"type": 5, "name": "private", "value": True}],
                                  guild_id=perms.GUILD, channel_id=channel, user_id=fin)
        [private] = fake.interaction_messages(ask["token"])
        share = next(c for row in private["components"] for c in row["components"]
                     if c["custom_id"].startswith("ragbot:share:"))
        assert share["label"] == "Share in channel"
        await harness.click(private, share["custom_id"], guild_id=perms.GUILD, channel_id=channel, user_id=out)
        clicked = await harness.click(private, share["custom_id"], guild_id=perms.GUILD, channel_id=channel,
                                      user_id=fin)
        public = [m for m in fake.interaction_messages(clicked["token"]) if not m["flags"] & 64]
    finally:
        await bot.close()
    assert private["flags"] & 64 and public
    return private.get("content") or "", "\n".join(m.get("content") or "" for m in public)


async def teams_share(kb: Any, _discord: FakeDiscordAPI) -> tuple[str, str]:
    """Teams: the private answer is a targeted message whose card holds Share (Action.Submit); the click comes back
    as a message activity with the card's data."""
    fin = TeamsUser("aad-fin", "Fin Ance", email=perms.PEOPLE["fin"][1])
    out = TeamsUser("aad-out", "Out Sider", email=perms.PEOPLE["out"][1])
    with teams_connector() as fake:
        channel = new_id("general")
        fake.add_conversation(channel, "channel", members=[fin, out], team_id=new_id("team"), channel_type="standard")
        async with running_teams_bot(kb, fake) as bot:
            question = await ask_in_channel(fake, bot, channel, fin, f"privately {QUESTION}")
            [private] = await fake.wait_for(timeout=90, condition=lambda: [
                m for m in fake.thread(channel, question["id"]) if finished(m)])
            assert private.seen_by(fin.id) and not private.seen_by(out.id)
            [action] = [a for attachment in private.activity.get("attachments") or []
                        for a in (attachment.get("content") or {}).get("actions") or []]
            assert action["type"] == "Action.Submit" and action["title"] == "Share in channel"
            thread = f"{channel};messageid={question['id']}"
            for user in (out, fin):
                status, _ = await fake.deliver(bot.url, fake.card_submit(private.id, thread, user, action["data"]))
                assert status == 202
                await bot.adapter.platform.drain(timeout=120)
            refused = [m for m in fake.thread(channel, question["id"]) if m.visible_to == out.id]
            assert refused and "Only the person who asked" in refused[0].text
            public = [m for m in fake.thread(channel, question["id"]) if finished(m) and m.visible_to is None]
        return private.text, "\n".join(m.text for m in public)


SHARES: dict[str, Callable[[Any, FakeDiscordAPI], Awaitable[tuple[str, str]]]] = {
    "slack": slack_share, "discord": discord_share, "teams": teams_share,
}


@pytest.mark.parametrize("platform", sorted(SHARES))
async def test_share_under_a_private_answer_posts_it_publicly_for_everyone(
        platform, kb_factory, tmp_path, discord_api) -> None:
    kb = await perms.open_world(kb_factory, tmp_path)
    private, public = await SHARES[platform](kb, discord_api)
    assert SECRET in private and "Only you can see this answer" in private  # the asker's own access, and said so
    assert public.strip()  # answered again for the channel...
    assert SECRET not in public and "Only you can see" not in public  # ...from what everyone there may see


class RecordsHistory:
    """The real knowledge base, recording the earlier thread messages each question is answered with."""

    def __init__(self, kb: Any) -> None:
        self._kb = kb
        self.histories: list[list[tuple[str, str]] | None] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kb, name)

    async def answer(self, *args: Any, **kwargs: Any) -> Any:
        prior = kwargs.get("prior_messages")
        self.histories.append([(m.role, m.text) for m in prior] if prior else None)
        return await self._kb.answer(*args, **kwargs)


THREAD = [("person", "We are planning the offsite at the lake next spring."),
          ("bot", "The offsite is planned for May at the lake [1]."),
          ("other bot", "Build #42 passed on main."),
          ("person", "Who books the rooms?")]
# What every platform counts as the conversation: people's messages and the bot's own answers, in order; another
# bot's post is not part of it.
EXPECTED_HISTORY = [("user", THREAD[0][1]), ("assistant", THREAD[1][1]), ("user", THREAD[3][1])]


async def slack_thread_history(kb: RecordsHistory, _discord: FakeDiscordAPI) -> None:
    with FakeSlackAPI() as fake:
        channel = _slack_world(fake)
        root = fake.add_message(channel, THREAD[0][1], user="UOUT")  # the thread's first message is its root
        for who, text in THREAD[1:]:
            fake.add_message(channel, text, user="UOUT" if who == "person" else None, thread_ts=root, bot=who == "bot")
            if who == "other bot":
                fake.messages[-1].bot_id = "BOTHER"  # another app's post (a message with a bot_id)
        event = mention("and when is it?", user="UOUT", channel=channel, thread_ts=root,
                        ts=f"{int(time.time()) + 5}.000001")
        async with running_bot(kb, fake) as bot:
            assert await bot.send_event(event) == 200
            await answer_in(fake, channel, root)


async def discord_thread_history(kb: RecordsHistory, fake: FakeDiscordAPI) -> None:
    channel = 820000000000000304
    out = perms.PEOPLE["out"][2]
    bot, harness = await perms.start_discord(kb, fake, {channel: None})
    try:
        thread = fake.user_thread(perms.GUILD, channel, owner_id=out)
        harness.sync_threads()
        for who, text in THREAD:
            payload = message_payload(fake, text, channel_id=thread, guild_id=perms.GUILD, author_id=out)
            if who == "bot":
                payload["author"] = fake.bot_user
            elif who == "other bot":
                payload["author"] = user_payload(830000000000000999, "ci-bot", bot=True)
            fake.record_user_message(payload)  # already in the thread: the bot never received them
        await harness.message("and when is it?", mention_bot=True, channel_id=thread, guild_id=perms.GUILD,
                              author_id=out)
    finally:
        await bot.close()


THREAD_HISTORIES: dict[str, Callable[[RecordsHistory, FakeDiscordAPI], Awaitable[None]]] = {
    "slack": slack_thread_history, "discord": discord_thread_history,
    # Teams: the Bot Connector cannot read a thread's earlier messages back (Microsoft Graph could), so a mention
    # mid-thread there has only the core's memory of the thread (docs/teams.md, "Follow-ups").
}


@pytest.mark.parametrize("platform", sorted(THREAD_HISTORIES))
async def test_a_mention_mid_thread_counts_the_earlier_messages_the_same_way_everywhere(
        platform, kb_factory, tmp_path, discord_api) -> None:
    kb = RecordsHistory(await perms.open_world(kb_factory, tmp_path))
    await THREAD_HISTORIES[platform](kb, discord_api)
    assert kb.histories == [EXPECTED_HISTORY]


# ---- feedback is acknowledged in the same words everywhere; Teams answers help channels as the others do --------

PUBLIC_QUESTION = "How many days of paid vacation do full-time employees get?"  # a document everyone may see


async def slack_feedback_ack(kb: Any, _discord: FakeDiscordAPI) -> str:
    with FakeSlackAPI() as fake:
        channel = _slack_world(fake)
        event = mention(PUBLIC_QUESTION, user="UOUT", channel=channel)
        async with running_bot(kb, fake) as bot:
            assert await bot.send_event(event) == 200
            answer = await answer_in(fake, channel, event["ts"])
            assert await bot.click_feedback(answer, user="UOUT", positive=False) == 200
            [ack] = await wait_for(lambda: fake.ephemeral_for("UOUT", channel), what="the acknowledgement")
        return ack.visible_text


async def discord_feedback_ack(kb: Any, fake: FakeDiscordAPI) -> str:
    channel, out = 820000000000000305, perms.PEOPLE["out"][2]
    bot, harness = await perms.start_discord(kb, fake, {channel: None})
    try:
        sent = await harness.message(PUBLIC_QUESTION, mention_bot=True, channel_id=channel, guild_id=perms.GUILD,
                                     author_id=out)
        thread = int(sent["id"])
        [answer] = fake.bot_messages(thread)
        [down] = [c["custom_id"] for row in answer.get("components") or [] for c in row["components"]
                  if c["custom_id"].endswith(":down")]
        clicked = await harness.click(answer, down, guild_id=perms.GUILD, channel_id=thread, user_id=out)
    finally:
        await bot.close()
    return "\n".join(m.get("content") or "" for m in fake.interaction_messages(clicked["token"]))


async def teams_feedback_ack(kb: Any, _discord: FakeDiscordAPI) -> str:
    out = TeamsUser("aad-out", "Out Sider", email=perms.PEOPLE["out"][1])
    with teams_connector() as fake:
        async with running_teams_bot(kb, fake) as bot:
            conversation = f"a:personal-{out.aad_object_id}"
            assert (await fake.deliver(bot.url, fake.personal_message(PUBLIC_QUESTION, out)))[0] == 202
            [answer] = await fake.wait_for(timeout=90, condition=lambda: [
                m for m in fake.bot_messages(conversation) if finished(m)])
            await bot.adapter.platform.drain()
            status, _ = await fake.deliver(bot.url, fake.feedback_invoke(answer.id, conversation, out, "dislike"))
            assert status == 200
            later = [m for m in fake.bot_messages(conversation) if m.id != answer.id]
        return "\n".join(m.text for m in later)


FEEDBACK_ACKS: dict[str, Callable[[Any, FakeDiscordAPI], Awaitable[str]]] = {
    "slack": slack_feedback_ack, "discord": discord_feedback_ack, "teams": teams_feedback_ack,
}


@pytest.mark.parametrize("platform", sorted(FEEDBACK_ACKS))
async def test_a_thumbs_down_is_acknowledged_to_the_clicker_in_the_same_words_everywhere(
        platform, kb_factory, tmp_path, discord_api) -> None:
    kb = await perms.open_world(kb_factory, tmp_path)
    shown = await FEEDBACK_ACKS[platform](kb, discord_api)
    assert THANKS["down"] in shown
    [stored] = await BotState(kb.engine).recent_feedback()
    assert (stored.platform, stored.rating) == (platform, "down")


async def test_a_teams_help_channel_answers_unaddressed_questions_in_their_thread_and_leaves_chatter_alone(
        kb_factory, tmp_path) -> None:
    kb = await perms.open_world(kb_factory, tmp_path)
    ann = TeamsUser("aad-ann", "Ann Lee", email="ann@example.com")
    with teams_connector() as fake:
        channel = new_id("help")
        fake.add_conversation(channel, "channel", members=[ann], team_id=new_id("team"), channel_type="standard")
        await set_auto(BotState(kb.engine), f"teams:{fake.tenant_id}:{channel}", True, "test")
        async with running_teams_bot(kb, fake) as bot:
            chatter = fake.channel_message("thanks all, see you at the offsite", channel, ann, mention=False)
            question = fake.channel_message(PUBLIC_QUESTION, channel, ann, mention=False)
            for activity in (chatter, question):
                assert (await fake.deliver(bot.url, activity))[0] == 202
            await bot.adapter.platform.drain(timeout=120)
            [answer] = [m for m in fake.thread(channel, question["id"]) if finished(m)]
            assert "25 days" in answer.text
            assert fake.thread(channel, chatter["id"]) == []  # not a question: nothing posted


async def test_each_question_reads_its_channel_settings_once_and_answers_by_what_its_own_decision_read(
        kb_factory, tmp_path) -> None:
    """Two questions in one channel, the second asked after an admin changed the channel's mode and sources while the
    first was between its privacy decision and its answer: each is answered by the settings its own decision read
    (the first publicly from every source, the second privately from `it` only), and each read them once. Before,
    the settings went from the decision to the answer through a per-channel cache: the second decision replaced the
    first's there, the first answer read them again (a third read) and so answered from `it` only."""
    for source, name, content in (("hr", "vacation.md", "# Vacation policy\n\nFull-time employees get 25 days of "
                                                        "paid vacation per year.\n"),
                                  ("it", "vpn.md", "# VPN setup\n\nInstall the WireGuard client and import the "
                                                   "configuration file from the IT portal.\n")):
        write(tmp_path / source, name, content)
    kb = await kb_factory()
    for source in ("hr", "it"):
        assert not (await kb.sync(FolderSource(tmp_path / source, source))).failed
    with FakeSlackAPI() as fake:
        fake.add_user("UANN", email="ann@example.com")
        channel = perms.new_channel("C")
        fake.add_channel(channel, private=False, members=["UANN"])
        key = f"slack:{TEAM_ID}:{channel}"
        async with running_bot(kb, fake) as bot:
            flow = bot.app.adapters[0].flow
            read_settings, answer = flow.channel_settings, flow.answer
            reads: list[str | None] = []
            decided, resume = asyncio.Event(), asyncio.Event()

            async def counted(channel_key: str | None) -> Any:
                reads.append(channel_key)
                return await read_settings(channel_key)

            async def first_waits(*args: Any, **kwargs: Any) -> Any:  # the first question pauses after its decision
                if not decided.is_set():
                    decided.set()
                    await resume.wait()
                return await answer(*args, **kwargs)

            flow.channel_settings, flow.answer = counted, first_waits  # on this instance only
            first = mention(PUBLIC_QUESTION, user="UANN", channel=channel)
            assert await bot.send_event(first) == 200
            await asyncio.wait_for(decided.wait(), 30)
            state = BotState(kb.engine)
            await set_mode(state, key, "private", "test")
            await set_sources(state, key, ["it"], "test")
            second = mention(PUBLIC_QUESTION, user="UANN", channel=channel)
            assert await bot.send_event(second) == 200
            [private] = await wait_for(lambda: perms.ephemeral_done(fake, "UANN", channel), what="the private answer")
            resume.set()
            public = await answer_in(fake, channel, first["ts"])
    assert "25 days" in public.visible_text  # the first question's settings: public, every source
    assert "25 days" not in private.visible_text  # the second's: private, `it` only
    assert reads == [key, key]  # one read per question
