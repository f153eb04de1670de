"""The Slack, Teams and Discord bots' own cost: event in → LLM request sent, the ack, and `ragbot run`'s RSS.

    PYTHONPATH=. .venv/bin/python bench/bot_bench.py                  # 100 mentions each + `ragbot run` RSS
    PYTHONPATH=. .venv/bin/python bench/bot_bench.py --mentions 300 --skip-rss
    PYTHONPATH=. .venv/bin/python bench/bot_bench.py --mentions 20 --teams-mentions 20 --discord-mentions 20 --skip-rss

1. Overhead and ack, in process. The handbook (examples/handbook) is synced into a throwaway database; the real
   bot is built by the composition root `ragbot run` uses (`bot.app.BotApp`: the slack-bolt AsyncApp of
   bot/slack/adapter.py in HTTP mode, behind the aiohttp server on a real port), talking to the fake Slack Web API
   (tests/fakes/slack_api.py) and to Claude through the real anthropic SDK pointed at the fake Anthropic server
   (tests/fakes/anthropic_api.py). Answerable questions from examples/handbook/eval.jsonl are sent one after
   another as signed `app_mention` events, each in a channel of its own (a new thread, no history), and each
   answer is awaited before the next mention.
   - overhead = the moment the app's handler of POST /slack/events (`SlackAdapter.handle_http`, which hands the
     request to bolt) starts → the moment the fake Anthropic server has read the Messages request. Between
     them: bolt's signature check and dispatch, the
     exactly-once claim in Postgres, the channel's audience, conversation memory, retrieval (the query embedded,
     the hybrid SQL) and the prompt, and the SDK's request. Also reported from the moment the client sends the
     POST (`overhead_from_post_*`: adds the HTTP round trip into aiohttp).
   - ack = the client sends the signed POST → it has read the HTTP 200.
   - floor, in the same run, interleaved with the mentions: the product's bare `KnowledgeBase.search` for the
     same question with the same principals and k (query embedding included), i.e. what part is retrieval.
   The product's query-vector cache is emptied before every mention and every floor search, so each question
   is embedded, as a first-time question is. The fake servers run in threads of this process (as in the tests), so
   the LLM request's arrival is stamped with the same clock.
1b. Teams (`--teams-mentions`) and 1c. Discord (`--discord-mentions`): the same overhead through each platform's real
   client library and its fake (see `measure_teams_overhead`, `measure_discord_overhead`).
2. RSS: the real `ragbot run` (bot/cli/main.py) as a subprocess in HTTP mode, configured only through environment
   variables (SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, SLACK_API_URL → the fake Slack, ANTHROPIC_API_KEY,
   ANTHROPIC_BASE_URL → the fake Anthropic, DATABASE_URL → the handbook database of step 1, PORT). Once /healthz
   answers 200 (which needs the embedding model loaded), a few mentions are answered; then the peak RSS (VmHWM in
   /proc/<pid>/status) of the bot process, and beside it the Postgres server's processes (the postmaster and its
   backends: their RSS summed, which counts shared buffers once per process, and their PSS summed, which does not).

Results go to bench/results/bot.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# This file is named bot.py: with bench/ first on the path, `import bot` would find it instead of the bot package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE.parent / "tests"))  # the fake servers and the Slack test harness
sys.path.append(str(HERE))  # bench/common.py

from common import (  # noqa: E402
    REPO,
    database_versions,
    drop_database,
    machine_info,
    open_fresh_kb,
    summary,
    timer,
    use_throwaway_home,
    write_results,
)

use_throwaway_home()

import aiohttp  # noqa: E402
from fakes.anthropic_api import FakeAnthropicAPI, RecordedRequest, ScriptedResponse  # noqa: E402
from fakes.slack_api import FakeSlackAPI  # noqa: E402
from slack_harness import SECRET, SlackClient, answer_in, mention, new_ts, settings_for  # noqa: E402

TARGETS = {"overhead_p95_ms": 150.0, "ack_p95_ms": 50.0, "rss_mb": 1024.0}
DATABASE = "ragbot_bench_bot"
TEAMS_DATABASE = "ragbot_bench_bot_teams"
DISCORD_DATABASE = "ragbot_bench_bot_discord"
HANDBOOK = REPO / "examples" / "handbook"
ASKER = "UBENCH"
REPLY = "Full-time employees get 15 days of PTO in their first year [1]."
STAGES = {  # stages_ms keys → what they cover (bench/report.py prints the same labels)
    "post_to_handler": "client POST → the app's handler starts",
    "handler_to_kb_answer": "handler → KnowledgeBase.answer called (dispatch, claim, audience)",
    "memory": "conversation memory (history, standalone query)",
    "retrieval": "retrieval (query embedding + hybrid SQL)",
    "after_retrieval": "prompt building + the SDK's request, until the server has it",
    "overhead_without_retrieval": "overhead minus retrieval: the bot's own part",
    "floor_embed": "floor: query embedding",
    "floor_sql": "floor: after the question is embedded (SQL, fusion)",
}


class TimedAnthropic(FakeAnthropicAPI):
    """The fake Anthropic server, noting when each request was read (perf_counter, same process)."""

    def __init__(self) -> None:
        super().__init__(default_text=REPLY)
        self.received_at: list[float] = []

    def respond(self, request: RecordedRequest) -> ScriptedResponse:
        self.received_at.append(timer())
        return super().respond(request)


def questions() -> list[str]:
    """The answerable questions of the handbook's eval set (an unanswerable one may abstain before any LLM call)."""
    rows = [json.loads(line) for line in (HANDBOOK / "eval.jsonl").read_text().splitlines() if line.strip()]
    return [row["question"] for row in rows if row.get("relevant")]


# --- 1. overhead and ack, in process ------------------------------------------------------------------------


async def measure_overhead(mentions: int, warmup: int, profile: str | None = None) -> dict[str, Any]:
    from bot.app import BotApp
    from bot.slack.adapter import SlackAdapter
    from knowledge.search.retrieval import SearchFilters

    handler_started: list[float] = []
    original_handle = SlackAdapter.handle_http

    async def timed_handle(self: SlackAdapter, request: Any) -> Any:  # before the app's handler hands it to bolt
        handler_started.append(timer())
        return await original_handle(self, request)

    SlackAdapter.handle_http = timed_handle  # type: ignore[method-assign]

    with FakeSlackAPI() as slack, TimedAnthropic() as claude:
        slack.add_user(ASKER, email="bench@example.com")
        kb = await open_fresh_kb(DATABASE, anthropic_api_key="sk-ant-bench", anthropic_base_url=claude.url,
                                 anthropic_max_retries=0)
        started = timer()
        report = await kb.sync(await kb.folder_source(HANDBOOK, "handbook"))
        sync_s = timer() - started
        status = await kb.status()
        print(f"   handbook synced: {status.documents} documents, {status.chunks} chunks in {sync_s:.1f} s")
        if report.failed:
            print(f"   (files that failed: {report.failed})")

        # What kb.answer saw: when it was called and its stage timings (memory, retrieval).
        answer_calls: list[tuple[float, dict[str, float]]] = []
        original_answer = kb.answer

        async def timed_answer(*args: Any, **kwargs: Any) -> Any:
            called = timer()
            answer = await original_answer(*args, **kwargs)
            answer_calls.append((called, dict(answer.timings)))
            return answer

        kb.answer = timed_answer  # type: ignore[method-assign]

        # The composition root of `ragbot run`, with this knowledge base; its sweeper off, as in the Teams and Discord
        # cases: on a loaded machine a first answer that outlives its lease was answered a second time by the sweeper
        # (two LLM requests for one mention), which is no part of the overhead measured here.
        app = BotApp(settings_for(slack, answer_sweep_seconds=0), kb=kb)
        await app.start()
        asked = questions()
        principals = ("everyone",)  # a channel without grants: what the bot searches with (bot.chat.access)
        samples: dict[str, list[float]] = {k: [] for k in (
            "overhead", "overhead_from_post", "ack", "handler_start", "before_answer", "memory", "retrieval",
            "after_retrieval", "without_retrieval", "floor", "floor_embed", "floor_sql")}
        no_llm_call = 0
        profiler = None
        try:
            async with aiohttp.ClientSession() as http:
                client = SlackClient(app, http, slack)
                for i in range(warmup + mentions):
                    if profile and i == warmup:
                        import cProfile

                        profiler = cProfile.Profile()
                        profiler.enable()
                    question = asked[i % len(asked)]
                    channel, ts = f"CB{i:05d}", new_ts()
                    slack.add_channel(channel, private=False, members=[ASKER])  # its audience: a public channel
                    kb.retriever._query_vectors.clear()  # a first-time question: embedded, not cached
                    requests_before = len(claude.received_at)
                    handler_before, answers_before = len(handler_started), len(answer_calls)
                    sent = timer()
                    status_code = await client.send_event(mention(question, user=ASKER, channel=channel, ts=ts))
                    acked = timer()
                    if status_code != 200:
                        raise RuntimeError(f"the bot answered the event with HTTP {status_code}")
                    await answer_in(slack, channel, ts, timeout=60)
                    while len(answer_calls) == answers_before:  # the answer is posted just before kb.answer returns
                        await asyncio.sleep(0.005)
                    if len(claude.received_at) == requests_before:
                        no_llm_call += 1  # abstained before asking Claude: not an overhead sample
                        continue
                    if len(claude.received_at) != requests_before + 1 or len(handler_started) != handler_before + 1:
                        raise RuntimeError("expected exactly one handled request and one LLM request per mention")
                    llm_at = claude.received_at[requests_before]
                    handled_at = handler_started[handler_before]
                    called_at, timings = answer_calls[answers_before]
                    if question not in claude.requests[requests_before].user_text:
                        raise RuntimeError("the LLM request does not carry the question that was asked")

                    # The floor: the same search, bare, right after (same question, principals and k).
                    kb.retriever._query_vectors.clear()
                    floor_started = timer()
                    results = await kb.search(question, SearchFilters(principals), k=kb.settings.context_chunks)
                    floor_ms = (timer() - floor_started) * 1000
                    if i < warmup:
                        continue
                    samples["overhead"].append((llm_at - handled_at) * 1000)
                    samples["overhead_from_post"].append((llm_at - sent) * 1000)
                    samples["ack"].append((acked - sent) * 1000)
                    samples["handler_start"].append((handled_at - sent) * 1000)
                    samples["before_answer"].append((called_at - handled_at) * 1000)
                    samples["memory"].append(timings.get("memory_ms", 0.0))
                    samples["retrieval"].append(timings.get("retrieval_ms", 0.0))
                    samples["after_retrieval"].append(
                        (llm_at - called_at) * 1000 - timings.get("memory_ms", 0.0) - timings.get("retrieval_ms", 0.0))
                    samples["without_retrieval"].append(
                        (llm_at - handled_at) * 1000 - timings.get("retrieval_ms", 0.0))
                    samples["floor"].append(floor_ms)
                    samples["floor_embed"].append(results.timings.get("embed_ms", 0.0))
                    samples["floor_sql"].append(floor_ms - results.timings.get("embed_ms", 0.0))
        finally:
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(profile)  # type: ignore[arg-type]
                print(f"   profile of the event loop's thread written to {profile} (read it with pstats)")
            await app.stop()
            SlackAdapter.handle_http = original_handle  # type: ignore[method-assign]
            embedder = kb.embedder
            encoders = {
                "sentence_transformers_loaded": "model" in vars(embedder),
                "query_encoder": "numpy (knowledge/embedding/numpy_encoder.py)" if embedder._use_light(["q"])
                else "sentence-transformers",
            }
            versions = await database_versions(kb.engine)
            database_url = kb.url
            await kb.close()

    stats = {name: summary(values) for name, values in samples.items()}
    figures: dict[str, Any] = {
        "mentions": len(samples["overhead"]),
        "warmup_mentions": warmup,
        "mentions_without_llm_call": no_llm_call,
        "corpus": {"name": "examples/handbook", "documents": status.documents, "chunks": status.chunks,
                   "sync_s": round(sync_s, 2)},
        "overhead_ms": stats["overhead"],
        "overhead_p50_ms": stats["overhead"]["p50"],
        "overhead_p95_ms": stats["overhead"]["p95"],
        "overhead_from_post_ms": stats["overhead_from_post"],
        "ack_ms": stats["ack"],
        "ack_p50_ms": stats["ack"]["p50"],
        "ack_p95_ms": stats["ack"]["p95"],
        "floor_search_ms": stats["floor"],
        "floor_search_p50_ms": stats["floor"]["p50"],
        "floor_search_p95_ms": stats["floor"]["p95"],
        "overhead_vs_floor_p95": round(stats["overhead"]["p95"] / stats["floor"]["p95"], 2)
        if stats["floor"]["p95"] else None,
        # The overhead's parts, in path order (see STAGES for what each covers).
        "stages_ms": {
            "post_to_handler": stats["handler_start"],
            "handler_to_kb_answer": stats["before_answer"],
            "memory": stats["memory"],
            "retrieval": stats["retrieval"],
            "after_retrieval": stats["after_retrieval"],
            "overhead_without_retrieval": stats["without_retrieval"],
            "floor_embed": stats["floor_embed"],
            "floor_sql": stats["floor_sql"],
        },
        "encoders": encoders,
        "overhead_measured_from": "SlackAdapter.handle_http entered → fake Anthropic server has read the request",
    }
    return {"figures": figures, "versions": versions, "database_url": database_url}


# --- 1b. the same for Teams -----------------------------------------------------------------------------------


async def measure_teams_overhead(mentions: int, warmup: int) -> dict[str, Any]:
    """Teams' overhead and ack, as for Slack: the real TeamsAdapter (the Agents SDK, its JWT validation) behind
    `BotApp`'s aiohttp server, the fake Bot Connector (tests/fakes/teams_connector.py, reached through its HTTPS
    proxy as in the tests) and the fake Anthropic server. Each question is a signed channel @mention in a standard
    channel of its own (a new thread). overhead = `TeamsPlatform.handle` entered → the fake Anthropic server has
    read the request; ack = the POST sent → its HTTP 202 read."""
    from fakes.teams_connector import Member
    from fakes.teams_harness import reachable_connector

    from bot.app import BotApp
    from bot.chat.state import BotState
    from bot.context import BotContext
    from bot.server import BotMetrics
    from bot.settings import BotSettings
    from bot.teams.adapter import TeamsAdapter
    from bot.teams.platform import TeamsPlatform
    from bot.teams.settings import TeamsSettings

    handler_started: list[float] = []
    original_handle = TeamsPlatform.handle

    async def timed_handle(self: TeamsPlatform, request: Any) -> Any:  # before the token is validated
        handler_started.append(timer())
        return await original_handle(self, request)

    TeamsPlatform.handle = timed_handle  # type: ignore[method-assign]
    asker = Member("aad-bench", "Bench Mark", email="bench@example.com")
    with reachable_connector() as teams, TimedAnthropic() as claude:  # the SDK's https calls reach the fake
        kb = await open_fresh_kb(TEAMS_DATABASE, anthropic_api_key="sk-ant-bench", anthropic_base_url=claude.url,
                                 anthropic_max_retries=0)
        await kb.sync(await kb.folder_source(HANDBOOK, "handbook"))
        settings = BotSettings(_env_file=None, port=0, answer_sweep_seconds=0)  # type: ignore[call-arg]
        adapter = TeamsAdapter(BotContext(kb, settings, BotMetrics(), BotState.answering(kb)),
                               teams=TeamsSettings(_env_file=None, app_id=teams.app_id,  # type: ignore[call-arg]
                                                   app_password=teams.app_password, tenant_id=teams.tenant_id))
        app = BotApp(settings, kb=kb, adapters=[adapter])
        await app.start()
        url = f"http://127.0.0.1:{app.port}/api/messages"
        asked = questions()
        samples: dict[str, list[float]] = {"overhead": [], "overhead_from_post": [], "ack": []}
        try:
            for i in range(warmup + mentions):
                question = asked[i % len(asked)]
                channel = f"19:bench-{i:05d}@thread.tacv2"
                teams.add_conversation(channel, "channel", members=[asker], team_id="19:bench-team@thread.tacv2",
                                       channel_type="standard")
                kb.retriever._query_vectors.clear()
                requests_before, handler_before = len(claude.received_at), len(handler_started)
                activity = teams.channel_message(f"<at>ragbot</at> {question}", channel, asker)
                token = teams.token()  # signed before the clock starts, as the Connector does
                sent = timer()
                status_code, _ = await teams.deliver(url, activity, token=token)
                acked = timer()
                if status_code != 202:
                    raise RuntimeError(f"the bot answered the activity with HTTP {status_code}")
                await teams.wait_for(lambda c=channel, r=activity["id"]: [  # type: ignore[misc]
                    m for m in teams.thread(c, r) if "Searching the documents" not in m.text], timeout=60)
                await adapter.platform.drain()
                if len(claude.received_at) == requests_before or i < warmup:
                    continue  # abstained before asking Claude, or a warm-up
                llm_at, handled_at = claude.received_at[requests_before], handler_started[handler_before]
                samples["overhead"].append((llm_at - handled_at) * 1000)
                samples["overhead_from_post"].append((llm_at - sent) * 1000)
                samples["ack"].append((acked - sent) * 1000)
        finally:
            await app.stop()
            TeamsPlatform.handle = original_handle  # type: ignore[method-assign]
            await kb.close()
    stats = {name: summary(values) for name, values in samples.items()}
    return {"mentions": len(samples["overhead"]), "warmup_mentions": warmup,
            "overhead_ms": stats["overhead"], "overhead_p50_ms": stats["overhead"]["p50"],
            "overhead_p95_ms": stats["overhead"]["p95"], "overhead_from_post_ms": stats["overhead_from_post"],
            "ack_ms": stats["ack"], "ack_p50_ms": stats["ack"]["p50"], "ack_p95_ms": stats["ack"]["p95"],
            "overhead_measured_from": "TeamsPlatform.handle entered (before the JWT check) → fake Anthropic server "
                                      "has read the request"}


# --- 1c. the same for Discord ---------------------------------------------------------------------------------


async def measure_discord_overhead(mentions: int, warmup: int) -> dict[str, Any]:
    """Discord's overhead, as for Slack: the real discord.py client (`RagbotDiscord`, as `ragbot run` builds it)
    against the fake Discord REST API (tests/fakes/discord_api.py) and the fake Anthropic server. A gateway has no
    HTTP request to time, so each @mention is handed to discord.py's own gateway parser as a MESSAGE_CREATE
    payload (tests/fakes/discord_gateway.py, as in the tests), in a channel open to @everyone; each is answered in
    a thread of its own (a new conversation, no history). overhead = the MESSAGE_CREATE handed to discord.py →
    the fake Anthropic server has read the request (discord.py's dispatch, the exactly-once claim, the thread
    opened over REST, audience, memory, retrieval, prompt, the SDK's request); `to_handler` = → `on_message`
    entered; `to_answer_posted` = → the answer's final message in the thread (includes the LLM's reply and the
    edits; the edit pacing is off, as in the tests, so it does not wait out `DISCORD_EDIT_INTERVAL_SECONDS`)."""
    import discord
    from fakes.discord_api import FakeDiscordAPI
    from fakes.discord_gateway import DiscordHarness

    from bot.discord.adapter import RagbotDiscord, configure_api_url
    from bot.server import BotMetrics
    from bot.settings import BotSettings

    guild, channel, asker = 810000000000000001, 820000000000000001, 800000000000000001
    handler_started: list[float] = []
    original_on_message = RagbotDiscord.on_message

    async def timed_on_message(self: RagbotDiscord, message: Any) -> None:  # discord.py's dispatch → the bot
        handler_started.append(timer())
        await original_on_message(self, message)

    RagbotDiscord.on_message = timed_on_message  # type: ignore[method-assign]
    previous_base = discord.http.Route.BASE
    async with FakeDiscordAPI() as fake:
        with TimedAnthropic() as claude:
            kb = await open_fresh_kb(DISCORD_DATABASE, anthropic_api_key="sk-ant-bench",
                                     anthropic_base_url=claude.url, anthropic_max_retries=0)
            await kb.sync(await kb.folder_source(HANDBOOK, "handbook"))
            settings = BotSettings(_env_file=None, discord_bot_token=fake.token,  # type: ignore[call-arg]
                                   discord_api_url=fake.base_url, discord_guild_id=guild,
                                   discord_edit_interval_seconds=0.0, answer_sweep_seconds=0)
            configure_api_url(settings.discord_api_url)
            bot = RagbotDiscord(kb, settings, BotMetrics())
            asked = questions()
            samples: dict[str, list[float]] = {"overhead": [], "to_handler": [], "to_answer_posted": []}
            try:
                await bot.login(fake.token)  # setup_hook: the commands synced
                harness = DiscordHarness(bot, fake)
                harness.guild_create(guild, [channel])
                for i in range(warmup + mentions):
                    question = asked[i % len(asked)]
                    kb.retriever._query_vectors.clear()
                    requests_before, handler_before = len(claude.received_at), len(handler_started)
                    sent = timer()
                    payload = await harness.message(question, mention_bot=True, channel_id=channel,
                                                    guild_id=guild, author_id=asker)
                    thread = int(payload["id"])  # the thread started from the question
                    if not fake.bot_messages(thread):  # harness.message returns once the bot has handled it
                        raise RuntimeError(f"mention {i} was not answered in its thread")
                    posted = max(call.at for call in fake.calls if f"/channels/{thread}/messages" in call.path)
                    if len(claude.received_at) == requests_before or i < warmup:
                        continue  # abstained before asking Claude, or a warm-up
                    if question not in claude.requests[requests_before].user_text:
                        raise RuntimeError("the LLM request does not carry the question that was asked")
                    llm_at = claude.received_at[requests_before]
                    samples["overhead"].append((llm_at - sent) * 1000)
                    samples["to_handler"].append((handler_started[handler_before] - sent) * 1000)
                    samples["to_answer_posted"].append((posted - sent) * 1000)
            finally:
                await bot.close()
                RagbotDiscord.on_message = original_on_message  # type: ignore[method-assign]
                discord.http.Route.BASE = previous_base
                await kb.close()
    stats = {name: summary(values) for name, values in samples.items()}
    return {"mentions": len(samples["overhead"]), "warmup_mentions": warmup,
            "overhead_ms": stats["overhead"], "overhead_p50_ms": stats["overhead"]["p50"],
            "overhead_p95_ms": stats["overhead"]["p95"], "to_handler_ms": stats["to_handler"],
            "to_answer_posted_ms": stats["to_answer_posted"],
            "overhead_measured_from": "MESSAGE_CREATE handed to discord.py's gateway parser → fake Anthropic server "
                                      "has read the request"}


# --- 2. RSS of `ragbot run` -----------------------------------------------------------------------------------


def _status_kb(pid: int) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0])
    return values


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    """All descendants of pid (via /proc/<pid>/task/*/children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found + [d for c in found for d in _children(c)]


def _postgres_memory() -> dict[str, Any]:
    """The embedded server of this run (its postmaster pid is in RAGBOT_HOME/pgdata/postmaster.pid) and its
    backends."""
    pidfile = Path(os.environ["RAGBOT_HOME"]) / "pgdata" / "postmaster.pid"
    if not pidfile.exists():
        return {}
    postmaster = int(pidfile.read_text().split()[0])
    pids = [postmaster, *_children(postmaster)]
    rows = [(_status_kb(p), _pss_kb(p)) for p in pids if Path(f"/proc/{p}").exists()]
    return {
        "processes": len(rows),
        "rss_sum_mb": round(sum(s.get("VmRSS", 0) for s, _ in rows) / 1024, 1),
        "pss_sum_mb": round(sum(pss for _, pss in rows) / 1024, 1),
        "postmaster_peak_rss_mb": round(rows[0][0].get("VmHWM", 0) / 1024, 1) if rows else None,
        "largest_process_peak_rss_mb": round(max(s.get("VmHWM", 0) for s, _ in rows) / 1024, 1) if rows else None,
    }


def _syncs_not_from_cli(database_url: str) -> int:
    """Sync runs recorded with another trigger than the bench's own `cli` sync (the scheduler's are `schedule`)."""
    import psycopg
    from sqlalchemy.engine import make_url

    plain = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain) as conn:
        return int(conn.execute("SELECT count(*) FROM sync_runs WHERE trigger <> 'cli'").fetchone()[0])  # type: ignore[index]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure_rss(database_url: str, mentions: int) -> dict[str, Any]:
    port = _free_port()
    with FakeSlackAPI() as slack, TimedAnthropic() as claude:
        slack.add_user(ASKER, email="bench@example.com")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "DISCORD_", "ANTHROPIC_"))}
        env.update({
            "PYTHONPATH": str(REPO), "DATABASE_URL": database_url, "HOST": "127.0.0.1", "PORT": str(port),
            "SLACK_BOT_TOKEN": "xoxb-bench-token", "SLACK_SIGNING_SECRET": SECRET, "SLACK_API_URL": slack.api_url,
            "ANTHROPIC_API_KEY": "sk-ant-bench", "ANTHROPIC_BASE_URL": claude.url, "LOG_LEVEL": "WARNING",
        })
        log_path = Path(os.environ["RAGBOT_HOME"]) / "ragbot-run.log"
        log = log_path.open("w")
        started = timer()
        process = subprocess.Popen(
            [sys.executable, "-c", "from bot.cli import app; app()", "run"], cwd=REPO, env=env,
            stdout=log, stderr=subprocess.STDOUT, text=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                healthy_s = None
                while timer() - started < 240:
                    if process.poll() is not None:
                        raise RuntimeError(f"ragbot run exited with {process.returncode}:\n{log_path.read_text()}")
                    try:
                        async with http.get(f"{url}/healthz") as response:
                            if response.status == 200:
                                healthy_s = timer() - started
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.25)
                if healthy_s is None:
                    raise RuntimeError("ragbot run did not become healthy within 240 s")
                at_healthy = _status_kb(process.pid)
                client = SlackClient(type("Running", (), {"port": port})(), http, slack)  # type: ignore[arg-type]
                asked = questions()
                to_llm_ms = []  # the POST → the LLM request, per mention (the first one pays any lazy loading)
                for i in range(mentions):
                    channel, ts = f"CR{i:05d}", new_ts()
                    requests_before = len(claude.received_at)
                    sent = timer()
                    status_code = await client.send_event(mention(asked[i * 7 % len(asked)], user=ASKER,
                                                                  channel=channel, ts=ts))
                    if status_code != 200:
                        raise RuntimeError(f"ragbot run answered the event with HTTP {status_code}")
                    await answer_in(slack, channel, ts, timeout=60)
                    if len(claude.received_at) > requests_before:
                        to_llm_ms.append(round((claude.received_at[requests_before] - sent) * 1000, 1))
                async with http.get(f"{url}/healthz") as response:
                    health = await response.json()
            bot = _status_kb(process.pid)
            children = _children(process.pid)
            maps = Path(f"/proc/{process.pid}/maps").read_text()
            postgres = _postgres_memory()
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
    return {
        "rss_mb": round(bot["VmHWM"] / 1024, 1),
        "rss_now_mb": round(bot["VmRSS"] / 1024, 1),
        "rss_at_healthy_mb": round(at_healthy["VmHWM"] / 1024, 1),
        "rss_child_processes": len(children),
        "rss_children_mb": round(sum(_status_kb(c).get("VmHWM", 0) for c in children
                                     if Path(f"/proc/{c}").exists()) / 1024, 1),
        "rss_mentions_answered": mentions,
        "rss_llm_requests": len(claude.received_at),
        "startup_to_healthy_s": round(healthy_s, 1),
        "ragbot_run_post_to_llm_ms": to_llm_ms,
        "rss_healthz": health,
        "rss_torch_loaded": "libtorch_cpu" in maps or "libtorch.so" in maps,
        # `ragbot run` syncs only sources with a schedule (the handbook has none): syncs it ran while measured.
        "rss_syncs_run_by_ragbot_run": _syncs_not_from_cli(database_url),
        "postgres_memory": postgres,
    }


def print_table(figures: dict[str, Any]) -> None:
    rows = [("overhead p95 (handler → LLM request)", figures.get("overhead_p95_ms"), "ms", "overhead_p95_ms"),
            ("ack p95", figures.get("ack_p95_ms"), "ms", "ack_p95_ms"),
            ("peak RSS of `ragbot run` (bot process)", figures.get("rss_mb"), "MB", "rss_mb")]
    print(f"\n{'figure':45} {'measured':>10} {'target':>10}  met")
    for label, value, unit, key in rows:
        if value is None:
            print(f"{label:45} {'–':>10} {TARGETS[key]:>8.0f} {unit}  –")
            continue
        print(f"{label:45} {value:>8} {unit} {'≤ ' + str(int(TARGETS[key])):>7} {unit}  "
              f"{'yes' if value <= TARGETS[key] else 'NO'}")
    print(f"{'overhead p50':45} {figures.get('overhead_p50_ms'):>8} ms")
    print(f"{'floor: bare KnowledgeBase.search p50 / p95':45} {figures.get('floor_search_p50_ms')} / "
          f"{figures.get('floor_search_p95_ms')} ms")
    print(f"{'ack p50':45} {figures.get('ack_p50_ms'):>8} ms")
    for name, label in STAGES.items():
        row = figures.get("stages_ms", {}).get(name)
        if row:
            print(f"   {label:66} p50 {row['p50']:>8} ms  p95 {row['p95']:>8} ms")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mentions", type=int, default=100, help="timed mentions (each in its own channel)")
    parser.add_argument("--warmup", type=int, default=5, help="mentions before timing (bolt's auth.test, pools)")
    parser.add_argument("--rss-mentions", type=int, default=5, help="mentions answered by `ragbot run` before RSS")
    parser.add_argument("--skip-rss", action="store_true", help="only the in-process overhead and ack")
    parser.add_argument("--profile", metavar="FILE", help="cProfile the timed mentions (the event loop's thread) "
                        "into FILE; the figures are then inflated by the profiler and are not written")
    parser.add_argument("--teams-mentions", type=int, default=100,
                        help="timed Teams channel mentions (0: Teams is not measured)")
    parser.add_argument("--discord-mentions", type=int, default=100,
                        help="timed Discord channel mentions (0: Discord is not measured)")
    parser.add_argument("--name", default="bot")
    args = parser.parse_args()
    load = os.getloadavg()
    wall = timer()
    try:
        print(f"1. overhead and ack: {args.mentions} mentions (+{args.warmup} warm-up), load average {load}")
        measured = await measure_overhead(args.mentions, args.warmup, args.profile)
        figures = measured["figures"]
        if args.teams_mentions > 0:
            print(f"1b. Teams overhead and ack: {args.teams_mentions} channel mentions (+{args.warmup} warm-up)")
            figures["teams"] = await measure_teams_overhead(args.teams_mentions, args.warmup)
            print(f"   Teams overhead p50 / p95 {figures['teams']['overhead_p50_ms']} / "
                  f"{figures['teams']['overhead_p95_ms']} ms, ack p95 {figures['teams']['ack_p95_ms']} ms")
        if args.discord_mentions > 0:
            print(f"1c. Discord overhead: {args.discord_mentions} channel mentions (+{args.warmup} warm-up)")
            figures["discord"] = await measure_discord_overhead(args.discord_mentions, args.warmup)
            print(f"   Discord overhead p50 / p95 {figures['discord']['overhead_p50_ms']} / "
                  f"{figures['discord']['overhead_p95_ms']} ms, event → answer posted p50 "
                  f"{figures['discord']['to_answer_posted_ms']['p50']} ms")
        if not args.skip_rss:
            print(f"2. RSS of `ragbot run` ({args.rss_mentions} mentions answered first)")
            figures.update(await measure_rss(measured["database_url"], args.rss_mentions))
            print(f"   bot process peak {figures['rss_mb']} MB (at /healthz {figures['rss_at_healthy_mb']} MB, "
                  f"{figures['startup_to_healthy_s']} s after start), Postgres {figures['postgres_memory']}")
            print(f"   POST → LLM request per mention in `ragbot run` (ms): {figures['ragbot_run_post_to_llm_ms']}")
        drop_database(DATABASE)
        if args.teams_mentions > 0:
            drop_database(TEAMS_DATABASE)
        if args.discord_mentions > 0:
            drop_database(DISCORD_DATABASE)
    finally:
        if not os.environ.get("DATABASE_URL"):  # the throwaway embedded server of this run
            from db.embedded import stop_embedded

            stop_embedded(Path(os.environ["RAGBOT_HOME"]))
            shutil.rmtree(os.environ["RAGBOT_HOME"], ignore_errors=True)  # the temporary home use_throwaway_home made
    if args.profile:
        print_table(figures)
        return
    figures["targets"] = TARGETS
    figures["bench_wall_s"] = round(timer() - wall, 1)
    print_table(figures)
    machine = machine_info({**measured["versions"], "load_average_at_start": [round(x, 2) for x in load],
                            "load_average_at_end": [round(x, 2) for x in os.getloadavg()]})
    print(f"load average at start {machine['load_average_at_start']}, at end {machine['load_average_at_end']}")
    print(f"wrote {write_results(args.name, figures, machine)}")


if __name__ == "__main__":
    asyncio.run(main())
