"""Delivery after a crash (issue 30): a claimed question is a lease. A process that dies mid-answer (here: its
answer step is cancelled after the placeholder is up, which is what kill -9 leaves behind — no apology, no
delivery, the claim never released) does not lose the question: once the lease runs out, Slack's retry of the same
event, or the sweeper of the next `ragbot run`, answers it in the SAME placeholder; while the lease is live, or once
the answer was delivered, a retry is dropped; and of two replicas racing for one expired claim exactly one answers.

Real Postgres, the real slack-bolt app over signed HTTP against tests/fakes/slack_api.py, the real discord.py client
against tests/fakes/discord_api.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import corpus_opener
from fakes.anthropic_api import FakeAnthropicAPI
from fakes.discord_gateway import DiscordHarness
from fakes.slack_api import FakeSlackAPI
from slack_harness import answer_in, finished, mention, new_ts, running_bot, settle, wait_for

from bot.chat.state import BotState
from bot.discord.adapter import RagbotDiscord, configure_api_url
from bot.server import BotMetrics
from bot.settings import BotSettings

ANN = "UANN"
QUESTION = "How many vacation days do full-time employees get?"
RETRY = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
CORPUS = {
    "policies/vacation.md": (
        "# Vacation policy\n\nFull-time employees get 25 days of paid vacation per year. Up to 5 unused vacation "
        "days carry over into the next year.\n"
    ),
    "it/vpn.md": "# VPN setup\n\nInstall the WireGuard client and import the configuration from the IT portal.\n",
}


class CrashesMidAnswer:
    """The real knowledge base, in a process that dies in the middle of an answer: after the placeholder is posted
    (and, with `partial`, after the first words were streamed into the chat) the answer step is cancelled — as
    kill -9 leaves it: no apology, nothing delivered, the claim not released."""

    def __init__(self, kb: Any, partial: str | None = None) -> None:
        self._kb = kb
        self.partial = partial
        self.crashed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kb, name)

    async def answer(self, *args: Any, on_text: Any = None, **kwargs: Any) -> Any:
        if on_text is not None and self.partial:
            await on_text(self.partial)
            await asyncio.sleep(0.3)  # the first words reach the chat
            await on_text(" ")
        self.crashed.set()
        raise asyncio.CancelledError("the process died")


@pytest_asyncio.fixture
async def lease_kb(kb_factory, tmp_path: Path):  # type: ignore[no-untyped-def]
    return await corpus_opener(kb_factory, tmp_path, CORPUS)()


@pytest.fixture
def fake() -> Any:
    with FakeSlackAPI() as fake:
        fake.add_user(ANN, email="ann@example.com")
        yield fake


def channel() -> str:
    return f"C{new_ts().replace('.', '')[-9:]}"


async def crash_after_placeholder(kb: Any, fake: FakeSlackAPI, event: dict[str, Any], event_id: str,
                                  lease_seconds: float) -> str:
    """A `ragbot run` that acks the mention, posts "Searching the documents…" and dies. Returns the placeholder ts."""
    crashing = CrashesMidAnswer(kb)
    async with running_bot(crashing, fake, answer_lease_seconds=lease_seconds, answer_sweep_seconds=0) as dead:
        assert await dead.send_event(event, event_id=event_id) == 200
        await asyncio.wait_for(crashing.crashed.wait(), 30)
    [placeholder] = fake.thread(event["channel"], event["ts"])
    assert "Searching" in placeholder.visible_text and not finished(placeholder)
    return placeholder.ts


async def test_after_a_crash_slacks_retry_answers_in_the_same_placeholder(lease_kb, fake) -> None:
    event = mention(QUESTION, user=ANN, channel=channel())
    placeholder_ts = await crash_after_placeholder(lease_kb, fake, event, "EvCrash1", lease_seconds=0.3)
    await asyncio.sleep(0.4)  # the dead holder's lease runs out
    async with running_bot(lease_kb, fake, answer_sweep_seconds=0) as slack:  # the restarted bot
        assert await slack.send_event(event, event_id="EvCrash1", headers=RETRY) == 200
        answer = await answer_in(fake, event["channel"], event["ts"])
        await settle()
        # Answered now: a later retry of the same event is dropped.
        assert await slack.send_event(event, event_id="EvCrash1", headers={**RETRY, "X-Slack-Retry-Num": "2"}) == 200
        await settle()
        metrics = await (await slack.http.get(f"{slack.url}/metrics")).text()
    assert answer.ts == placeholder_ts
    assert [c.args["ts"] for c in fake.calls_to("chat.update")] == [placeholder_ts]
    assert len(fake.calls_to("chat.postMessage")) == 1  # no second placeholder
    assert "25 days" in answer.visible_text and "[1]" in answer.visible_text
    assert len(fake.thread(event["channel"], event["ts"])) == 1
    assert 'ragbot_resumed_answers_total{by="retry",platform="slack"} 1.0' in metrics
    assert 'ragbot_duplicate_events_total{platform="slack"} 1.0' in metrics


async def test_a_retry_while_the_lease_is_live_is_dropped(lease_kb, fake) -> None:
    event = mention(QUESTION, user=ANN, channel=channel())
    placeholder_ts = await crash_after_placeholder(lease_kb, fake, event, "EvLive1", lease_seconds=120)
    async with running_bot(lease_kb, fake, answer_sweep_seconds=0.2) as slack:
        assert await slack.send_event(event, event_id="EvLive1", headers=RETRY) == 200
        await settle(1.0)  # the sweeper ran too: the lease is live, so neither answers
    assert fake.calls_to("chat.update") == []
    assert len(fake.calls_to("chat.postMessage")) == 1
    [still] = fake.thread(event["channel"], event["ts"])
    assert still.ts == placeholder_ts and "Searching" in still.visible_text


async def test_a_retry_after_delivery_is_dropped_even_once_the_lease_ran_out(lease_kb, fake) -> None:
    event = mention(QUESTION, user=ANN, channel=channel())
    async with running_bot(lease_kb, fake, answer_lease_seconds=0.3, answer_sweep_seconds=0.1) as slack:
        assert await slack.send_event(event, event_id="EvOnce1") == 200
        await answer_in(fake, event["channel"], event["ts"])
        await asyncio.sleep(0.5)  # well past the lease: delivered is delivered
        for attempt in (1, 2, 3):
            headers = {**RETRY, "X-Slack-Retry-Num": str(attempt)}
            assert await slack.send_event(event, event_id="EvOnce1", headers=headers) == 200
        await settle(0.6)
    assert len(fake.calls_to("chat.postMessage")) == 1 and len(fake.calls_to("chat.update")) == 1


async def test_the_start_up_sweeper_finishes_an_expired_claim_in_its_slack_placeholder(lease_kb, fake) -> None:
    event = mention(QUESTION, user=ANN, channel=channel())
    placeholder_ts = await crash_after_placeholder(lease_kb, fake, event, "EvSweep1", lease_seconds=0.3)
    await asyncio.sleep(0.4)
    async with running_bot(lease_kb, fake, answer_sweep_seconds=30) as slack:  # only its start-up sweep can do it
        answer = await answer_in(fake, event["channel"], event["ts"])
        # Slack's retry arrives after the sweeper answered: dropped.
        assert await slack.send_event(event, event_id="EvSweep1", headers=RETRY) == 200
        await settle()
    assert answer.ts == placeholder_ts and "25 days" in answer.visible_text
    assert [c.args["ts"] for c in fake.calls_to("chat.update")] == [placeholder_ts]
    assert len(fake.calls_to("chat.postMessage")) == 1


async def test_two_replicas_racing_for_one_expired_claim_answer_it_once(lease_kb, fake) -> None:
    event = mention(QUESTION, user=ANN, channel=channel())
    placeholder_ts = await crash_after_placeholder(lease_kb, fake, event, "EvRace1", lease_seconds=0.3)
    await asyncio.sleep(0.4)
    async with running_bot(lease_kb, fake, answer_sweep_seconds=0) as one, \
            running_bot(lease_kb, fake, answer_sweep_seconds=0) as two:
        flows = [bot.app.adapters[0] for bot in (one, two)]
        swept = await asyncio.gather(*(a.flow.sweep(a.resume) for a in flows),
                                     # and Slack's retry reaching each replica at the same moment
                                     one.send_event(event, event_id="EvRace1", headers=RETRY),
                                     two.send_event(event, event_id="EvRace1", headers=RETRY))
        await answer_in(fake, event["channel"], event["ts"])
        await settle(1.0)
    assert sorted(swept[:2]) in ([0, 0], [0, 1])  # one sweeper at most (the retry may have won)
    assert [c.args["ts"] for c in fake.calls_to("chat.update")] == [placeholder_ts]  # exactly one answer
    assert len(fake.calls_to("chat.postMessage")) == 1


async def test_concurrent_takeovers_of_one_expired_lease_have_one_winner(lease_kb) -> None:
    claim = await BotState(lease_kb.engine).claim_lease(["slack:event:EvSql", "slack:msg:T:C:1.1"], "dead-holder", 0.1)
    assert claim is not None and not claim.resumed
    assert await BotState(lease_kb.engine).record_lease_question(claim, platform="slack", question=QUESTION, conversation_id="c",
                                                asker="slack:U", target={"channel": "C"}, lease_seconds=0.1)
    await asyncio.sleep(0.2)
    taken = await asyncio.gather(
        *(BotState(lease_kb.engine).take_expired_lease("slack", f"sweeper{i}", 60, max_attempts=3, max_age_seconds=600)
          for i in range(6)),
        *(BotState(lease_kb.engine).claim_lease(["slack:event:EvSql", "slack:msg:T:C:1.1"], f"retry{i}", 60) for i in range(6)),
    )
    winners = [t for t in taken if t is not None]
    assert len(winners) == 1
    # The dead holder can no longer deliver, nor renew, nor store a placeholder.
    assert not await BotState(lease_kb.engine).renew_lease(claim, 60) and not await BotState(lease_kb.engine).mark_lease_delivered(claim)


# ---- Discord: a message is never redelivered, so the sweeper finishes it -------------------------------------------


async def test_the_sweeper_finishes_a_discord_answer_in_the_message_the_dead_process_started(lease_kb, discord_api):
    dm = 710000000000000077
    alice = 700000000000000100
    discord_api.add_channel(dm, None)
    bots: list[RagbotDiscord] = []

    async def start(kb: Any, **overrides: Any) -> DiscordHarness:
        settings = BotSettings(_env_file=None, discord_bot_token=discord_api.token,  # type: ignore[call-arg]
                               discord_api_url=discord_api.base_url, discord_edit_interval_seconds=0.0, **overrides)
        configure_api_url(settings.discord_api_url)
        bot = RagbotDiscord(kb, settings, BotMetrics())
        bots.append(bot)
        await bot.login(discord_api.token)  # setup_hook: commands synced, the sweeper started
        return DiscordHarness(bot, discord_api)

    try:
        crashing = CrashesMidAnswer(lease_kb, partial="Full-time employees get")
        dead = await start(crashing, answer_lease_seconds=0.3, answer_sweep_seconds=0)
        await dead.message(QUESTION, channel_id=dm, guild_id=None, author_id=alice)
        await asyncio.wait_for(crashing.crashed.wait(), 30)
        [started] = discord_api.bot_messages(dm)
        assert started["content"].startswith("Full-time employees get")  # the first words, then the crash
        await bots[0].close()
        await asyncio.sleep(0.4)

        await start(lease_kb, answer_sweep_seconds=30)  # the restarted bot: its start-up sweep answers

        def answered() -> bool:
            return any(m.get("components") for m in discord_api.bot_messages(dm))

        await wait_for(answered, 30, "the swept answer")
    finally:
        for bot in bots:
            await bot.close()
    [answer] = discord_api.bot_messages(dm)  # the same message, edited: no second one
    assert answer["id"] == started["id"]
    assert "25 days of paid vacation" in answer["content"] and answer["embeds"]
    assert discord_api.calls_to("PATCH", f"/channels/{dm}/messages/{started['id']}")


# ---- issue 38: private answers are claimed too; a short lease kept alive by a heartbeat ----------------------------


def ephemeral_answers(fake: FakeSlackAPI, user: str) -> list[Any]:
    return [m for m in fake.ephemeral if m.user == user and "25 days" in m.visible_text]


async def test_a_private_slack_answer_lost_in_a_crash_is_finished_ephemerally_by_the_sweeper(lease_kb, fake) -> None:
    event = mention(f"privately, {QUESTION}", user=ANN, channel=channel())
    crashing = CrashesMidAnswer(lease_kb)
    async with running_bot(crashing, fake, answer_lease_seconds=0.3, answer_sweep_seconds=0) as dead:
        assert await dead.send_event(event, event_id="EvPrivate1") == 200
        await asyncio.wait_for(crashing.crashed.wait(), 30)
    assert fake.ephemeral == [] and fake.thread(event["channel"], event["ts"]) == []  # the crash left nothing
    await asyncio.sleep(0.4)
    async with running_bot(lease_kb, fake, answer_sweep_seconds=30) as slack:  # the restarted bot's start-up sweep
        [answer] = await wait_for(lambda: ephemeral_answers(fake, ANN), 30, "the private answer")
        assert await slack.send_event(event, event_id="EvPrivate1", headers=RETRY) == 200  # answered: dropped
        await settle()
    assert len(fake.ephemeral) == 1  # once, to Ann alone, in the question's thread, with "Share in channel"
    assert answer.channel == event["channel"] and answer.thread_ts == event["ts"]
    assert any(b.get("block_id") == "ragbot_share" for b in answer.blocks)
    assert fake.calls_to("chat.postMessage") == [] and fake.calls_to("chat.update") == []  # nothing public


async def test_a_retry_of_a_private_question_after_its_holder_died_answers_it_ephemerally(lease_kb, fake) -> None:
    event = mention(f"privately, {QUESTION}", user=ANN, channel=channel())
    crashing = CrashesMidAnswer(lease_kb)
    async with running_bot(crashing, fake, answer_lease_seconds=0.3, answer_sweep_seconds=0) as dead:
        assert await dead.send_event(event, event_id="EvPrivate2") == 200
        await asyncio.wait_for(crashing.crashed.wait(), 30)
    await asyncio.sleep(0.4)
    async with running_bot(lease_kb, fake, answer_sweep_seconds=0) as slack:
        assert await slack.send_event(event, event_id="EvPrivate2", headers=RETRY) == 200
        await wait_for(lambda: ephemeral_answers(fake, ANN), 30, "the private answer")
        await settle()
    assert len(fake.ephemeral) == 1 and fake.calls_to("chat.postMessage") == []


def test_the_default_lease_finishes_a_dead_processs_answer_within_15_seconds() -> None:
    settings = BotSettings(_env_file=None)  # type: ignore[call-arg]
    assert settings.answer_lease_seconds + settings.answer_sweep_seconds <= 15
    assert 0 < settings.answer_heartbeat_seconds <= settings.answer_lease_seconds / 3


class SlowAnswer:
    """The real knowledge base, answering slower than the lease lasts (a long Claude answer)."""

    def __init__(self, kb: Any, seconds: float) -> None:
        self._kb = kb
        self.seconds = seconds
        self.started = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kb, name)

    async def answer(self, *args: Any, **kwargs: Any) -> Any:
        self.started.set()
        await asyncio.sleep(self.seconds)
        return await self._kb.answer(*args, **kwargs)


async def test_a_surviving_replica_takes_over_when_the_holder_stops_heartbeating(lease_kb, fake) -> None:
    """Two replicas: one dies mid-answer (its heartbeat stops with it); the other, already running, finishes the
    answer in the same placeholder with its periodic sweep, once the short lease has run out."""
    event = mention(QUESTION, user=ANN, channel=channel())
    crashing = CrashesMidAnswer(lease_kb)
    timing = dict(answer_lease_seconds=0.6, answer_heartbeat_seconds=0.2)
    async with running_bot(lease_kb, fake, answer_sweep_seconds=0.3, **timing) as survivor:
        async with running_bot(crashing, fake, answer_sweep_seconds=0, **timing) as dead:
            assert await dead.send_event(event, event_id="EvBeat1") == 200
            await asyncio.wait_for(crashing.crashed.wait(), 30)
        answer = await answer_in(fake, event["channel"], event["ts"])
        await settle()
        metrics = await (await survivor.http.get(f"{survivor.url}/metrics")).text()
    [placeholder] = fake.thread(event["channel"], event["ts"])
    assert answer.ts == placeholder.ts and "25 days" in answer.visible_text
    assert len(fake.calls_to("chat.update")) == 1
    assert 'ragbot_resumed_answers_total{by="sweeper",platform="slack"} 1.0' in metrics


async def test_a_live_answer_slower_than_the_lease_is_not_taken_over(lease_kb, fake) -> None:
    """The holder heartbeats while it answers for several lease lengths: neither a second replica's sweeper nor
    Slack's retry (arriving after the lease would have run out without the heartbeat) answers it again."""
    event = mention(QUESTION, user=ANN, channel=channel())
    slow = SlowAnswer(lease_kb, seconds=2.0)
    timing = dict(answer_lease_seconds=0.5, answer_heartbeat_seconds=0.1)
    async with running_bot(lease_kb, fake, answer_sweep_seconds=0.1, **timing) as other, \
            running_bot(slow, fake, answer_sweep_seconds=0.1, **timing) as holder:
        assert await holder.send_event(event, event_id="EvSlow1") == 200
        await asyncio.wait_for(slow.started.wait(), 30)
        await asyncio.sleep(1.0)  # twice the lease: without a heartbeat it would have run out
        assert await other.send_event(event, event_id="EvSlow1", headers=RETRY) == 200
        answer = await answer_in(fake, event["channel"], event["ts"])
        await settle(1.0)
        metrics = [await (await bot.http.get(f"{bot.url}/metrics")).text() for bot in (holder, other)]
    assert "25 days" in answer.visible_text
    assert len(fake.calls_to("chat.postMessage")) == 1 and len(fake.calls_to("chat.update")) == 1
    assert all("ragbot_resumed_answers_total{" not in text for text in metrics)  # never taken over


async def test_a_busy_pool_does_not_let_a_live_slow_answer_be_taken_over_and_paid_twice(
    kb_factory, tmp_path: Path, fake
) -> None:
    """Under load every connection of the holder's pool is in use (answers, a sync) while Claude is still writing a
    long answer. The heartbeat must still renew the lease: else it expires under the live holder, a second replica's
    sweeper takes the question over and asks Claude again (the fencing keeps the reply single, but the LLM is paid
    twice). Here the pool is held busy for 2.5 lease lengths while the fake Anthropic server takes 2.6 s to
    answer: Claude is asked once, the answer is posted once, and nobody took it over."""
    claude_seconds = 2.6
    with FakeAnthropicAPI() as claude:
        reply = "Full-time employees get 25 days of paid vacation per year [1]."
        claude.default = lambda request: (time.sleep(claude_seconds), reply)[1]  # in the fake's own thread
        llm = dict(anthropic_api_key="sk-ant-test", anthropic_base_url=claude.url, anthropic_max_retries=0,
                   anthropic_timeout_seconds=20)
        holder_kb = await corpus_opener(kb_factory, tmp_path, CORPUS)(**llm)
        other_kb = await kb_factory(holder_kb.url, **llm)  # a second replica: its own process, so its own pools
        event = mention(QUESTION, user=ANN, channel=channel())
        timing = dict(answer_lease_seconds=0.8, answer_heartbeat_seconds=0.2)
        async with running_bot(other_kb, fake, answer_sweep_seconds=0.1, **timing) as other, \
                running_bot(holder_kb, fake, answer_sweep_seconds=0, **timing) as holder:
            assert await holder.send_event(event, event_id="EvBusy1") == 200
            await wait_for(lambda: claude.requests, what="the holder's request to Claude")
            pool = holder_kb.engine.pool
            busy = [await holder_kb.engine.connect() for _ in range(10)]  # db.engine.create_engine: 5 + 5 overflow
            assert pool.checkedout() == 10  # every connection taken: a checkout now waits for one to come back
            await asyncio.sleep(2.0)  # two and a half lease lengths, still before Claude's reply
            for conn in busy:
                await conn.close()
            answer = await answer_in(fake, event["channel"], event["ts"])
            await settle(1.0)
            metrics = [await (await bot.http.get(f"{bot.url}/metrics")).text() for bot in (holder, other)]
    assert "25 days" in answer.visible_text
    assert len(claude.requests) == 1  # Claude asked once: the question was never taken over
    assert len(fake.thread(event["channel"], event["ts"])) == 1  # one reply in the thread
    assert all("ragbot_resumed_answers_total{" not in text for text in metrics)


async def test_a_private_discord_ask_lost_in_a_crash_is_finished_ephemerally_through_its_interaction(
    lease_kb, discord_api
):
    guild, channel_id, alice = 700000000000000001, 700000000000000010, 700000000000000100
    bots: list[RagbotDiscord] = []

    async def start(kb: Any, **overrides: Any) -> DiscordHarness:
        settings = BotSettings(_env_file=None, discord_bot_token=discord_api.token,  # type: ignore[call-arg]
                               discord_api_url=discord_api.base_url, discord_guild_id=guild,
                               discord_edit_interval_seconds=0.0, **overrides)
        configure_api_url(settings.discord_api_url)
        bot = RagbotDiscord(kb, settings, BotMetrics())
        bots.append(bot)
        await bot.login(discord_api.token)
        harness = DiscordHarness(bot, discord_api)
        harness.guild_create(guild, [channel_id])
        return harness

    try:
        crashing = CrashesMidAnswer(lease_kb, partial="Full-time employees get")
        dead = await start(crashing, answer_lease_seconds=0.3, answer_sweep_seconds=0)
        command = next(c for c in discord_api.commands[str(guild)] if c["name"] == "ask")
        assert {o["name"] for o in command["options"]} >= {"question", "private"}
        payload = await dead.slash("ask", [{"type": 3, "name": "question", "value": QUESTION},
                                           {"type": 5, "name": "private", "value": True}],
                                   guild_id=guild, channel_id=channel_id, user_id=alice)
        await asyncio.wait_for(crashing.crashed.wait(), 30)
        [started] = discord_api.interaction_messages(payload["token"])
        assert started["content"].startswith("Full-time employees get")  # the first words, then the crash
        await bots[0].close()
        await asyncio.sleep(0.4)

        await start(lease_kb, answer_sweep_seconds=30)  # the restarted bot: its start-up sweep answers

        def answered() -> bool:
            return any(m.get("components") for m in discord_api.interaction_messages(payload["token"]))

        await wait_for(answered, 30, "the swept private answer")
    finally:
        for bot in bots:
            await bot.close()
    [answer] = discord_api.interaction_messages(payload["token"])  # the same follow-up, edited
    assert answer["id"] == started["id"] and "25 days of paid vacation" in answer["content"]
    assert (answer.get("flags") or 0) & 64  # still ephemeral: only Alice sees it
    buttons = [c["custom_id"] for row in answer["components"] for c in row["components"]]
    assert any(b.startswith("ragbot:share:") for b in buttons)  # a private answer: "Share in channel"
    assert discord_api.calls_to("PATCH", f"/webhooks/{payload['application_id']}/{payload['token']}/messages/")


async def test_a_discord_ask_whose_interaction_token_expired_is_dropped_not_answered(lease_kb, discord_api):
    """Discord's interaction tokens last 15 minutes: an `/ask` left pending longer is settled without a call."""
    from sqlalchemy import text

    state = BotState(lease_kb.engine)
    claim = await state.claim_lease(["discord:interaction:4242"], "dead-holder", 0.1)
    assert claim is not None
    expired = {"application": "1", "token": "itok_expired", "ephemeral": True, "share": True,
               "expires": time.time() - 1}
    assert await state.record_lease_question(
        claim, platform="discord", question=QUESTION, conversation_id="discord:1:2:ask:4242", asker="discord:7",
        target={"channel": "2", "guild": "1", "audience_channel": None, "interaction": expired}, lease_seconds=0.1,
    )
    await asyncio.sleep(0.2)
    settings = BotSettings(_env_file=None, discord_bot_token=discord_api.token,  # type: ignore[call-arg]
                           discord_api_url=discord_api.base_url, answer_sweep_seconds=30)
    configure_api_url(settings.discord_api_url)
    bot = RagbotDiscord(lease_kb, settings, BotMetrics())
    try:
        await bot.login(discord_api.token)  # its start-up sweep takes the claim over, and drops it
        for _ in range(600):
            async with lease_kb.engine.connect() as conn:
                row = (await conn.execute(text("SELECT delivered_at, target FROM bot_events WHERE key = :k"),
                                          {"k": claim.key})).one()
            if row.delivered_at is not None:
                break
            await asyncio.sleep(0.05)
    finally:
        await bot.close()
    assert row.delivered_at is not None and row.target is None  # settled, the token dropped with it
    assert discord_api.calls_to("POST", "/webhooks/") == [] and discord_api.calls_to("PATCH", "/webhooks/") == []
