"""The Teams platform primitives (bot.teams) through the real Microsoft 365 Agents SDK and MSAL, against a fake Bot
Connector (tests/fakes/teams_connector.py) that signs activities with its own key and issues the bot's tokens.

The SDK's https calls (the Bot Framework signing keys, MSAL's sign-in) reach the fake through HTTPS_PROXY with the
fake's CA trusted, exactly as they would reach Microsoft through a company proxy: the bot's code has no test hook.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from fakes.teams_connector import FakeTeamsConnector, Member
from fakes.teams_harness import reachable_connector, serving
from microsoft_agents.hosting.core.app.streaming import Citation

from bot.teams.activities import TeamsConversation, TeamsFeedback, TeamsMembershipChange, TeamsMessage
from bot.teams.platform import ReplyTarget, TeamsPlatform, message_activity
from bot.teams.settings import TeamsSettings

TEAM = "19:team-general@thread.tacv2"
CHANNEL = "19:kb-help@thread.tacv2"
PRIVATE_CHANNEL = "19:finance-private@thread.tacv2"
ANN = Member("aad-ann", "Ann Lee", email="ann@example.com")


@dataclass
class Recorder:
    """What the bot's callbacks saw; `reply` is what the bot does with a message (set per test)."""

    messages: list[TeamsMessage] = field(default_factory=list)
    feedback: list[TeamsFeedback] = field(default_factory=list)
    membership: list[TeamsMembershipChange] = field(default_factory=list)
    reply: Callable[[TeamsMessage], Awaitable[None]] | None = None
    outcome: dict[str, object] = field(default_factory=dict)

    async def on_message(self, message: TeamsMessage) -> None:
        self.messages.append(message)
        if self.reply is not None:
            await self.reply(message)

    async def on_feedback(self, feedback: TeamsFeedback) -> None:
        self.feedback.append(feedback)

    async def on_membership(self, change: TeamsMembershipChange) -> None:
        self.membership.append(change)


@dataclass
class Bot:
    platform: TeamsPlatform
    url: str
    seen: Recorder


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeTeamsConnector]:
    with reachable_connector() as connector:
        connector.add_conversation(CHANNEL, "channel", members=[ANN], team_id=TEAM, channel_type="standard")
        yield connector


@pytest_asyncio.fixture(scope="module")
async def bot(fake: FakeTeamsConnector) -> AsyncIterator[Bot]:
    seen = Recorder()
    settings = TeamsSettings(app_id=fake.app_id, app_password=fake.app_password, tenant_id=fake.tenant_id)
    platform = TeamsPlatform(settings, on_message=seen.on_message, on_feedback=seen.on_feedback,
                             on_membership=seen.on_membership)
    async with serving(platform.routes()) as url:
        yield Bot(platform, url, seen)
        await platform.drain()


@pytest.fixture
def seen(bot: Bot) -> Iterator[Recorder]:
    bot.seen.messages.clear()
    bot.seen.feedback.clear()
    bot.seen.membership.clear()
    bot.seen.outcome.clear()
    yield bot.seen
    bot.seen.reply = None


async def echo(bot: Bot, message: TeamsMessage) -> None:
    await bot.platform.post(ReplyTarget.for_message(message), message_activity(f"You asked: {message.text}"))


# ---- every incoming request is authenticated ------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["no token", "not bearer", "forged signature", "wrong audience", "expired",
                                  "wrong issuer", "other service url"])
async def test_an_activity_without_a_valid_connector_token_is_refused(
        fake: FakeTeamsConnector, bot: Bot, seen: Recorder, case: str) -> None:
    seen.reply = lambda m: echo(bot, m)
    sent_before = len(fake.sent)
    activity = fake.personal_message("What is the travel policy?", ANN)
    kwargs: dict[str, object] = {
        "no token": {"sign": False},
        "not bearer": {"authorization": f"Basic {fake.token()}"},
        "forged signature": {"token": fake.forged_token()},
        "wrong audience": {"token": fake.token(audience="another-bot-app-id")},
        "expired": {"token": fake.token(expires_in=-400)},  # 6 min 40 s ago: past the 5 minutes of clock skew
        # Signed by a real Entra ID key, for this bot, but issued to another tenant's app: the issuer allow-list.
        "wrong issuer": {"token": fake.entra_token("https://sts.windows.net/attacker-tenant/")},
        "other service url": {"token": fake.token(service_url="https://evil.example.com/")},
    }[case]
    status, _ = await fake.deliver(bot.url, activity, **kwargs)  # type: ignore[arg-type]
    assert status == 401
    await bot.platform.drain()
    assert seen.messages == []
    assert len(fake.sent) == sent_before


async def test_a_token_within_the_clock_skew_is_accepted(fake: FakeTeamsConnector, bot: Bot, seen: Recorder) -> None:
    activity = fake.personal_message("hello", ANN)
    status, _ = await fake.deliver(bot.url, activity, token=fake.token(expires_in=-120))  # expired 2 minutes ago
    assert status == 202
    await bot.platform.drain()
    assert [m.text for m in seen.messages] == ["hello"]


# ---- channel threads ------------------------------------------------------------------------------------------------


async def test_a_mention_in_a_channel_is_answered_in_its_thread(fake: FakeTeamsConnector, bot: Bot,
                                                                seen: Recorder) -> None:
    seen.reply = lambda m: echo(bot, m)
    post = fake.channel_message("<at>ragbot</at> How many vacation days do I get?", CHANNEL, ANN)
    status, _ = await fake.deliver(bot.url, post)
    assert status == 202
    answers = await fake.wait_for(lambda: fake.thread(CHANNEL, post["id"]))
    assert [a.text for a in answers] == ["You asked: How many vacation days do I get?"]
    assert [m.id for m in fake.top_level(CHANNEL)] == [post["id"]]  # nothing new at the channel's top level
    message = seen.messages[0]
    assert message.mentions_bot and message.user.identity == "teams:aad-ann"
    assert message.conversation.channel_key == f"teams:{fake.tenant_id}:{CHANNEL}"
    assert fake.sent_to(CHANNEL)[-1].conversation_id == f"{CHANNEL};messageid={post['id']}"

    # A follow-up in the thread (no mention needed) is answered in the same thread.
    follow_up = fake.channel_message("And for part-time staff?", CHANNEL, ANN, thread_root=post["id"],
                                     mention=False)
    assert (await fake.deliver(bot.url, follow_up))[0] == 202
    await fake.wait_for(lambda: len(fake.thread(CHANNEL, post["id"])) == 3)
    thread = fake.thread(CHANNEL, post["id"])
    assert [(m.from_bot, m.text) for m in thread] == [
        (True, "You asked: How many vacation days do I get?"), (False, "And for part-time staff?"),
        (True, "You asked: And for part-time staff?")]
    assert not seen.messages[-1].mentions_bot


async def test_a_placeholder_is_replaced_by_the_answer(fake: FakeTeamsConnector, bot: Bot, seen: Recorder) -> None:
    async def answer(message: TeamsMessage) -> None:
        target = ReplyTarget.for_message(message)
        placeholder = await bot.platform.post(target, message_activity("Searching the documents…"))
        await bot.platform.update(target, placeholder, message_activity("Employees get 25 days [1].",
                                                                        ai_generated=True, feedback=True))

    seen.reply = answer
    post = fake.channel_message("<at>ragbot</at> vacation?", CHANNEL, ANN)
    await fake.deliver(bot.url, post)
    await fake.wait_for(lambda: any(m.updates for m in fake.thread(CHANNEL, post["id"])))
    [shown] = fake.thread(CHANNEL, post["id"])
    assert shown.text == "Employees get 25 days [1]." and shown.updates == 1
    assert shown.activity["channelData"] == {"feedbackLoopEnabled": True}
    assert any("AIGeneratedContent" in (e.get("additionalType") or []) for e in shown.activity["entities"])


async def test_a_private_answer_in_a_channel_is_seen_by_the_asker_alone(fake: FakeTeamsConnector, bot: Bot,
                                                                        seen: Recorder) -> None:
    async def answer(message: TeamsMessage) -> None:
        await bot.platform.post_private(ReplyTarget.for_message(message), message.user.id,
                                        message_activity("Only you can see this answer: your budget is 4,000."))

    seen.reply = answer
    post = fake.channel_message("<at>ragbot</at> privately, what is my budget?", CHANNEL, ANN)
    await fake.deliver(bot.url, post)
    [private] = await fake.wait_for(lambda: fake.thread(CHANNEL, post["id"]))
    assert private.seen_by(ANN.id)
    assert not private.seen_by("29:aad-someone-else")
    assert fake.sent_to(CHANNEL)[-1].conversation_id == f"{CHANNEL};messageid={post['id']}"


# ---- streaming in personal chats ------------------------------------------------------------------------------------


async def test_a_personal_chat_answer_streams_informative_then_text_then_final(
        fake: FakeTeamsConnector, bot: Bot, seen: Recorder) -> None:
    async def answer(message: TeamsMessage) -> None:
        stream = await bot.platform.stream(ReplyTarget.for_message(message))
        stream.informative("Searching the documents…")
        stream.append("Employees get ")
        stream.append("25 days [1].")
        # The model writes over seconds: the SDK sends the text so far as a streaming update meanwhile.
        await fake.wait_for(lambda: any((s.stream_info or {}).get("streamType") == "streaming"
                                        for s in fake.sent_to(message.conversation.id)))
        seen.outcome["id"] = await stream.finish(
            "Employees get 25 days [1].",
            citations=[Citation(content="Full-time employees get 25 days.", title="Leave policy",
                                url="https://wiki.example.com/leave")])

    seen.reply = answer
    question = fake.personal_message("How many vacation days?", ANN)
    conversation = question["conversation"]["id"]
    await fake.deliver(bot.url, question)
    await fake.wait_for(lambda: "id" in seen.outcome)
    sent = fake.sent_to(conversation)
    kinds = [(s.type, (s.stream_info or {}).get("streamType")) for s in sent]
    assert kinds[0] == ("typing", "informative") and kinds[-1] == ("message", "final")
    assert ("typing", "streaming") in kinds
    assert {s.id for s in sent} == {seen.outcome["id"]}  # one stream: every update carries its id
    final = sent[-1].activity
    assert final["text"] == "Employees get 25 days [1]."
    assert final["channelData"]["feedbackLoop"] == {"type": "default"}
    [ai] = [e for e in final["entities"] if "AIGeneratedContent" in (e.get("additionalType") or [])]
    assert ai["citation"][0]["appearance"]["name"] == "Leave policy"
    assert [m.text for m in fake.bot_messages(conversation)] == ["Employees get 25 days [1]."]


async def test_a_stream_the_user_stops_sends_nothing_more(fake: FakeTeamsConnector, bot: Bot, seen: Recorder) -> None:
    async def answer(message: TeamsMessage) -> None:
        stream = await bot.platform.stream(ReplyTarget.for_message(message))
        stream.informative("Searching the documents…")
        conversation = message.conversation.id
        await fake.wait_for(lambda: fake.sent_to(conversation))
        fake.stop_streams(conversation)  # the user pressed Stop: Teams answers 403 from now on
        stream.append("Employees get 25 days.")
        seen.outcome["id"] = await stream.finish("Employees get 25 days.")
        seen.outcome["stopped"] = stream.stopped

    seen.reply = answer
    question = fake.personal_message("How many vacation days?", Member("aad-bo", "Bo Chen", email="bo@example.com"))
    await fake.deliver(bot.url, question)
    await fake.wait_for(lambda: "stopped" in seen.outcome)
    assert seen.outcome == {"id": None, "stopped": True}
    sent = fake.sent_to(question["conversation"]["id"])
    assert [(s.stream_info or {}).get("streamType") for s in sent] == ["informative"]
    assert fake.bot_messages(question["conversation"]["id"]) == []


async def test_streaming_is_refused_outside_personal_chats(fake: FakeTeamsConnector, bot: Bot) -> None:
    target = ReplyTarget(fake.service_url, f"{CHANNEL};messageid=1", "channel", fake.tenant_id, "1")
    with pytest.raises(ValueError, match="personal chats"):
        await bot.platform.stream(target)


# ---- members, emails, guests --------------------------------------------------------------------------------------


async def test_a_private_channels_own_members_are_read_page_by_page(fake: FakeTeamsConnector, bot: Bot) -> None:
    people = [Member(f"aad-{n:03d}", f"Person {n}", email=f"p{n}@example.com", tenant_id=fake.tenant_id)
              for n in range(120)]
    fake.add_conversation(PRIVATE_CHANNEL, "channel", members=people, team_id=TEAM, channel_type="private")
    conversation = TeamsConversation(f"{PRIVATE_CHANNEL};messageid=42", "channel", fake.tenant_id, fake.service_url,
                                     team_id=TEAM, channel_type="private")
    assert conversation.is_restricted
    before = len(fake.connector_requests)
    members = await bot.platform.members(conversation, limit=500)
    assert [m.principal_email for m in members] == [f"p{n}@example.com" for n in range(120)]
    pages = [(path, query) for _, path, query in fake.connector_requests[before:] if "agedmembers" in path.lower()]
    assert [path.split("/")[3] for path, _ in pages] == [PRIVATE_CHANNEL, PRIVATE_CHANNEL]  # not the team's roster
    assert [query.get("continuationToken") for _, query in pages] == ["", "100"]
    with pytest.raises(ValueError, match="more than 60 members"):
        await bot.platform.members(conversation, limit=60)


async def test_a_users_email_comes_from_their_object_id_and_guests_are_told_apart(
        fake: FakeTeamsConnector, bot: Bot) -> None:
    chat = "19:group-chat@unq.gbl.spaces"
    guest = Member("aad-guest", "Gia External", user_principal_name="gia_partner.com#EXT#@contoso.onmicrosoft.com",
                   tenant_id=fake.tenant_id, user_role="guest")
    visitor = Member("aad-visitor", "Vic Other", email="vic@other.example", tenant_id="another-tenant")
    fake.add_conversation(chat, "groupChat", members=[
        Member("aad-ann", "Ann Lee", email="ann@example.com", tenant_id=fake.tenant_id), guest, visitor])
    conversation = TeamsConversation(chat, "groupChat", fake.tenant_id, fake.service_url)
    ann = await bot.platform.member(conversation, "aad-ann")
    assert ann is not None and ann.principal_email == "ann@example.com" and ann.identity == "teams:aad-ann"
    assert not ann.is_guest(fake.tenant_id)
    gia = await bot.platform.member(conversation, "aad-guest")
    assert gia is not None and gia.is_guest(fake.tenant_id) and gia.principal_email is None
    vic = await bot.platform.member(conversation, "aad-visitor")
    assert vic is not None and vic.is_guest(fake.tenant_id)
    assert await bot.platform.member(conversation, "aad-nobody") is None


async def test_someone_leaving_a_private_channel_is_reported_and_the_roster_follows(
        fake: FakeTeamsConnector, bot: Bot, seen: Recorder) -> None:
    channel = "19:legal-private@thread.tacv2"
    ann, bo = (Member("aad-ann", "Ann Lee", email="ann@example.com"), Member("aad-bo", "Bo Chen", email="bo@x.com"))
    fake.add_conversation(channel, "channel", members=[ann, bo], team_id=TEAM, channel_type="private")
    status, _ = await fake.deliver(bot.url, fake.membership_update(channel, removed=[bo]))
    assert status == 202
    [change] = seen.membership
    assert (change.conversation.channel_key, change.removed, change.added) == (
        f"teams:{fake.tenant_id}:{channel}", ("29:aad-bo",), ())
    members = await bot.platform.members(change.conversation, limit=10)
    assert [m.identity for m in members] == ["teams:aad-ann"]


async def test_a_feedback_click_reaches_the_bot_and_is_acknowledged(fake: FakeTeamsConnector, bot: Bot,
                                                                   seen: Recorder) -> None:
    fake.add_conversation(f"a:personal-{ANN.aad_object_id}", "personal", members=[ANN])
    click = fake.feedback_invoke("1700000000001", f"a:personal-{ANN.aad_object_id}", ANN, "dislike",
                                 feedback="Out of date")
    status, _ = await fake.deliver(bot.url, click)
    assert status == 200
    assert [(f.reaction, f.text, f.message_id, f.user.identity) for f in seen.feedback] == [
        ("dislike", "Out of date", "1700000000001", "teams:aad-ann")]


async def test_the_sdk_reaches_only_the_documented_sign_in_endpoints(fake: FakeTeamsConnector, bot: Bot,
                                                                     seen: Recorder) -> None:
    """Receiving and answering a message used the Bot Framework keys and the tenant's token endpoint (with the
    Bot Connector scope) through the proxy, and nothing else left through it."""
    seen.reply = lambda m: echo(bot, m)
    question = fake.personal_message("ping", ANN)
    await fake.deliver(bot.url, question)
    await fake.wait_for(lambda: fake.bot_messages(question["conversation"]["id"]))
    assert fake.refused_hosts == []
    paths = {(host, path) for _, host, path in fake.identity_requests}
    # The keys may have been fetched by an earlier test: the SDK keeps one key client per address per process.
    documented = {("login.botframework.com", "/v1/.well-known/keys"),
                  ("login.botframework.com", "/v1/.well-known/openidconfiguration"),
                  ("login.microsoftonline.com", f"/{fake.tenant_id}/v2.0/.well-known/openid-configuration"),
                  ("login.microsoftonline.com", f"/{fake.tenant_id}/discovery/v2.0/keys"),
                  ("login.microsoftonline.com", f"/{fake.tenant_id}/oauth2/v2.0/token")}
    assert paths <= documented, paths - documented
    assert ("login.microsoftonline.com", f"/{fake.tenant_id}/oauth2/v2.0/token") in paths
    assert all(r.get("scope") == "https://api.botframework.com/.default" for r in fake.token_requests)

