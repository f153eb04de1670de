"""The Teams bot as Teams users see it: the real Microsoft 365 Agents SDK and MSAL in `TeamsAdapter`, the shared
chat flow, a real database and the real embedding model, against the fake Bot Connector
(tests/fakes/teams_connector.py: it signs each activity it delivers, issues the bot's tokens and records what the
bot sent, as Microsoft's Bot Connector reference documents them).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import corpus_opener
from fakes.anthropic_api import FakeAnthropicAPI
from fakes.graph_api import FakeGraph
from fakes.teams_connector import FakeTeamsConnector, Member, Message
from fakes.teams_harness import Bot, ask_in_channel, finished, new_id, reachable_connector, running_teams_bot

from bot.app import configured_adapters
from bot.chat.guests import OUTSIDER_REPLY
from bot.chat.state import BotState
from bot.context import BotContext
from bot.server import BotMetrics
from bot.settings import BotSettings
from bot.teams.adapter import TeamsAdapter
from bot.teams.owners import TeamOwners

API_KEY = "sk-ant-test-teams"
ANN = Member("aad-ann", "Ann Lee", email="ann@example.com")
CFO = Member("aad-cfo", "Cleo Fo", email="cfo@example.com")  # may read the board folder
ADMIN = Member("aad-admin", "Ada Min", email="ada@example.com")  # listed in ADMIN_USER_IDS
GUEST = Member("aad-guest", "Gus Est", email="gus@partner.example", user_role="guest")
QUESTION = "How many vacation days do full-time employees get?"
SECRET = "What did the board approve about the Contoso acquisition?"
CORPUS = {
    "policies/vacation.md": (
        "# Vacation policy\n\nFull-time employees get 25 days of paid vacation per year. Up to 5 unused vacation "
        "days carry over into the next year. Request vacation in the HR portal at least two weeks ahead.\n"
    ),
    "it/vpn.md": "# VPN setup\n\nInstall the WireGuard client and import the configuration from the IT portal.\n",
    "board/.access": "user:cfo@example.com\n",
    "board/acquisition.md": (
        "# Project Bluebird\n\nThe board approved the acquisition of Contoso for 40 million dollars. The Contoso "
        "acquisition closes in March and stays confidential until then.\n"
    ),
}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeTeamsConnector]:
    with reachable_connector() as connector:
        yield connector


@pytest_asyncio.fixture
async def corpus_kb(kb_factory: Callable[..., Awaitable[Any]], tmp_path: Path) -> Callable[..., Awaitable[Any]]:
    return corpus_opener(kb_factory, tmp_path, CORPUS)


@pytest_asyncio.fixture
async def start_bot(fake: FakeTeamsConnector) -> AsyncIterator[Callable[..., Awaitable[Bot]]]:
    async with contextlib.AsyncExitStack() as running:

        async def start(kb: Any, **overrides: object) -> Bot:
            return await running.enter_async_context(running_teams_bot(
                kb, fake, **{"admin_user_ids": f"teams:{ADMIN.aad_object_id}", **overrides}))

        yield start


def citation_names(activity: dict[str, Any]) -> list[str]:
    """The titles of the citations Teams shows under an AI message (its schema.org Message entity's `citation`)."""
    return [str((c.get("appearance") or {}).get("name")) for e in activity.get("entities") or []
            for c in e.get("citation") or []]


def has_feedback_buttons(activity: dict[str, Any]) -> bool:
    """Teams' 👍/👎 ("Feedback buttons"): channelData.feedbackLoopEnabled, or feedbackLoop.type (the SDK's)."""
    data = activity.get("channelData") or {}
    return data.get("feedbackLoopEnabled") is True or (data.get("feedbackLoop") or {}).get("type") == "default"


def is_ai_labelled(activity: dict[str, Any]) -> bool:
    return any("AIGeneratedContent" in (e.get("additionalType") or []) for e in activity.get("entities") or [])


def personal_messages(fake: FakeTeamsConnector, user: Member) -> list[Message]:
    return fake.bot_messages(f"a:personal-{user.aad_object_id}")


async def ask_personally(fake: FakeTeamsConnector, bot: Bot, user: Member, text: str) -> Message:
    before = len(personal_messages(fake, user))
    status, _ = await fake.deliver(bot.url, fake.personal_message(text, user))
    assert status == 202
    await fake.wait_for(timeout=90, condition=lambda: len(personal_messages(fake, user)) > before)
    await bot.adapter.platform.drain()
    return personal_messages(fake, user)[-1]


# ---- channels: threads, citations, follow-ups, exactly once ---------------------------------------------------------


async def test_a_channel_mention_is_answered_in_its_thread_with_citations_and_feedback(
        fake: FakeTeamsConnector, corpus_kb: Any, start_bot: Any) -> None:
    channel = new_id("general")
    fake.add_conversation(channel, "channel", members=[ANN, CFO], team_id=new_id("team"), channel_type="standard")
    bot = await start_bot(await corpus_kb())
    question = await ask_in_channel(fake, bot, channel, ANN, QUESTION)
    [answer] = await fake.wait_for(timeout=90, condition=lambda: [m for m in fake.thread(channel, question["id"]) if finished(m)])
    assert [m for m in fake.top_level(channel) if m.from_bot] == []  # in the thread, not a new post
    assert "25 days" in answer.text
    assert answer.updates == 1  # the placeholder "Searching the documents…" became the answer
    assert citation_names(answer.activity) == ["Vacation policy"]
    assert is_ai_labelled(answer.activity)
    assert has_feedback_buttons(answer.activity)
    # A standard channel is open to its team: the CFO's access does not apply there.
    await ask_in_channel(fake, bot, channel, CFO, SECRET)
    await bot.adapter.platform.drain()
    assert not any("40 million" in m.text for m in fake.bot_messages(channel))


async def test_a_reply_in_a_thread_the_bot_answered_is_a_follow_up_and_unaddressed_posts_are_left_alone(
        fake: FakeTeamsConnector, corpus_kb: Any, start_bot: Any) -> None:
    channel = new_id("help")
    fake.add_conversation(channel, "channel", members=[ANN], team_id=new_id("team"), channel_type="standard")
    bot = await start_bot(await corpus_kb())
    question = await ask_in_channel(fake, bot, channel, ANN, QUESTION)
    await fake.wait_for(timeout=90, condition=lambda: [m for m in fake.thread(channel, question["id"]) if finished(m)])
    await bot.adapter.platform.drain()
    # No mention: a top-level post is not for the bot, a reply in the bot's thread is.
    status, _ = await fake.deliver(bot.url, fake.channel_message("How do I set up the VPN?", channel, ANN,
                                                                  mention=False))
    assert status == 202
    follow_up = fake.channel_message("And how do I set up the VPN?", channel, ANN, thread_root=question["id"],
                                     mention=False)
    assert (await fake.deliver(bot.url, follow_up))[0] == 202
    await fake.wait_for(timeout=90, condition=lambda: len([m for m in fake.thread(channel, question["id"]) if finished(m)]) == 2)
    await bot.adapter.platform.drain()
    assert "WireGuard" in [m for m in fake.thread(channel, question["id"]) if finished(m)][-1].text
    assert len(fake.bot_messages(channel)) == 2  # nothing answered the unaddressed top-level post


async def test_a_redelivered_activity_is_answered_once(fake: FakeTeamsConnector, corpus_kb: Any,
                                                       start_bot: Any) -> None:
    channel = new_id("retry")
    fake.add_conversation(channel, "channel", members=[ANN], team_id=new_id("team"), channel_type="standard")
    bot = await start_bot(await corpus_kb())
    activity = fake.channel_message(f"<at>ragbot</at> {QUESTION}", channel, ANN)
    # The Connector retries an activity it thinks was lost: the same activity twice, at once.
    statuses = await asyncio.gather(fake.deliver(bot.url, activity), fake.deliver(bot.url, activity))
    assert [s for s, _ in statuses] == [202, 202]
    await fake.wait_for(timeout=90, condition=lambda: [m for m in fake.thread(channel, activity["id"]) if finished(m)])
    await bot.adapter.platform.drain()
    assert (await fake.deliver(bot.url, activity))[0] == 202  # and once more, after the answer
    await bot.adapter.platform.drain()
    assert len(fake.thread(channel, activity["id"])) == 1


async def test_a_request_without_a_valid_connector_token_is_refused_and_nothing_answers(
        fake: FakeTeamsConnector, corpus_kb: Any, start_bot: Any) -> None:
    bot = await start_bot(await corpus_kb())
    sent = len(fake.sent)
    status, _ = await fake.deliver(bot.url, fake.personal_message(QUESTION, ANN), token=fake.forged_token())
    assert status == 401
    status, _ = await fake.deliver(bot.url, fake.personal_message(QUESTION, ANN), sign=False)
    assert status == 401
    await bot.adapter.platform.drain()
    assert len(fake.sent) == sent


# ---- personal chats: streaming, feedback -------------------------------------------------------------------------


class WritesSlowly:
    """The real knowledge base with a model that writes over seconds, as Claude does (the fake Anthropic server
    sends its whole stream at once): each piece of text reaches the chat 0.6 s after the one before."""

    def __init__(self, kb: Any) -> None:
        self._kb = kb

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kb, name)

    async def answer(self, *args: Any, on_text: Any = None, **kwargs: Any) -> Any:
        async def slowly(delta: str) -> None:
            await on_text(delta)
            await asyncio.sleep(0.6)

        return await self._kb.answer(*args, on_text=slowly if on_text is not None else None, **kwargs)


async def test_a_personal_chat_answer_streams_informative_then_text_then_the_final_message(
        fake: FakeTeamsConnector, corpus_kb: Any, start_bot: Any) -> None:
    with FakeAnthropicAPI() as anthropic:
        kb = await corpus_kb(anthropic_api_key=API_KEY, anthropic_base_url=anthropic.url, anthropic_max_retries=0)
        bot = await start_bot(WritesSlowly(kb))
        anthropic.reply_stream(["Full-time employees get ", "25 days of paid vacation ", "per year [1]."])
        final = await ask_personally(fake, bot, ANN, QUESTION)
    conversation = f"a:personal-{ANN.aad_object_id}"
    sent = [s for s in fake.sent_to(conversation) if s.stream_info is not None]
    kinds = [(s.type, s.stream_info["streamType"]) for s in sent if s.stream_info]
    assert kinds[0] == ("typing", "informative") and kinds[-1] == ("message", "final")
    assert ("typing", "streaming") in kinds  # the text so far, while the model writes
    assert len({s.id for s in sent}) == 1  # one stream
    assert "25 days of paid vacation per year" in final.text
    assert citation_names(final.activity) == ["Vacation policy"] and is_ai_labelled(final.activity)
    assert has_feedback_buttons(final.activity)


async def test_a_feedback_click_on_an_answer_is_stored(fake: FakeTeamsConnector, corpus_kb: Any,
                                                       start_bot: Any) -> None:
    kb = await corpus_kb()
    bot = await start_bot(kb)
    answer = await ask_personally(fake, bot, ANN, QUESTION)
    conversation = f"a:personal-{ANN.aad_object_id}"
    status, body = await fake.deliver(bot.url, fake.feedback_invoke(answer.id, conversation, ANN, "dislike",
                                                                    "It is 30 days now"))
    assert status == 200
    [stored] = await BotState(kb.engine).recent_feedback()
    assert (stored.platform, stored.platform_user, stored.rating) == ("teams", f"teams:{ANN.aad_object_id}", "down")
    assert stored.question == QUESTION


# ---- who reads the answer -------------------------------------------------------------------------------------------


async def test_a_group_chat_answer_draws_only_on_what_every_member_may_see(
        fake: FakeTeamsConnector, corpus_kb: Any, start_bot: Any) -> None:
    chat = f"19:chat-{uuid.uuid4().hex[:10]}@thread.v2"
    fake.add_conversation(chat, "groupChat", members=[CFO, ANN])
    bot = await start_bot(await corpus_kb())
    # Alone with the bot, the CFO (cfo@example.com, from the roster) may read the board's document ...
    assert "40 million" in (await ask_personally(fake, bot, CFO, SECRET)).text
    # ... but Ann reads the group chat's answers too.
    assert (await fake.deliver(bot.url, fake.group_message(f"<at>ragbot</at> {SECRET}", chat, CFO)))[0] == 202
    [answer] = await fake.wait_for(timeout=90, condition=lambda: [m for m in fake.bot_messages(chat) if finished(m)])
    await bot.adapter.platform.drain()
    assert "40 million" not in answer.text and "Bluebird" not in answer.text
    assert "Project Bluebird" not in citation_names(answer.activity)


async def test_privately_in_a_channel_is_answered_with_a_targeted_message_from_the_askers_access(
        fake: FakeTeamsConnector, corpus_kb: Any, start_bot: Any) -> None:
    channel = new_id("finance")
    fake.add_conversation(channel, "channel", members=[CFO, ANN], team_id=new_id("team"), channel_type="standard")
    bot = await start_bot(await corpus_kb())
    question = await ask_in_channel(fake, bot, channel, CFO, f"privately {SECRET}")
    await bot.adapter.platform.drain(timeout=120)
    [answer] = [m for m in fake.thread(channel, question["id"]) if m.from_bot]
    assert "40 million" in answer.text  # the CFO's own access ...
    assert answer.seen_by(CFO.id) and not answer.seen_by(ANN.id)  # ... seen by the CFO alone
    assert len(fake.thread(channel, question["id"])) == 1  # no placeholder for the channel to see


async def test_a_guest_is_refused_under_guest_access_none(fake: FakeTeamsConnector, corpus_kb: Any,
                                                          start_bot: Any) -> None:
    bot = await start_bot(await corpus_kb(), guest_access="none")
    reply = await ask_personally(fake, bot, GUEST, QUESTION)
    assert reply.text == OUTSIDER_REPLY
    assert "25 days" not in reply.text


async def test_a_group_chat_with_someone_from_another_tenant_gets_no_answer_under_guest_access_none(
        fake: FakeTeamsConnector, corpus_kb: Any, start_bot: Any) -> None:
    chat = f"19:chat-{uuid.uuid4().hex[:10]}@thread.v2"
    visitor = Member("aad-visitor", "Vi Sitor", email="vi@other.example", tenant_id=str(uuid.uuid4()))
    fake.add_conversation(chat, "groupChat", members=[ANN, visitor])
    bot = await start_bot(await corpus_kb(), guest_access="none")
    assert (await fake.deliver(bot.url, fake.group_message(f"<at>ragbot</at> {QUESTION}", chat, ANN)))[0] == 202
    [reply] = await fake.wait_for(timeout=90, condition=lambda: [m for m in fake.bot_messages(chat) if finished(m)])
    await bot.adapter.platform.drain()
    assert reply.text == OUTSIDER_REPLY  # the visitor would read the answer


# ---- kb commands ------------------------------------------------------------------------------------------------


async def test_kb_status_answers_an_admin_and_refuses_anyone_else(fake: FakeTeamsConnector, corpus_kb: Any,
                                                                  start_bot: Any) -> None:
    bot = await start_bot(await corpus_kb())
    refused = await ask_personally(fake, bot, ANN, "kb status")
    assert "needs an admin" in refused.text and "documents" not in refused.text
    status = await ask_personally(fake, bot, ADMIN, "kb status")
    assert "4 documents" in status.text or "documents" in status.text
    assert "needs an admin" not in status.text


# ---- team owners are admins in their team (Microsoft Graph) -----------------------------------------------------

OWNER = Member("aad-owner", "Owen Er", email="owen@example.com")


@pytest.fixture
def graph(fake: FakeTeamsConnector) -> Iterator[FakeGraph]:
    """Microsoft Graph (tests/fakes/graph_api.py) in the connector's tenant, taking the Graph tokens the connector's
    identity platform issues."""
    with FakeGraph(fake.tenant_id, fake.graph_tokens) as server:
        yield server


def team_channel(fake: FakeTeamsConnector, graph: FakeGraph, *members: Member, consented: bool = True,
                 owners: tuple[Member, ...] = (OWNER,)) -> tuple[str, str]:
    """A standard channel of a team whose owners Graph lists (after its members: found on a later page)."""
    channel, group_id = new_id("team-general"), str(uuid.uuid4())
    fake.add_conversation(channel, "channel", members=[*members, *owners], team_id=new_id("team"),
                          channel_type="standard", aad_group_id=group_id)
    team = graph.add_team(group_id, members=list(members), consented=consented)
    team.members += [(owner, ["owner"]) for owner in owners]  # the owners on the last page: nextLink is followed
    return channel, group_id


async def command_in_channel(fake: FakeTeamsConnector, bot: Bot, channel: str, user: Member, text: str) -> Message:
    """`user` @mentions the bot with a kb command in a channel: the reply only they see (a targeted message)."""
    before = len(fake.bot_messages(channel))
    await ask_in_channel(fake, bot, channel, user, text)
    [reply] = await fake.wait_for(timeout=60, condition=lambda: fake.bot_messages(channel)[before:])
    assert reply.seen_by(user.id)
    return reply


async def test_a_team_owner_is_an_admin_in_the_teams_channels_and_a_plain_member_is_not(
        fake: FakeTeamsConnector, graph: FakeGraph, corpus_kb: Any, start_bot: Any) -> None:
    channel, group_id = team_channel(fake, graph, ANN, CFO, GUEST)
    earlier = len(fake.token_requests)  # the connector's identity platform serves the whole module
    bot = await start_bot(await corpus_kb(), graph=graph)
    ran = await command_in_channel(fake, bot, channel, OWNER, "kb status")
    assert "needs an admin" not in ran.text and "documents" in ran.text
    refused = await command_in_channel(fake, bot, channel, ANN, "kb status")
    assert "needs an admin" in refused.text
    # Graph was asked for the team by its group id (channelData.team.aadGroupId), with an app-only Graph token from
    # the identity platform (one: MSAL keeps it), all pages once: the owner set is cached for the second command.
    assert graph.member_calls(group_id) == 2  # 4 members, 2 a page: the owner on the second
    assert [r["scope"] for r in fake.token_requests[earlier:] if "graph" in r["scope"]] == [
        "https://graph.microsoft.com/.default"]
    # A 1:1 chat has no team: the same owner is not an admin there (ADMIN_USER_IDS only), and Graph is not asked.
    alone = await ask_personally(fake, bot, OWNER, "kb status")
    assert "needs an admin" in alone.text
    assert graph.member_calls(group_id) == 2


async def test_without_the_graph_consent_nobody_is_a_team_owner_and_admin_user_ids_still_work(
        fake: FakeTeamsConnector, graph: FakeGraph, corpus_kb: Any, start_bot: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    channel, group_id = team_channel(fake, graph, ANN, ADMIN, consented=False)
    bot = await start_bot(await corpus_kb(), graph=graph)
    with caplog.at_level("WARNING", logger="bot.teams.owners"):
        refused = await command_in_channel(fake, bot, channel, OWNER, "kb status")
        assert "needs an admin" in refused.text  # fail closed: Graph answered 403
        listed = await command_in_channel(fake, bot, channel, ADMIN, "kb status")
        assert "needs an admin" not in listed.text and "documents" in listed.text
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1  # one line, naming the fix; the refusal is remembered, not asked again
    assert "TeamMember.Read.Group" in warnings[0] and "reinstall" in warnings[0] and group_id in warnings[0]
    assert fake.app_password not in warnings[0]
    assert graph.member_calls(group_id) == 1


async def test_a_guest_who_owns_the_team_is_not_an_admin(
        fake: FakeTeamsConnector, graph: FakeGraph, corpus_kb: Any, start_bot: Any) -> None:
    """An owner from outside the organisation (userRole "guest") runs no admin command: Graph's owner role counts
    only for a member of the installing tenant, as a platform's admin flag does."""
    channel, group_id = team_channel(fake, graph, ANN, owners=(GUEST,))
    bot = await start_bot(await corpus_kb(), graph=graph)
    refused = await command_in_channel(fake, bot, channel, GUEST, "kb status")
    assert "documents" not in refused.text and "admin" in refused.text


async def test_a_refused_graph_sign_in_makes_nobody_an_owner_and_never_logs_the_secret(
        fake: FakeTeamsConnector, graph: FakeGraph, caplog: pytest.LogCaptureFixture) -> None:
    """The Graph token comes from the SDK's token provider (MSAL, through the identity platform the bot signs in
    to): when the identity platform refuses the app's secret, the team's owner is not an admin (fail closed), Graph
    is not asked, and one warning names the refusal without the secret, in our log or the SDK's."""
    wrong = "not-the-app-secret-" + uuid.uuid4().hex
    owners = TeamOwners(app_id=fake.app_id, app_password=wrong, default_tenant=fake.tenant_id,
                        graph_base_url=graph.url, login_base_url="https://login.microsoftonline.com", ttl_seconds=60)
    group_id = str(uuid.uuid4())
    graph.add_team(group_id, owners=[OWNER])
    with caplog.at_level("WARNING"):
        assert not await owners.is_owner(group_id, OWNER.aad_object_id, fake.tenant_id)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "bot.teams.owners"]
    # (Real Entra's refusal reads invalid_client; after it MSAL looks up the host's aliases at an instance-discovery
    # endpoint Microsoft's references do not document, which this fake therefore answers 404.)
    assert "token request failed" in warning and group_id in warning
    assert all(wrong not in r.getMessage() for r in caplog.records)
    assert graph.member_calls(group_id) == 0
    assert fake.token_requests[-1]["scope"] == "https://graph.microsoft.com/.default"


# ---- crash resume -----------------------------------------------------------------------------------------------


class CrashesMidAnswer:
    """The real knowledge base in a process that dies mid-answer (after the placeholder is posted): the answer
    step is cancelled as kill -9 leaves it: no apology, nothing delivered, the claim not released."""

    def __init__(self, kb: Any) -> None:
        self._kb = kb
        self.crashed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kb, name)

    async def answer(self, *args: Any, **kwargs: Any) -> Any:
        self.crashed.set()
        raise asyncio.CancelledError("the process died")


async def test_after_a_crash_the_sweeper_answers_in_the_placeholder_the_dead_process_posted(
        fake: FakeTeamsConnector, corpus_kb: Any, start_bot: Any) -> None:
    channel = new_id("resume")
    fake.add_conversation(channel, "channel", members=[ANN], team_id=new_id("team"), channel_type="standard")
    kb = await corpus_kb()
    crashing = CrashesMidAnswer(kb)
    dead = await start_bot(crashing, answer_lease_seconds=0.3)
    question = await ask_in_channel(fake, dead, channel, ANN, QUESTION)
    await asyncio.wait_for(crashing.crashed.wait(), 30)
    [placeholder] = fake.thread(channel, question["id"])
    assert not finished(placeholder)
    await start_bot(kb, answer_sweep_seconds=0.2)  # the restarted bot: its sweeper takes the question over
    await fake.wait_for(timeout=90, condition=lambda: finished(placeholder))
    assert "25 days" in placeholder.text and placeholder.updates == 1
    assert len(fake.thread(channel, question["id"])) == 1  # in the same message, in the thread


# ---- ragbot run ---------------------------------------------------------------------------------------------------


async def test_ragbot_run_starts_teams_when_its_app_id_and_password_are_set(
        fake: FakeTeamsConnector, corpus_kb: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    kb = await corpus_kb()
    settings = BotSettings(_env_file=None)  # type: ignore[call-arg]
    assert "teams" not in settings.chat_platforms
    monkeypatch.setenv("TEAMS_APP_ID", fake.app_id)
    monkeypatch.setenv("TEAMS_APP_PASSWORD", fake.app_password)
    monkeypatch.setenv("TEAMS_TENANT_ID", fake.tenant_id)
    assert settings.chat_platforms == ["teams"]
    [adapter] = configured_adapters(BotContext(kb, settings, BotMetrics(), BotState(kb.engine)))
    assert isinstance(adapter, TeamsAdapter)
    assert [r.path for r in adapter.routes()] == ["/api/messages"]  # type: ignore[attr-defined]
