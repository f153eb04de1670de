"""The Discord bot as Discord users see it: the real discord.py client, its CommandTree and persistent components,
driven with raw gateway payloads, talking to a fake Discord REST API on 127.0.0.1 that records every call
(tests/fakes/discord_api.py, tests/fakes/discord_gateway.py), with a real database and the real embedding model.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import corpus_opener, write
from fakes.anthropic_api import FakeAnthropicAPI
from fakes.discord_api import FakeDiscordAPI
from fakes.discord_gateway import MANAGE_GUILD, MEMBER_PERMISSIONS, DiscordHarness

from bot.chat.state import BotState
from bot.discord.adapter import (
    EMBED_DESCRIPTION_LIMIT,
    EMBED_TOTAL_LIMIT,
    MESSAGE_LIMIT,
    Part,
    ProgressiveReply,
    RagbotDiscord,
    configure_api_url,
    group_embeds,
    render_answer,
    source_embeds,
)
from bot.server import BotMetrics
from bot.settings import BotSettings
from knowledge.answer.answering import Answer, Citation

GUILD = 700000000000000001
CHANNEL = 700000000000000010
OTHER_CHANNEL = 700000000000000011
ALICE = 700000000000000100  # an ordinary member
CFO = 700000000000000200  # mapped to user:cfo@example.com, who may read the board folder
ADMIN = 700000000000000300  # has Manage Server
LISTED_ADMIN = 700000000000000400  # no Manage Server, but in ADMIN_USER_IDS
API_KEY = "sk-ant-test-discord"

CORPUS = {
    "policies/vacation.md": (
        "# Vacation policy\n\nFull-time employees get 25 days of paid vacation per year. Up to 5 unused vacation "
        "days carry over into the next year. Request vacation in the HR portal at least two weeks ahead.\n"
    ),
    "it/vpn.md": (
        "# VPN setup\n\nInstall the WireGuard client and import the configuration file from the IT portal. The VPN "
        "is required to reach internal dashboards from home.\n"
    ),
    "facilities/fire-drill.md": (
        "# Fire drill\n\n@everyone the fire drill is on Friday at 10am and everybody meets at the north parking lot. "
        "@here <@&700000000000000999> fire wardens bring their vests to the fire drill.\n"
    ),
    "board/.access": "user:cfo@example.com\n",
    "board/acquisition.md": (
        "# Project Bluebird\n\nThe board approved the acquisition of Contoso for 40 million dollars. The Contoso "
        "acquisition closes in March and stays confidential until then.\n"
    ),
}


def option(name: str, value: Any, kind: int = 3) -> dict[str, Any]:
    return {"type": kind, "name": name, "value": value}


@pytest.fixture
def anthropic():
    with FakeAnthropicAPI() as fake:
        yield fake


@pytest_asyncio.fixture
async def corpus_kb(kb_factory, tmp_path: Path):
    """A fresh knowledge base over CORPUS, answering offline (extractive) unless a test opens its own with Claude."""
    return corpus_opener(kb_factory, tmp_path, CORPUS)


@pytest_asyncio.fixture
async def start_bot(discord_api: FakeDiscordAPI):
    started: list[RagbotDiscord] = []

    async def start(kb, **overrides: object) -> tuple[RagbotDiscord, DiscordHarness]:
        settings = BotSettings(_env_file=None, **{  # type: ignore[call-arg]
            "discord_bot_token": discord_api.token, "discord_api_url": discord_api.base_url,
            "discord_guild_id": GUILD, "discord_edit_interval_seconds": 0.0,
            "admin_user_ids": f"discord:{LISTED_ADMIN}", **overrides,
        })
        configure_api_url(settings.discord_api_url)
        bot = RagbotDiscord(kb, settings, BotMetrics())
        await bot.login(discord_api.token)  # GET /users/@me, application info, setup_hook: commands synced
        started.append(bot)
        harness = DiscordHarness(bot, discord_api)
        harness.guild_create(GUILD, [CHANNEL, OTHER_CHANNEL])
        return bot, harness

    yield start
    for bot in started:
        await bot.close()


def all_text(messages: list[dict[str, Any]]) -> str:
    """Everything a reader sees in these messages: content and embeds."""
    parts = []
    for m in messages:
        parts.append(m.get("content") or "")
        for embed in m.get("embeds") or []:
            parts += [embed.get("title") or "", embed.get("description") or ""]
    return "\n".join(parts)


def feedback_buttons(message: dict[str, Any]) -> list[str]:
    return [c["custom_id"] for row in message.get("components") or [] for c in row.get("components", [])]


# ---- /ask -----------------------------------------------------------------------------------------------------------


async def test_ask_defers_at_once_then_follows_up_with_a_streamed_cited_answer(
    corpus_kb, start_bot, discord_api, anthropic
):
    kb = await corpus_kb(anthropic_api_key=API_KEY, anthropic_base_url=anthropic.url, anthropic_max_retries=0)
    anthropic.reply_stream(["Full-time employees get ", "25 days of paid vacation ", "per year [1]."])
    bot, discord_harness = await start_bot(kb)
    assert [c["name"] for c in discord_api.commands[str(GUILD)]] == ["ask", "kb"]  # synced to DISCORD_GUILD_ID
    discord_api.rate_limit_next("POST", "/webhooks/")  # one 429 (with Via): discord.py waits and retries

    payload = await discord_harness.slash("ask", [option("question", "How many vacation days do I get?")],
                                          guild_id=GUILD, channel_id=CHANNEL, user_id=ALICE)

    mine = [c for c in discord_api.calls if payload["token"] in c.path]
    assert mine[0].path.endswith("/callback") and mine[0].body == {"type": 5}  # deferred first: "ragbot is thinking"
    posts = [c for c in mine if c.method == "POST" and c.path.startswith("/webhooks/")]
    edits = [c for c in mine if c.method == "PATCH"]
    assert len(posts) == 2  # the 429'd attempt and its retry: one message
    assert posts[-1].body["content"].endswith("…")  # the first words, posted while Claude was still writing
    assert edits, "the streamed message was never completed"
    [answer] = discord_api.interaction_messages(payload["token"])
    assert "25 days of paid vacation per year [1]." in answer["content"]
    [embed] = answer["embeds"]
    assert embed["title"] == "Sources" and "**[1]** Vacation policy" in embed["description"]
    assert "policies/vacation.md" in embed["description"]
    assert [b.split(":")[-1] for b in feedback_buttons(answer)] == ["up", "down"]
    assert all(c.body.get("allowed_mentions") == {"parse": []} for c in posts + edits)


async def test_a_long_answer_arrives_split_within_discords_limits(corpus_kb, start_bot, discord_api, anthropic):
    kb = await corpus_kb(anthropic_api_key=API_KEY, anthropic_base_url=anthropic.url, anthropic_max_retries=0,
                         answer_max_tokens=4000)
    sentences = [
        f"Rule {i}: vacation requests for period {i} go through https://hr.example.com/portal/vacation/requests/{i}"
        f"?team=all&ref=handbook [1]." for i in range(70)
    ]
    long_text = " ".join(sentences)
    assert len(long_text) > 3 * MESSAGE_LIMIT
    anthropic.reply_stream([long_text[i:i + 300] for i in range(0, len(long_text), 300)])
    _, discord_harness = await start_bot(kb)

    payload = await discord_harness.slash("ask", [option("question", "How do I request vacation?")],
                                          guild_id=GUILD, channel_id=CHANNEL, user_id=ALICE)

    messages = discord_api.interaction_messages(payload["token"])
    assert len(messages) >= 3
    assert all(len(m["content"]) <= MESSAGE_LIMIT for m in messages)
    # Every URL and citation arrived whole, in order, and nothing was lost between the pieces.
    joined = " ".join(m["content"] for m in messages)
    assert re.findall(r"https://\S+", joined) == re.findall(r"https://\S+", long_text)
    assert joined.count("[1]") == 70
    assert " ".join(joined.split()) == " ".join(long_text.split())
    assert messages[-1]["embeds"] and feedback_buttons(messages[-1])  # sources and buttons under the last piece
    assert not any(m["embeds"] for m in messages[:-1])


async def test_a_streamed_answer_is_posted_early_then_edited_at_most_once_per_interval(
    corpus_kb, start_bot, discord_api
):
    kb = await corpus_kb()
    bot, _ = await start_bot(kb)
    channel = bot.get_channel(CHANNEL)  # a real discord.py TextChannel: its sends and edits reach the fake API
    reply = ProgressiveReply(channel.send, interval=0.3)
    words = [f"word{i} " for i in range(24)]

    loop = asyncio.get_running_loop()
    started = loop.time()
    for word in words:  # Claude writing for about 1.2 s
        await reply.on_text(word)
        await asyncio.sleep(0.05)
    elapsed = loop.time() - started
    await reply.finish([Part("The final answer [1].", [])], None)

    [post] = discord_api.calls_to("POST", f"/channels/{CHANNEL}/messages")
    edits = discord_api.calls_to("PATCH", f"/channels/{CHANNEL}/messages/")
    assert post.body["content"].startswith("word0") and len(post.body["content"]) < len("".join(words))  # early
    previews, final = edits[:-1], edits[-1]
    assert 1 <= len(previews) <= elapsed / 0.3 + 1  # throttled, not one edit per delta
    shown = [post.body["content"]] + [e.body["content"] for e in previews]
    assert all(text.endswith(" …") for text in shown)
    assert all(a[:-2] in b for a, b in zip(shown, shown[1:], strict=False))  # each edit extends the last
    assert final.body["content"] == "The final answer [1]."
    assert discord_api.bot_messages(CHANNEL)[0]["content"] == "The final answer [1]."


def test_sources_embeds_link_titles_and_stay_within_embed_limits():
    citations = [
        Citation(n, f"Policy {n} " + "x" * 150, f"https://wiki.example.com/pages/{n}(draft)", None, f"id{n}", "wiki",
                 "", "") for n in range(1, 120)
    ]
    embeds = source_embeds(citations)
    assert len(embeds) > 1
    assert all(len(e.description or "") <= EMBED_DESCRIPTION_LIMIT for e in embeds)
    assert "**[1]** [Policy 1 " in embeds[0].description and "(https://wiki.example.com/pages/1%28draft%29)" in embeds[0].description
    for group in group_embeds(embeds):
        assert len(group) <= 10 and sum(len(e) for e in group) <= EMBED_TOTAL_LIMIT
    answer = Answer("See the policies [1].", "llm", False, citations, [])
    parts = render_answer(answer)
    lines = "\n".join(e.description or "" for p in parts for e in p.embeds)
    assert all(f"**[{n}]** [Policy {n} " in lines for n in range(1, 120))  # none dropped, none cut


# ---- mentions and threads -----------------------------------------------------------------------------------------


async def test_a_mention_opens_a_thread_and_a_reply_there_is_answered_with_memory(corpus_kb, start_bot, discord_api):
    kb = await corpus_kb()
    _, discord_harness = await start_bot(kb)

    mention = await discord_harness.message("How many vacation days do full-time employees get?", mention_bot=True,
                                            channel_id=CHANNEL, guild_id=GUILD, author_id=ALICE)

    [create] = discord_api.calls_to("POST", f"/channels/{CHANNEL}/messages/{mention['id']}/threads")
    assert create.body["name"] == "How many vacation days do full-time employees get?"
    thread_id = int(mention["id"])  # a thread started from a message has the message's id
    assert discord_api.bot_messages(CHANNEL) == []  # nothing posted in the channel itself
    [first] = discord_api.bot_messages(thread_id)
    assert "25 days of paid vacation" in first["content"] and "[1]" in first["content"]

    # The same event delivered again (a replayed gateway event, or a second replica of the bot): answered once.
    replay = discord_harness.state.parse_message_create
    replay(dict(mention))
    await discord_harness.settle()
    assert len(discord_api.calls_to("POST", "/threads")) == 1 and len(discord_api.bot_messages(thread_id)) == 1

    # A reply in the thread, without a mention, that only makes sense with the first question in mind.
    await discord_harness.message("and how many of those carry over?", channel_id=thread_id, guild_id=GUILD,
                                  author_id=ALICE)

    answers = discord_api.bot_messages(thread_id)
    assert len(answers) == 2
    assert "5 unused vacation days carry over" in answers[1]["content"]
    # What was searched came from the conversation (guild + thread), not from the reply's words alone.
    answer_id = int(feedback_buttons(answers[1])[0].split(":")[2])
    delivered = await BotState(kb.engine).delivered_answer(answer_id)
    assert delivered.conversation_id == f"discord:{GUILD}:{thread_id}"
    assert "vacation" in delivered.standalone_query.lower()

    # Chatter in an ordinary channel, without a mention, is not answered.
    await discord_harness.message("how many vacation days?", channel_id=OTHER_CHANNEL, guild_id=GUILD,
                                  author_id=ALICE)
    assert discord_api.bot_messages(OTHER_CHANNEL) == [] and not discord_api.calls_to("POST", f"/{OTHER_CHANNEL}/")


async def test_mentioned_mid_thread_the_bot_reads_the_thread_so_far(corpus_kb, start_bot, discord_api):
    kb = await corpus_kb()
    _, discord_harness = await start_bot(kb)
    thread_id = discord_api.user_thread(GUILD, CHANNEL, owner_id=ALICE)
    discord_harness.sync_threads()  # THREAD_CREATE
    await discord_harness.message("How many vacation days do full-time employees get?", channel_id=thread_id,
                                  guild_id=GUILD, author_id=ALICE)
    assert discord_api.bot_messages(thread_id) == []  # not a conversation the bot is in: no answer

    await discord_harness.message("and how many of those carry over?", mention_bot=True, channel_id=thread_id,
                                  guild_id=GUILD, author_id=ALICE)

    assert not discord_api.calls_to("POST", "/threads")  # answered in place, no new thread
    [answer] = discord_api.bot_messages(thread_id)
    assert "5 unused vacation days carry over" in answer["content"]
    delivered = await BotState(kb.engine).delivered_answer(int(feedback_buttons(answer)[0].split(":")[2]))
    assert "vacation" in delivered.standalone_query.lower()  # the earlier message was read as history


# ---- who may see what -----------------------------------------------------------------------------------------------


async def test_a_restricted_document_never_reaches_a_channel_but_reaches_its_mapped_reader_in_a_dm(
    corpus_kb, start_bot, discord_api
):
    kb = await corpus_kb()
    _, discord_harness = await start_bot(kb)
    question = "Which company is the board acquiring in Project Bluebird?"

    # The CFO's Discord account is mapped (an operator does it with /kb users map: ADMIN_USER_IDS; a Manage Server
    # admin may hand out only principals they hold, issue 38).
    await discord_harness.slash(
        "kb users map", [option("user", str(CFO), kind=6), option("principal", "user:cfo@example.com")],
        guild_id=GUILD, channel_id=CHANNEL, user_id=LISTED_ADMIN, permissions=MEMBER_PERMISSIONS,
        resolved={"users": {str(CFO): {"id": str(CFO), "username": "cfo", "discriminator": "0", "avatar": None}}},
    )
    assert await BotState(kb.engine).identity_principals(f"discord:{CFO}") == ["user:cfo@example.com"]

    # Asked by the CFO, in a shared channel (mention and /ask): everyone there would read it.
    mention = await discord_harness.message(question, mention_bot=True, channel_id=CHANNEL, guild_id=GUILD,
                                            author_id=CFO)
    ask = await discord_harness.slash("ask", [option("question", question)], guild_id=GUILD, channel_id=CHANNEL,
                                      user_id=CFO)
    shared = discord_api.bot_messages(int(mention["id"])) + discord_api.interaction_messages(ask["token"])
    assert shared
    assert "Contoso" not in all_text(shared) and "Bluebird" not in all_text(shared)

    # The same question in a DM from an unmapped member: no. From the CFO: answered from the board document.
    for user, dm in ((ALICE, 710000000000000001), (CFO, 710000000000000002)):
        discord_api.add_channel(dm, None)
        await discord_harness.message(question, channel_id=dm, guild_id=None, author_id=user)
    assert "Contoso" not in all_text(discord_api.bot_messages(710000000000000001))
    [cfo_answer] = discord_api.bot_messages(710000000000000002)
    assert "Contoso" in cfo_answer["content"]
    assert "Project Bluebird" in all_text([cfo_answer])  # cited in the Sources embed


async def test_retrieved_everyone_and_role_mentions_ping_nobody(corpus_kb, start_bot, discord_api):
    kb = await corpus_kb()
    _, discord_harness = await start_bot(kb)

    thread = await discord_harness.message("When is the fire drill and where do we meet?", mention_bot=True,
                                           channel_id=CHANNEL, guild_id=GUILD, author_id=ALICE)

    [answer] = discord_api.bot_messages(int(thread["id"]))
    assert "fire drill is on Friday" in answer["content"]  # the excerpt holding "@everyone" was quoted
    assert "@everyone" not in answer["content"] and "@here" not in answer["content"]
    assert "<@&" not in answer["content"]
    sent = [c for c in discord_api.calls if c.method in ("POST", "PATCH") and "/messages" in c.path
            and c.body and "content" in c.body]
    assert sent and all(c.body["allowed_mentions"] == {"parse": []} for c in sent)


# ---- /kb admin ----------------------------------------------------------------------------------------------------


async def test_kb_reindex_is_refused_to_members_and_runs_for_admins(corpus_kb, start_bot, discord_api, tmp_path):
    kb = await corpus_kb()
    _, discord_harness = await start_bot(kb)
    write(tmp_path / "docs", "policies/parking.md", "# Parking\n\nStaff park in the blue garage on level 3.\n")

    refused = await discord_harness.slash("kb reindex", [option("source", "handbook")], guild_id=GUILD,
                                          channel_id=CHANNEL, user_id=ALICE)
    [reply] = [c for c in discord_api.calls if refused["token"] in c.path]
    assert reply.body["type"] == 4 and reply.body["data"]["flags"] == 64  # ephemeral
    assert "needs an admin" in reply.body["data"]["content"]
    assert (await kb.status()).documents == 4  # nothing happened: parking.md is not indexed

    for admin_id, permissions in ((ADMIN, MEMBER_PERMISSIONS | MANAGE_GUILD), (LISTED_ADMIN, MEMBER_PERMISSIONS)):
        ran = await discord_harness.slash("kb reindex", [option("source", "handbook")], guild_id=GUILD,
                                          channel_id=CHANNEL, user_id=admin_id, permissions=permissions)
        calls = [c for c in discord_api.calls if ran["token"] in c.path]
        assert calls[0].body["data"]["flags"] == 64 and "Reindexing" in calls[0].body["data"]["content"]
        [done] = [c for c in calls if c.path.startswith("/webhooks/")]  # the counts, when the sync finished
        assert done.body["flags"] == 64 and "handbook" in done.body["content"]
    assert "1 added" in [c for c in discord_api.calls if c.path.startswith("/webhooks/")][0].body["content"]
    assert (await kb.status()).documents == 5

    status = await discord_harness.slash("kb status", guild_id=GUILD, channel_id=CHANNEL, user_id=ALICE)
    [reply] = [c for c in discord_api.calls if status["token"] in c.path]
    assert "needs an admin" in reply.body["data"]["content"] and "documents" not in reply.body["data"]["content"]


# ---- feedback ------------------------------------------------------------------------------------------------------


async def test_a_feedback_click_is_stored_even_after_a_restart(corpus_kb, start_bot, discord_api):
    kb = await corpus_kb()
    _, discord_harness = await start_bot(kb)
    payload = await discord_harness.slash("ask", [option("question", "How do I set up the VPN?")], guild_id=GUILD,
                                          channel_id=CHANNEL, user_id=ALICE)
    [answer] = discord_api.interaction_messages(payload["token"])
    up, down = feedback_buttons(answer)

    # The bot restarts: a new client, whose persistent buttons still handle clicks on the old message.
    _, restarted = await start_bot(kb)
    click = await restarted.click(answer, down, guild_id=GUILD, channel_id=CHANNEL, user_id=ALICE)

    [ack] = [c for c in discord_api.calls if click["token"] in c.path]
    assert ack.body["type"] == 4 and ack.body["data"]["flags"] == 64 and "Thanks" in ack.body["data"]["content"]
    [row] = await BotState(kb.engine).recent_feedback()
    assert (row.rating, row.platform_user, row.question) == ("down", f"discord:{ALICE}", "How do I set up the VPN?")
    assert row.chunk_ids


# ---- failures -------------------------------------------------------------------------------------------------------


async def test_a_failure_becomes_a_short_message_with_an_error_id_in_the_logs(corpus_kb, start_bot, discord_api,
                                                                             caplog):
    kb = await corpus_kb()
    _, discord_harness = await start_bot(kb)
    async with kb.engine.begin() as conn:
        from sqlalchemy import text

        await conn.execute(text("ALTER TABLE chunks RENAME TO chunks_gone"))  # retrieval now fails

    with caplog.at_level(logging.ERROR, logger="bot.discord.adapter"):
        payload = await discord_harness.slash("ask", [option("question", "How do I set up the VPN?")],
                                              guild_id=GUILD, channel_id=CHANNEL, user_id=ALICE)

    [reply] = discord_api.interaction_messages(payload["token"])
    error_id = re.search(r"error id `([0-9a-f]{8})`", reply["content"]).group(1)
    assert reply["content"].startswith("Sorry")
    assert any(error_id in r.getMessage() and r.exc_info for r in caplog.records)


# ---- ragbot run ---------------------------------------------------------------------------------------------------


async def test_ragbot_run_starts_discord_on_the_gateway_and_answers_a_mention(corpus_kb, discord_api):
    """The composition root `ragbot run` uses, with DISCORD_TOKEN set: log in, sync the commands globally (no
    DISCORD_GUILD_ID), connect to the gateway, and answer a mention that arrives over the websocket."""
    from fakes.discord_gateway import guild_payload, message_payload

    from bot.app import BotApp

    kb = await corpus_kb()
    discord_api.guild_creates.append(guild_payload(GUILD, [CHANNEL]))
    discord_api.add_channel(CHANNEL, GUILD)
    settings = BotSettings(_env_file=None, DISCORD_TOKEN=discord_api.token, discord_api_url=discord_api.base_url,  # type: ignore[call-arg]
                           discord_gateway_url=discord_api.gateway_url, port=0)
    app = BotApp(settings, kb=kb)
    await app.start()
    try:
        await asyncio.wait_for(discord_api.identified.wait(), timeout=30)
        assert discord_api.identify["token"] == discord_api.token
        assert discord_api.identify["intents"] & (1 << 15)  # message content: thread replies without a mention
        assert [c["name"] for c in discord_api.commands["global"]] == ["ask", "kb"]

        mention = message_payload(discord_api, "How do I set up the VPN?", channel_id=CHANNEL, guild_id=GUILD,
                                  author_id=ALICE, mention_bot=True)
        discord_api.record_user_message(mention)
        await discord_api.dispatch("MESSAGE_CREATE", mention)
        thread_id = int(mention["id"])
        for _ in range(300):
            if any(feedback_buttons(m) for m in discord_api.bot_messages(thread_id)):
                break
            await asyncio.sleep(0.1)
        [answer] = discord_api.bot_messages(thread_id)
        assert "The VPN is required" in answer["content"] and "[1]" in answer["content"]
    finally:
        await app.stop()


async def test_ragbot_run_says_which_setting_to_fix_when_discord_refuses_the_bot(kb_factory, discord_api):
    from bot.app import BotApp
    from bot.discord.adapter import DiscordStartError

    kb = await kb_factory()
    settings = dict(discord_api_url=discord_api.base_url, discord_gateway_url=discord_api.gateway_url, port=0)

    wrong_token = BotApp(BotSettings(_env_file=None, DISCORD_TOKEN="not-the-token", **settings), kb=kb)  # type: ignore[call-arg]
    with pytest.raises(DiscordStartError, match="Discord refused DISCORD_TOKEN"):
        await wrong_token.start()
    await wrong_token.stop()

    discord_api.refuse_privileged_intents = True
    no_intent = BotApp(BotSettings(_env_file=None, DISCORD_TOKEN=discord_api.token, **settings), kb=kb)  # type: ignore[call-arg]
    with pytest.raises(DiscordStartError, match="Message Content Intent.*DISCORD_MESSAGE_CONTENT=false"):
        await no_intent.start()
    await no_intent.stop()
