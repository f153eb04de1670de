"""Who sees what in chat (issue 33, the chat half): one resolver for askers, channel audiences from real membership,
private (ephemeral) answers with "Share in channel", `/kb access`, and the ACL leak suite across every surface
(issue 38: with a Confluence group and a Google group of the same name, each granting only its own source's pages).

The real slack-bolt app and discord.py client against the fakes in tests/fakes/ (Slack: conversations.info,
conversations.members paged, chat.postEphemeral, member_joined_channel/member_left_channel; Discord: List Guild
Members paged by `after`, role permission overwrites), real Postgres, the real embedding model, extractive answers.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import discord
import pytest
from conftest import write
from fakes.confluence_api import FakeConfluence
from fakes.discord_api import FakeDiscordAPI
from fakes.discord_gateway import MANAGE_GUILD, MEMBER_PERMISSIONS, DiscordHarness, guild_payload
from fakes.drive_api import FakeDrive
from fakes.slack_api import FakeSlackAPI, Message
from slack_harness import finished, mention, message, running_bot, wait_for
from sqlalchemy import text
from test_groups import drive, private_key_pem  # noqa: F401  (fixtures: the fake Drive with its Directory API)

from bot.chat.state import BotState
from bot.discord.adapter import RagbotDiscord, configure_api_url
from bot.server import BotMetrics
from bot.settings import BotSettings
from knowledge.sources.folder import FolderSource
from knowledge.storage import directory as directory_store

VIEW_CHANNEL = 1 << 10

CORPUS = {
    "policies/vacation.md": "# Vacation policy\n\nFull-time employees get 25 days of paid vacation per year.\n",
    "board/.access": "user:cfo@example.com\n",  # a user principal
    "board/acquisition.md": "# Project Bluebird\n\nThe board approved the acquisition of Contoso for 40 million "
                            "dollars. The Contoso acquisition closes in March.\n",
    "finance/.access": "group:docs/finance\n",  # a group of a synced directory (the `docs` one, set up below)
    "finance/budget.md": "# Budget 2027\n\nThe marketing budget for 2027 is 4.2 million euros, approved by the "
                         "board in October.\n",
    "legal/.access": "user:confluence:lena\n",  # reachable only through an admin mapping
    "legal/lawsuit.md": "# Umbrella lawsuit\n\nThe Umbrella lawsuit settles out of court; the settlement amount "
                        "is confidential until the hearing.\n",
}

# kind -> (question, the words only its readers may see)
DOCUMENTS = {
    "user": ("Which company is the board acquiring in Project Bluebird?", "Contoso"),
    "group": ("What is the marketing budget for 2027?", "4.2 million"),
    "mapped": ("How does the Umbrella lawsuit settle?", "settles out of court"),
    # Issue 38: a Confluence group and a Google group both named finance@example.com, with different members.
    "wiki-group": ("How much does the treasury keep in reserve?", "12 million"),
    "drive-group": ("Which bank will run payroll from May?", "Northwind Bank"),
}
# person -> (Slack user id, email, Discord user id, the documents they may see)
PEOPLE = {
    "cfo": ("UCFO", "CFO@Example.com", 800000000000000001, {"user"}),  # emails compare case-insensitively
    # in group:docs/finance, and in the Google group finance@example.com
    "fin": ("UFIN", "fin@example.com", 800000000000000002, {"group", "drive-group"}),
    "lena": ("ULENA", "lena@example.com", 800000000000000003, {"mapped"}),  # mapped to user:confluence:lena
    "out": ("UOUT", "out@example.com", 800000000000000004, set()),
    "wfin": ("UWFIN", "wfin@example.com", 800000000000000005, {"wiki-group"}),  # in Confluence's finance@example.com
}
GUILD = 810000000000000001
_channels = itertools.count(1)


def may_see(members: tuple[str, ...], kind: str) -> bool:
    return all(kind in PEOPLE[m][3] for m in members)


def same_named_groups(wiki: FakeConfluence, gdrive: FakeDrive) -> str:
    """Confluence's group finance@example.com ∋ wfin@ may read the FIN space; Google's finance@example.com ∋ fin@
    is shared the payroll file. Returns the Drive folder."""
    wiki.add_user("wfin", "Wfin", "wfin@example.com")
    wiki.set_group_members("finance@example.com", ["wfin"])
    wiki.add_space("FIN", "Finance", readers=[("group", "finance@example.com")])
    wiki.add_page("FIN", "Treasury", "<p>The treasury keeps 12 million in reserve for the next two years.</p>")
    gdrive.directory.add_group("finance@example.com", ["fin@example.com"])
    root = gdrive.add_folder("Finance")
    gdrive.add_doc("Payroll bank", root, html="<p>From May, payroll is run by Northwind Bank instead of Contoso "
                                              "Bank.</p>", permissions=[gdrive.group("finance@example.com")])
    return root


async def open_world(kb_factory: Any, tmp_path: Path, gdrive: FakeDrive | None = None,
                     monkeypatch: pytest.MonkeyPatch | None = None) -> Any:
    """The corpus indexed, group:docs/finance ∋ fin@ in the source's directory, Lena's chat identities mapped. With
    `gdrive`: also a Confluence site and a Google Drive, synced with their groups (issue 38's same-named groups)."""
    docs = tmp_path / "docs"
    for relative, content in CORPUS.items():
        write(docs, relative, content)
    kb = await kb_factory()
    report = await kb.sync(FolderSource(docs, "docs"))
    assert not report.failed, report.failed
    async with kb.engine.begin() as conn:
        source_id = (await conn.execute(text("SELECT id FROM sources WHERE name = 'docs'"))).scalar_one()
        await directory_store.replace_membership(conn, source_id, [("group:docs/finance", "user:fin@example.com")])
    if gdrive is not None and monkeypatch is not None:
        monkeypatch.setenv("CONFLUENCE_API_TOKEN", "good-token")
        with FakeConfluence(edition="cloud") as wiki:
            root = same_named_groups(wiki, gdrive)
            await kb.add_source("wiki", "confluence", {"url": wiki.base_url, "spaces": ["FIN"], "email": wiki.email})
            await kb.sync_source("wiki")
            await kb.refresh_groups("wiki")
        await kb.add_source("drive", "gdrive", {"folders": [root], "admin_email": "admin@example.com"})
        await kb.sync_source("drive")
        await kb.refresh_groups("drive")
    kb.access.invalidate()
    await BotState(kb.engine).map_identity("slack:ULENA", "user:confluence:lena")
    for name in ("cfo", "fin", "wfin"):  # Discord has no email: an admin maps people to theirs
        await BotState(kb.engine).map_identity(f"discord:{PEOPLE[name][2]}", f"user:{PEOPLE[name][1]}")
    await BotState(kb.engine).map_identity(f"discord:{PEOPLE['lena'][2]}", "user:confluence:lena")
    return kb


@pytest.fixture
def slack() -> Any:
    with FakeSlackAPI() as fake:
        for user_id, email, _, _ in PEOPLE.values():
            fake.add_user(user_id, email=email)
        fake.add_user("UADMIN", email="root@example.com", is_admin=True)
        fake.add_user("UAPP", is_bot=True)  # an integration in a channel: not a member for the audience
        yield fake


def new_channel(prefix: str = "C") -> str:
    return f"{prefix}{next(_channels):08d}"


def answer_text(fake: FakeSlackAPI, channel: str, thread_ts: str | None) -> str:
    return "\n".join(m.visible_text for m in fake.thread(channel, thread_ts))


async def slack_answer(fake: FakeSlackAPI, bot: Any, channel: str, question: str, user: str) -> str:
    event = mention(question, user=user, channel=channel)
    await bot.send_event(event)
    await wait_for(lambda: [m for m in fake.thread(channel, event["ts"]) if finished(m)], what="an answer")
    return answer_text(fake, channel, event["ts"])


def ephemeral_done(fake: FakeSlackAPI, user: str, channel: str) -> list[Message]:
    return [m for m in fake.ephemeral_for(user, channel) if finished(m)]


# --- Slack: private channels answer from what every member may see ----------------------------------------------


async def test_slack_private_channel_uses_the_members_intersection_and_follows_joins_and_leaves(
    kb_factory, tmp_path, slack
):
    kb = await open_world(kb_factory, tmp_path)
    question, secret = DOCUMENTS["group"]
    slack.page_size = 1  # conversations.members one member per page: next_cursor must be followed
    channel = new_channel("C")
    slack.add_channel(channel, private=True, members=["UFIN", "UAPP"])
    async with running_bot(kb, slack, channel_audience_ttl=3600) as bot:
        assert secret in await slack_answer(slack, bot, channel, question, "UFIN")  # fin alone (+ an app): yes
        assert len(slack.calls_to("conversations.members")) == 3  # bot, UFIN, UAPP: one page each

        # The outsider joins: member_joined_channel narrows the audience at once (the TTL is an hour).
        slack.members[channel].append("UOUT")
        await bot.send_event({"type": "member_joined_channel", "user": "UOUT", "channel": channel,
                              "channel_type": "C", "team": "T1", "inviter": "UFIN"})
        assert secret not in await slack_answer(slack, bot, channel, question, "UFIN")

        # He leaves: member_left_channel; the channel answers from fin's documents again.
        slack.members[channel].remove("UOUT")
        await bot.send_event({"type": "member_left_channel", "user": "UOUT", "channel": channel,
                              "channel_type": "C", "team": "T1"})
        assert secret in await slack_answer(slack, bot, channel, question, "UFIN")

        # A public channel with the same single member stays `everyone` + grants.
        public = new_channel("C")
        slack.add_channel(public, private=False, members=["UFIN"])
        assert secret not in await slack_answer(slack, bot, public, question, "UFIN")


async def test_slack_member_list_expires_after_the_ttl_without_an_event(kb_factory, tmp_path, slack):
    kb = await open_world(kb_factory, tmp_path)
    question, secret = DOCUMENTS["group"]
    channel = new_channel("C")
    slack.add_channel(channel, private=True, members=["UFIN"])
    async with running_bot(kb, slack, channel_audience_ttl=0.5) as bot:
        assert secret in await slack_answer(slack, bot, channel, question, "UFIN")
        slack.members[channel].append("UOUT")  # no event delivered
        await asyncio.sleep(0.7)
        assert secret not in await slack_answer(slack, bot, channel, question, "UFIN")


async def test_slack_uncomputable_audience_falls_back_to_everyone_and_grants_never_the_asker(
    kb_factory, tmp_path, slack
):
    kb = await open_world(kb_factory, tmp_path)
    question, secret = DOCUMENTS["group"]
    async with running_bot(kb, slack, channel_audience_max_members=2) as bot:
        # An API error listing the members.
        broken = new_channel("C")
        slack.add_channel(broken, private=True, members=["UFIN"])
        slack.refuse("conversations.members", "missing_scope")
        assert secret not in await slack_answer(slack, bot, broken, question, "UFIN")
        # Too many members (all of whom may see it): still everyone + grants.
        crowded = new_channel("C")
        slack.add_channel(crowded, private=True, members=["UFIN", "UCFO", "ULENA"])
        assert secret not in await slack_answer(slack, bot, crowded, question, "UFIN")
        # The channel's grants still apply in the fallback.
        await BotState(kb.engine).grant_channel(f"slack:T1:{crowded}", "group:docs/finance")
        assert secret in await slack_answer(slack, bot, crowded, question, "UCFO")


# --- Slack: private answers and "Share in channel" --------------------------------------------------------------


async def test_slack_private_answer_uses_the_askers_access_and_share_re_answers_for_the_channel(
    kb_factory, tmp_path, slack
):
    kb = await open_world(kb_factory, tmp_path)
    question, secret = DOCUMENTS["group"]
    channel = new_channel("C")
    slack.add_channel(channel, private=False, members=["UFIN", "UOUT"])
    async with running_bot(kb, slack) as bot:
        event = mention(f"privately, {question}", user="UFIN", channel=channel)
        await bot.send_event(event)
        [private] = await wait_for(lambda: ephemeral_done(slack, "UFIN", channel), what="the private answer")
        assert secret in private.visible_text and private.thread_ts == event["ts"]
        assert not slack.thread(channel, event["ts"])  # nothing public was posted
        assert not slack.ephemeral_for("UOUT")
        [(call)] = slack.calls_to("chat.postEphemeral")
        assert call.args["user"] == "UFIN"

        # Share in channel: the question answered again for the channel (everyone): the private text is not reposted.
        share = next(e for b in private.blocks if b.get("type") == "actions" for e in b["elements"])
        assert share["text"]["text"] == "Share in channel"
        status = await click(bot, private, share, user="UFIN")
        assert status == 200
        [public] = await wait_for(lambda: [m for m in slack.thread(channel, event["ts"]) if finished(m)],
                                  what="the shared answer")
        assert secret not in public.visible_text
        # Someone else's click, or a second click, shares nothing more.
        await click(bot, private, share, user="UOUT")
        await click(bot, private, share, user="UFIN")
        await asyncio.sleep(0.5)
        assert len([m for m in slack.thread(channel, event["ts"]) if finished(m)]) == 1

        # In a private channel whose members may all see it, the shared answer does carry it.
        inner = new_channel("C")
        slack.add_channel(inner, private=True, members=["UFIN"])
        event = mention(f"{question} privately", user="UFIN", channel=inner)
        await bot.send_event(event)
        [private] = await wait_for(lambda: ephemeral_done(slack, "UFIN", inner), what="the private answer")
        share = next(e for b in private.blocks if b.get("type") == "actions" for e in b["elements"])
        await click(bot, private, share, user="UFIN")
        [public] = await wait_for(lambda: [m for m in slack.thread(inner, event["ts"]) if finished(m)],
                                  what="the shared answer")
        assert secret in public.visible_text


async def click(bot: Any, message: Message, button: dict[str, Any], *, user: str) -> int:
    """A block_actions payload for a button on an ephemeral message (Slack "block_actions payloads":
    https://api.slack.com/reference/interaction-payloads/block-actions; container.is_ephemeral true)."""
    import json
    import time
    from urllib.parse import urlencode

    payload = {
        "type": "block_actions", "team": {"id": "T1", "domain": "acme"},
        "user": {"id": user, "username": user.lower(), "team_id": "T1"}, "api_app_id": "A1", "token": "legacy",
        "container": {"type": "message", "message_ts": message.ts, "channel_id": message.channel,
                      "is_ephemeral": True, "thread_ts": message.thread_ts},
        "trigger_id": "trig1", "channel": {"id": message.channel, "name": "general"},
        "response_url": bot.fake.response_url,
        "actions": [{"type": "button", "action_id": button["action_id"], "block_id": "ragbot_share",
                     "text": button["text"], "value": button["value"], "action_ts": str(time.time())}],
    }
    status, _ = await bot.post_raw(urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded")
    return status


# --- /kb access -------------------------------------------------------------------------------------------------


async def test_slack_kb_access_explains_a_person_to_admins_only(kb_factory, tmp_path, slack):
    kb = await open_world(kb_factory, tmp_path)
    await BotState(kb.engine).map_identity("slack:UADMIN", "group:docs/finance")  # the admin may see the budget
    async with running_bot(kb, slack) as bot:
        _, refused = await bot.slash("access <@UFIN|fin>", user="UOUT")
        assert "needs an admin" in refused["text"]
        _, reply = await bot.slash("access <@UFIN|fin> \"Budget 2027\"", user="UADMIN")
    shown = reply["text"]
    assert reply["response_type"] == "ephemeral"
    assert "group:docs/finance" in shown and "docs directory: user:fin@example.com ∈ group:docs/finance" in shown
    assert "May see" in shown and "Budget 2027" in shown


# --- Discord --------------------------------------------------------------------------------------------------------


def restricted_guild(channels: dict[int, int | None]) -> dict[str, Any]:
    """GUILD_CREATE (https://discord.com/developers/docs/resources/guild#guild-object) with a role per restricted
    channel; each restricted channel's permission overwrites (https://discord.com/developers/docs/resources/
    channel#overwrite-object: {id, type 0 role | 1 member, allow, deny}) deny VIEW_CHANNEL to @everyone and allow
    it to its role. channels: channel id -> its role id (None: open to @everyone)."""
    payload = guild_payload(GUILD, list(channels))
    payload["member_count"] = 50  # the gateway cache holds no members: the bot lists them over REST
    for channel in payload["channels"]:
        role = channels[int(channel["id"])]
        if role is None:
            continue
        payload["roles"].append({"id": str(role), "name": f"role-{role}", "permissions": "0", "position": 1,
                                 "color": 0, "hoist": False, "managed": False, "mentionable": False, "flags": 0})
        channel["permission_overwrites"] = [
            {"id": str(GUILD), "type": 0, "allow": "0", "deny": str(VIEW_CHANNEL)},
            {"id": str(role), "type": 0, "allow": str(VIEW_CHANNEL), "deny": "0"},
        ]
    return payload


async def start_discord(kb: Any, fake: FakeDiscordAPI, channels: dict[int, int | None],
                        **overrides: Any) -> tuple[RagbotDiscord, DiscordHarness]:
    settings = BotSettings(_env_file=None, **{  # type: ignore[call-arg]
        "discord_bot_token": fake.token, "discord_api_url": fake.base_url, "discord_guild_id": GUILD,
        "discord_edit_interval_seconds": 0.0, **overrides,
    })
    configure_api_url(settings.discord_api_url)
    bot = RagbotDiscord(kb, settings, BotMetrics())
    await bot.login(fake.token)
    harness = DiscordHarness(bot, fake)
    for channel in channels:
        fake.add_channel(channel, GUILD)
    harness.state.parse_guild_create(restricted_guild(channels))
    fake.add_member(GUILD, 900000000000000001, bot=True)  # the bot itself is a member
    return bot, harness


async def discord_mention(harness: DiscordHarness, fake: FakeDiscordAPI, channel: int, question: str,
                          user: int, roles: list[int] | None = None) -> str:
    sent = await harness.message(question, mention_bot=True, channel_id=channel, guild_id=GUILD, author_id=user,
                                 roles=roles)
    messages = fake.bot_messages(int(sent["id"]))  # answered in a thread started from the message
    return "\n".join((m.get("content") or "") + " ".join(e.get("description") or "" for e in m.get("embeds") or [])
                     for m in messages)


async def test_discord_restricted_channel_uses_its_role_members_intersection(kb_factory, tmp_path, discord_api):
    kb = await open_world(kb_factory, tmp_path)
    question, secret = DOCUMENTS["group"]
    fin, out = PEOPLE["fin"][2], PEOPLE["out"][2]
    channel, role = 820000000000000001, 830000000000000001
    bot, harness = await start_discord(kb, discord_api, {channel: role})
    try:
        discord_api.add_member(GUILD, fin, [role])
        discord_api.add_member(GUILD, out, [])  # in the server, but without the role: cannot see the channel
        assert secret in await discord_mention(harness, discord_api, channel, question, fin)
        listed = discord_api.calls_to("GET", f"/guilds/{GUILD}/members")
        assert listed and listed[0].query["limit"] == "1000"

        # The outsider gets the role: a member update (Server Members intent) narrows the channel at once.
        discord_api.add_member(GUILD, out, [role])
        await bot.on_member_update(_member(bot, out, []), _member(bot, out, [role]))  # GUILD_MEMBER_UPDATE
        assert secret not in await discord_mention(harness, discord_api, channel, question, fin)

        # Without the Server Members intent the member list is refused: everyone + grants, not the asker's access.
        discord_api.refuse_member_list = True
        bot.audiences.invalidate()
        discord_api.remove_member(GUILD, out)
        assert secret not in await discord_mention(harness, discord_api, channel, question, fin)
    finally:
        await bot.close()


def _member(bot: RagbotDiscord, user_id: int, roles: list[int]) -> discord.Member:
    guild = bot.get_guild(GUILD)
    assert guild is not None
    data = {"user": {"id": str(user_id), "username": "x", "discriminator": "0", "avatar": None},
            "roles": [str(r) for r in roles], "joined_at": None, "deaf": False, "mute": False, "flags": 0}
    return discord.Member(data=data, guild=guild, state=bot._connection)  # type: ignore[arg-type]


async def test_discord_private_ask_carries_the_askers_access_and_share_re_answers(kb_factory, tmp_path, discord_api):
    kb = await open_world(kb_factory, tmp_path)
    question, secret = DOCUMENTS["group"]
    fin, out = PEOPLE["fin"][2], PEOPLE["out"][2]
    channel = 820000000000000002
    bot, harness = await start_discord(kb, discord_api, {channel: None})
    try:
        ask = await harness.slash("ask", [{"type": 3, "name": "question", "value": question},
                                          {"type": 5, "name": "private", "value": True}],
                                  guild_id=GUILD, channel_id=channel, user_id=fin)
        [private] = discord_api.interaction_messages(ask["token"])
        assert secret in private["content"] and private["flags"] & 64  # ephemeral
        share = next(c for row in private["components"] for c in row["components"]
                     if c["custom_id"].startswith("ragbot:share:"))
        assert share["label"] == "Share in channel"
        refused = await harness.click(private, share["custom_id"], guild_id=GUILD, channel_id=channel, user_id=out)
        assert "Only the person who asked" in discord_api.interaction_messages(refused["token"])[0]["content"]
        clicked = await harness.click(private, share["custom_id"], guild_id=GUILD, channel_id=channel, user_id=fin)
        shared = discord_api.interaction_messages(clicked["token"])
        assert shared and not any(m["flags"] & 64 for m in shared)
        assert secret not in " ".join(m.get("content") or "" for m in shared)  # answered again for everyone

        # /kb access for admins.
        access = await harness.slash("kb access", [{"type": 6, "name": "user", "value": str(fin)}],
                                     guild_id=GUILD, channel_id=channel, user_id=700, permissions=MEMBER_PERMISSIONS
                                     | MANAGE_GUILD, resolved={"users": {str(fin): {
                                         "id": str(fin), "username": "fin", "discriminator": "0", "avatar": None}}})
        shown = " ".join(m.get("content") or "" for m in discord_api.interaction_messages(access["token"]))
        assert "group:docs/finance" in shown and f"admin mapping of discord:{fin}" in shown
    finally:
        await bot.close()


# --- the ACL suite: every principal kind, every surface, 0 leaks -------------------------------------------------

SURFACES = ["cli", "slack_dm", "slack_private_channel", "slack_ephemeral", "discord"]


def cli_answer(question: str, person: str) -> str:
    from test_cli import ok_json

    _, email, _, _ = PEOPLE[person]
    result = ok_json("ask", question, "--as", f"user:{email}", "--as", f"slack:{PEOPLE[person][0]}")
    return str(result.get("answer", "")) + " " + " ".join(str(c) for c in result.get("citations", []))


@pytest.mark.parametrize("surface", SURFACES)
async def test_no_document_reaches_anyone_who_may_not_see_it(surface, kb_factory, fresh_database, tmp_path,
                                                            monkeypatch, slack, discord_api, drive):  # noqa: F811
    """For every principal kind (user, group via a synced directory, admin-mapped, and a Confluence group and a
    Google group of the same name) and every person: the document's words reach exactly the audiences that may see
    it. Leaks (shown to an audience that may not see it) must be 0; misses (withheld from one that may) too, so the
    test cannot pass by answering nothing."""
    url = fresh_database()
    kb = await open_world(lambda: kb_factory(url), tmp_path, drive, monkeypatch)
    # Audiences: each person alone, and each reader together with the outsider (a private channel of two), asked
    # about the reader's own documents (what neither may see alone, the pair cannot see either: the singles cover it).
    audiences: list[tuple[str, ...]] = [(p,) for p in PEOPLE]
    if surface in ("slack_private_channel", "discord"):
        audiences += [(p, "out") for p in ("cfo", "fin", "lena", "wfin")]

    def kinds_for(members: tuple[str, ...]) -> list[str]:
        return list(DOCUMENTS) if len(members) == 1 else [k for k in DOCUMENTS if k in PEOPLE[members[0]][3]]
    leaks: list[str] = []
    misses: list[str] = []

    async def check(members: tuple[str, ...], kind: str, shown: str) -> None:
        question, secret = DOCUMENTS[kind]
        visible = secret in shown
        if visible and not may_see(members, kind):
            leaks.append(f"{surface}: {kind} document shown to {members}")
        if not visible and may_see(members, kind):
            misses.append(f"{surface}: {kind} document withheld from {members}")

    if surface == "cli":
        monkeypatch.setenv("DATABASE_URL", url)
        for (person,), kind in itertools.product(audiences, DOCUMENTS):
            await check((person,), kind, await asyncio.to_thread(cli_answer, DOCUMENTS[kind][0], person))
    elif surface == "discord":
        channels = {820000000000001000 + i: 830000000000001000 + i for i in range(len(audiences))}
        bot, harness = await start_discord(kb, discord_api, channels)
        try:
            for (channel, role), members in zip(channels.items(), audiences, strict=False):  # noqa: B007 (the name documents the tuple's shape)
                for member in members:
                    discord_api.add_member(GUILD, PEOPLE[member][2], [role, *_roles_of(discord_api, member)])
            for (channel, _), members in zip(channels.items(), audiences, strict=False):
                for kind in kinds_for(members):
                    question = DOCUMENTS[kind][0]
                    await check(members, kind, await discord_mention(harness, discord_api, channel, question,
                                                                     PEOPLE[members[0]][2]))
                    if len(members) == 1:  # and the same person in a DM
                        dm = 840000000000000000 + channel % 1000 * 10 + list(DOCUMENTS).index(kind)
                        discord_api.add_channel(dm, None)
                        await harness.message(question, channel_id=dm, guild_id=None,
                                              author_id=PEOPLE[members[0]][2])
                        await check(members, kind, " ".join(m["content"] for m in discord_api.bot_messages(dm)))
        finally:
            await bot.close()
    else:
        async with running_bot(kb, slack) as bot:
            for members in audiences:
                users = [PEOPLE[m][0] for m in members]
                asker = users[0]
                for kind in kinds_for(members):
                    question = DOCUMENTS[kind][0]
                    if surface == "slack_dm":
                        channel = new_channel("D")
                        event = message(question, user=asker, channel=channel, channel_type="im")
                        await bot.send_event(event)
                        await wait_for(lambda: [m for m in slack.thread(channel, None) if finished(m)])  # noqa: B023 (the closure runs within this iteration)
                        shown = answer_text(slack, channel, None)
                    elif surface == "slack_private_channel":
                        channel = new_channel("C")
                        slack.add_channel(channel, private=True, members=users)
                        shown = await slack_answer(slack, bot, channel, question, asker)
                    else:  # an ephemeral answer in a public channel: only the asker reads it
                        channel = new_channel("C")
                        slack.add_channel(channel, private=False, members=[p[0] for p in PEOPLE.values()])
                        event = mention(f"privately {question}", user=asker, channel=channel)
                        await bot.send_event(event)
                        done = await wait_for(lambda: ephemeral_done(slack, asker, channel))  # noqa: B023 (the closure runs within this iteration)
                        shown = "\n".join(m.visible_text for m in done)
                        public = answer_text(slack, channel, event["ts"])
                        if DOCUMENTS[kind][1] in public:
                            leaks.append(f"{surface}: {kind} document posted publicly for {members}")
                    await check(members, kind, shown)
    assert leaks == [], leaks
    assert misses == [], misses


def _roles_of(fake: FakeDiscordAPI, person: str) -> list[int]:
    user_id = PEOPLE[person][2]
    for member in fake.guild_members.get(GUILD, []):
        if int(member["user"]["id"]) == user_id:
            return [int(r) for r in member["roles"]]
    return []


# --- issue 38: admin look-ups, the trust model for mappings, guests, gaps, share ------------------------------------


async def test_slack_kb_access_names_only_documents_the_admin_may_see_and_never_enumerates(
    kb_factory, tmp_path, slack
):
    kb = await open_world(kb_factory, tmp_path)
    async with running_bot(kb, slack) as bot:
        # LIKE wildcards are taken literally: `%`, `_` and `\` name no document.
        for wildcard in ("%", "_", "%_%", "\\"):
            _, reply = await bot.slash(f"access <@UFIN|fin> {wildcard}", user="UADMIN")
            assert "May" not in reply["text"] and "No document you may see matches" in reply["text"], wildcard
        # A title the admin may not see themselves is never named, by title, part of it or id.
        for ref in ('"Budget 2027"', "Budget", "finance/budget.md", "Bluebird"):
            _, reply = await bot.slash(f"access <@UFIN|fin> {ref}", user="UADMIN")
            shown = reply["text"].replace(f"`{ref.strip(chr(34))}`", "")  # the reference echoed back
            assert "No document you may see matches" in shown, ref
            for named in ("Budget 2027", "Bluebird", "budget.md", "acquisition"):
                assert named not in shown, (ref, named)
        # A document shared with everyone is explained as before.
        _, reply = await bot.slash("access <@UFIN|fin> Vacation", user="UADMIN")
        assert "*May see* Vacation policy" in reply["text"]


async def test_slack_platform_admin_maps_only_principals_they_hold_and_every_change_is_audited(
    kb_factory, tmp_path, slack, monkeypatch
):
    kb = await open_world(kb_factory, tmp_path)
    question, secret = DOCUMENTS["group"]
    slack.add_user("UOPS", email="ops@example.com")  # an operator: listed in ADMIN_USER_IDS
    async with running_bot(kb, slack, admin_user_ids="slack:UOPS") as bot:
        # A workspace admin maps themselves to a group they are not in: refused, and nothing changes.
        _, reply = await bot.slash("users map slack:UADMIN group:finance", user="UADMIN")
        assert "Only an operator" in reply["text"]
        _, reply = await bot.slash("users map slack:UOUT group:finance", user="UADMIN")
        assert "Only an operator" in reply["text"]
        channel = new_channel("D")
        await bot.send_event(message(question, user="UADMIN", channel=channel, channel_type="im"))
        await wait_for(lambda: [m for m in slack.thread(channel, None) if finished(m)], what="the DM answer")
        assert secret not in answer_text(slack, channel, None)
        # ... nor can they grant it to a channel they read.
        private = new_channel("C")
        slack.add_channel(private, private=True, members=["UADMIN"])
        _, reply = await bot.slash("channel-access add group:finance", user="UADMIN", channel=private)
        assert "Only an operator" in reply["text"]
        assert await BotState(kb.engine).channel_principals(f"slack:T1:{private}") == []
        # A principal they hold themselves they may hand out (here their own email).
        _, reply = await bot.slash("users map slack:UOUT user:root@example.com", user="UADMIN")
        assert "now also asks as" in reply["text"]
        # An operator may map anyone to anything.
        _, reply = await bot.slash("users map slack:UOUT group:finance", user="UOPS")
        assert "now also asks as `group:finance`" in reply["text"]
    assert await BotState(kb.engine).identity_principals("slack:UADMIN") == []

    # `ragbot audit` (the real CLI over the same database) shows every change and every refusal.
    from typer.testing import CliRunner

    from bot.cli.main import app as cli_app
    monkeypatch.setenv("DATABASE_URL", kb_database_url(kb))
    def cli(*args: str) -> Any:  # the CLI runs its own event loop: in a thread of its own
        return asyncio.to_thread(CliRunner().invoke, cli_app, list(args), catch_exceptions=False)

    result = await cli("audit", "--json")
    assert result.exit_code == 0, result.stdout
    entries = [(e["actor"], e["actor_role"], e["action"], e["subject"], e["principal"], e["outcome"])
               for e in reversed(__import__("json").loads(result.stdout)["audit"])]
    assert entries == [
        ("slack:UADMIN", "platform-admin", "users map", "slack:UADMIN", "group:finance", "refused"),
        ("slack:UADMIN", "platform-admin", "users map", "slack:UOUT", "group:finance", "refused"),
        ("slack:UADMIN", "platform-admin", "channel-access add", f"slack:T1:{private}", "group:finance", "refused"),
        ("slack:UADMIN", "platform-admin", "users map", "slack:UOUT", "user:root@example.com", "done"),
        ("slack:UOPS", "operator", "users map", "slack:UOUT", "group:finance", "done"),
    ]
    table = await cli("audit")
    assert table.exit_code == 0 and "refused" in table.stdout and "slack:UOPS" in table.stdout
    mapped = await cli("users", "map", "slack:UOUT", "group:board")
    assert mapped.exit_code == 0, mapped.stdout
    [latest] = await BotState(kb.engine).audit_entries(1)
    assert (latest.actor, latest.actor_role, latest.principal, latest.outcome) == ("cli", "operator", "group:board",
                                                                                  "done")


def kb_database_url(kb: Any) -> str:
    """The database URL of a test knowledge base, password included (for the CLI in the same test)."""
    return kb.engine.url.render_as_string(hide_password=False)


OUTSIDER = "I can't answer this here"


def settled(message: Message) -> bool:
    """An answer, an apology, or the reply to an outsider (bot.chat.guests.OUTSIDER_REPLY)."""
    return finished(message) or OUTSIDER in message.visible_text


async def settled_answer(fake: FakeSlackAPI, bot: Any, channel: str, question: str, user: str) -> str:
    event = mention(question, user=user, channel=channel)
    await bot.send_event(event)
    await wait_for(lambda: [m for m in fake.thread(channel, event["ts"]) if settled(m)], what="a reply")
    return answer_text(fake, channel, event["ts"])


async def test_slack_guests_and_other_organisations_get_nothing_and_are_never_admins(kb_factory, tmp_path, slack):
    kb = await open_world(kb_factory, tmp_path)
    public_question, public_text = "How many vacation days do full-time employees get?", "25 days"
    # users.info of a multi-channel guest, a single-channel guest, and a Slack Connect admin of another workspace.
    slack.add_user("UGUEST", email="guest@example.com", is_restricted=True)
    slack.add_user("USINGLE", email="single@example.com", is_ultra_restricted=True)
    slack.add_user("UEXT", email="cfo@example.com", is_admin=True, team_id="T2", is_stranger=True)
    await BotState(kb.engine).map_identity("slack:UGUEST", "group:finance")
    async with running_bot(kb, slack) as bot:
        for user in ("UGUEST", "USINGLE", "UEXT"):
            channel = new_channel("D")
            await bot.send_event(message(public_question, user=user, channel=channel, channel_type="im"))
            await wait_for(lambda: [m for m in slack.thread(channel, None) if settled(m)], what="the DM answer")  # noqa: B023
            shown = answer_text(slack, channel, None)
            assert public_text not in shown and "I can't answer this here" in shown, user
            # In a public channel too: nothing is answered for them.
            public = new_channel("C")
            slack.add_channel(public, private=False, members=[user, "UFIN"])
            assert public_text not in await settled_answer(slack, bot, public, public_question, user), user
        # The external user's is_admin is about their own workspace.
        _, refused = await bot.slash("status", user="UEXT")
        assert "needs an admin" in refused["text"]
        # A restricted channel with a guest among its members answers from nothing (the guest reads it).
        mixed = new_channel("C")
        slack.add_channel(mixed, private=True, members=["UFIN", "UGUEST"])
        assert OUTSIDER in await settled_answer(slack, bot, mixed, public_question, "UFIN")
        # A public channel shared with another organisation (Slack Connect) lists its members: the same.
        connect = new_channel("C")
        slack.add_channel(connect, private=False, members=["UFIN", "UEXT"], ext_shared=True)
        assert OUTSIDER in await settled_answer(slack, bot, connect, public_question, "UFIN")
        # The installing team's members are answered as before.
        assert public_text in await settled_answer(slack, bot, new_channel_with(slack, ["UFIN"]), public_question,
                                                 "UFIN")

    # Enterprise Grid: a user of another workspace of the same organisation is a member; of another one, not.
    slack.enterprise_id = "E1"
    slack.add_user("UGRID", email="grid@example.com", team_id="T3", enterprise_id="E1")
    slack.add_user("UOTHERORG", email="other@example.com", team_id="T4", enterprise_id="E2")
    async with running_bot(kb, slack) as bot:
        for user, answered in (("UGRID", True), ("UOTHERORG", False)):
            shown = await settled_answer(slack, bot, new_channel_with(slack, [user]), public_question, user)
            assert (public_text in shown) is answered, user

    # GUEST_ACCESS=everyone: documents shared with everyone, and nothing more (not their mapping, not their email).
    async with running_bot(kb, slack, guest_access="everyone") as bot:
        channel = new_channel("D")
        await bot.send_event(message(public_question, user="UGUEST", channel=channel, channel_type="im"))
        await wait_for(lambda: [m for m in slack.thread(channel, None) if settled(m)], what="the DM answer")
        assert public_text in answer_text(slack, channel, None)
        for kind, user in (("group", "UGUEST"), ("user", "UEXT")):  # mapped to group:finance; the CFO's email
            channel = new_channel("D")
            await bot.send_event(message(DOCUMENTS[kind][0], user=user, channel=channel, channel_type="im"))
            await wait_for(lambda: [m for m in slack.thread(channel, None) if settled(m)], what="the DM answer")  # noqa: B023
            assert DOCUMENTS[kind][1] not in answer_text(slack, channel, None), kind


def new_channel_with(fake: FakeSlackAPI, members: list[str], *, private: bool = False) -> str:
    channel = new_channel("C")
    fake.add_channel(channel, private=private, members=members)
    return channel


async def test_slack_gaps_show_private_channel_questions_only_to_its_members(kb_factory, tmp_path, slack):
    kb = await open_world(kb_factory, tmp_path)
    private = new_channel_with(slack, ["UFIN"], private=True)
    public = new_channel_with(slack, ["UFIN"])
    async with running_bot(kb, slack) as bot:
        await slack_answer(slack, bot, private, "What is the airspeed velocity of an unladen swallow?", "UFIN")
        await slack_answer(slack, bot, public, "How do I calibrate the flux capacitor?", "UFIN")
        _, reply = await bot.slash("gaps", user="UADMIN", channel=public)
        assert "flux capacitor" in reply["text"]  # a public channel's question: any admin may read it
        assert "swallow" not in reply["text"]  # the admin is not a member of the private channel
        slack.members[private].append("UADMIN")
        await bot.send_event({"type": "member_joined_channel", "user": "UADMIN", "channel": private,
                              "channel_type": "G", "team": "T1", "inviter": "UFIN"})
        _, reply = await bot.slash("gaps", user="UADMIN", channel=public)
        assert "swallow" in reply["text"]


async def test_slack_share_answers_from_the_channels_sources(kb_factory, tmp_path, slack):
    kb = await open_world(kb_factory, tmp_path)
    other = tmp_path / "it"
    write(other, "vpn.md", "# VPN setup\n\nInstall the WireGuard client and import the profile from the portal.\n")
    assert not (await kb.sync(FolderSource(other, "it"))).failed
    question, public_text = "How many vacation days do full-time employees get?", "25 days"
    channel = new_channel_with(slack, ["UFIN", "UOUT"])
    async with running_bot(kb, slack) as bot:
        _, reply = await bot.slash("channel sources add it", user="UADMIN", channel=channel)
        assert "only from `it`" in reply["text"]
        event = mention(f"privately, {question}", user="UFIN", channel=channel)
        await bot.send_event(event)
        [private] = await wait_for(lambda: ephemeral_done(slack, "UFIN", channel), what="the private answer")
        assert public_text not in private.visible_text  # the channel's sources apply to the private answer
        share = next(e for b in private.blocks if b.get("type") == "actions" for e in b["elements"])
        await click(bot, private, share, user="UFIN")
        [public] = await wait_for(lambda: [m for m in slack.thread(channel, event["ts"]) if finished(m)],
                                  what="the shared answer")
        assert public_text not in public.visible_text  # ... and to the shared one


async def test_discord_member_without_a_role_is_a_guest_when_asked(kb_factory, tmp_path, discord_api):
    """DISCORD_GUEST_WITHOUT_ROLE: a server member holding no role besides @everyone is treated as a guest
    (GUEST_ACCESS=none: no answer), and Manage Server does not make them an admin."""
    kb = await open_world(kb_factory, tmp_path)
    question, public_text = "How many vacation days do full-time employees get?", "25 days"
    fin, out = PEOPLE["fin"][2], PEOPLE["out"][2]
    channel, restricted, role = 820000000000000011, 820000000000000012, 830000000000000011
    bot, harness = await start_discord(kb, discord_api, {channel: None, restricted: role},
                                       discord_guest_without_role=True)
    try:
        discord_api.add_member(GUILD, fin, [role])
        discord_api.add_member(GUILD, out, [])
        assert public_text in await discord_mention(harness, discord_api, channel, question, fin, [role])
        shown = await discord_mention(harness, discord_api, channel, question, out, [])
        assert public_text not in shown and "I can't answer this here" in shown
        status = await harness.slash("kb status", guild_id=GUILD, channel_id=channel, user_id=out,
                                     permissions=MEMBER_PERMISSIONS | MANAGE_GUILD)
        refused = " ".join(m.get("content") or "" for m in discord_api.interaction_messages(status["token"]))
        assert "needs an admin" in refused and "chunks" not in refused
    finally:
        await bot.close()
    # Without the setting, the same member is answered as before.
    bot, harness = await start_discord(kb, discord_api, {channel: None, restricted: role})
    try:
        assert public_text in await discord_mention(harness, discord_api, channel, question, out, [])
    finally:
        await bot.close()


async def test_discord_share_answers_from_the_channels_sources(kb_factory, tmp_path, discord_api):
    from bot.chat.channels import set_sources

    kb = await open_world(kb_factory, tmp_path)
    other = tmp_path / "it"
    write(other, "vpn.md", "# VPN setup\n\nInstall the WireGuard client and import the profile from the portal.\n")
    assert not (await kb.sync(FolderSource(other, "it"))).failed
    question, public_text = "How many vacation days do full-time employees get?", "25 days"
    fin = PEOPLE["fin"][2]
    channel = 820000000000000021
    await set_sources(BotState(kb.engine), f"discord:{GUILD}:{channel}", ["it"], "test")
    bot, harness = await start_discord(kb, discord_api, {channel: None})
    try:
        ask = await harness.slash("ask", [{"type": 3, "name": "question", "value": question},
                                          {"type": 5, "name": "private", "value": True}],
                                  guild_id=GUILD, channel_id=channel, user_id=fin)
        [private] = discord_api.interaction_messages(ask["token"])
        assert public_text not in private["content"]  # the channel's sources apply to a private /ask
        share = next(c for row in private["components"] for c in row["components"]
                     if c["custom_id"].startswith("ragbot:share:"))
        clicked = await harness.click(private, share["custom_id"], guild_id=GUILD, channel_id=channel, user_id=fin)
        shared = discord_api.interaction_messages(clicked["token"])
        assert shared and public_text not in " ".join(m.get("content") or "" for m in shared)  # and when shared
    finally:
        await bot.close()
