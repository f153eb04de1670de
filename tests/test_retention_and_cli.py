"""Retention (RETENTION_DAYS, run by `ragbot run`'s periodic job), `ragbot forget-user`, and the `ragbot channel`
and `ragbot insights` commands, against the real database."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import test_settings, write
from typer.testing import CliRunner

from bot.app import build_app
from bot.chat.feedback import remember_answer
from bot.chat.retention import RetentionService, enforce_retention
from bot.chat.state import BotState
from bot.cli import app
from bot.settings import BotSettings
from db.settings import DatabaseSettings
from knowledge.kb import KnowledgeBase
from knowledge.sources.folder import FolderSource

runner = CliRunner()


async def _ask(kb: KnowledgeBase, question: str, asker: str, conversation: str, *, private: bool = False) -> int:
    answer = await kb.answer(question, ["everyone"], conversation, asker=asker)
    return await remember_answer(BotState(kb.engine), platform=asker.split(":")[0], conversation_id=conversation, asker=asker,
                                 question=question, answer=answer, private=private,
                                 channel_key=None if private else conversation.rsplit(":", 1)[0])


async def _count(kb: KnowledgeBase, table: str) -> int:
    from sqlalchemy import text

    async with kb.engine.connect() as conn:
        return (await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one()


async def _age(kb: KnowledgeBase, answer_id: int, days: int) -> None:
    """Make one question (its answer, turn and feedback) `days` old."""
    from sqlalchemy import text

    async with kb.engine.begin() as conn:
        params = {"id": answer_id, "d": days}
        await conn.execute(text("UPDATE bot_answers SET created_at = now() - make_interval(days => :d) WHERE id = :id"), params)
        await conn.execute(text("UPDATE bot_feedback SET created_at = now() - make_interval(days => :d) "
                                "WHERE answer_id = :id"), params)
        await conn.execute(text("UPDATE conversation_turns SET created_at = now() - make_interval(days => :d) "
                                "WHERE id = (SELECT turn_id FROM bot_answers WHERE id = :id)"), params)


async def test_retention_deletes_questions_answers_and_feedback_older_than_the_limit(kb_factory) -> None:
    kb = await kb_factory()
    old = await _ask(kb, "How many vacation days do I get?", "slack:UANN", "slack:T1:C1:1")
    new = await _ask(kb, "How do I set up the VPN?", "slack:UANN", "slack:T1:C1:2")
    state = BotState(kb.engine)
    for answer_id in (old, new):
        await state.record_feedback(answer_id, "slack:UBOB", "down")
    await _age(kb, old, 91)

    report = await enforce_retention(kb, state, 90)

    assert (report.answers, report.feedback, report.turns) == (1, 1, 1)
    assert await state.delivered_answer(old) is None and await state.delivered_answer(new) is not None
    assert [f.answer_id for f in await state.recent_feedback()] == [new]
    assert await _count(kb, "conversation_turns") == 1
    assert (await enforce_retention(kb, state, 90)).answers == 0  # nothing left to delete


async def test_ragbot_run_enforces_retention_in_the_background(kb_factory) -> None:
    settings = BotSettings(_env_file=None, retention_days=30)  # type: ignore[call-arg]
    services = build_app(settings).services
    assert [type(s).__name__ for s in services] == ["SchedulerService", "RetentionService"]
    assert services[1].days == 30

    kb = await kb_factory()
    old = await _ask(kb, "How many vacation days do I get?", "discord:42", "discord:1:2")
    await _age(kb, old, 31)
    service = RetentionService(lambda: kb, 30, interval_seconds=3600)
    await service.start()
    try:
        for _ in range(200):
            if service.runs:
                break
            await asyncio.sleep(0.05)
    finally:
        await service.stop()
    assert service.runs == 1 and await BotState(kb.engine).delivered_answer(old) is None


def _populate(url: str) -> dict[str, int]:
    async def go() -> dict[str, int]:
        kb = await KnowledgeBase.open(test_settings(), DatabaseSettings(_env_file=None, database_url=url))  # type: ignore[call-arg]
        try:
            ids = {
                "alice_discord": await _ask(kb, "What is the airspeed velocity of an unladen swallow?", "discord:42",
                                            "discord:dm:99", private=True),
                "alice_slack": await _ask(kb, "How many vacation days do I get?", "slack:UALICE", "slack:T1:C1:1"),
                "bob": await _ask(kb, "What is the airspeed velocity of a laden swallow?", "slack:UBOB",
                                  "slack:T1:C1:2"),
            }
            state = BotState(kb.engine)
            await state.record_feedback(ids["bob"], "slack:UALICE", "down")
            await state.record_feedback(ids["alice_slack"], "slack:UBOB", "up")
            await state.map_identity("discord:42", "user:alice@example.com", "test")
            return ids
        finally:
            await kb.close()

    return asyncio.run(go())


def _read(url: str, work) -> object:  # type: ignore[no-untyped-def]
    async def go() -> object:
        kb = await KnowledgeBase.open(test_settings(), DatabaseSettings(_env_file=None, database_url=url))  # type: ignore[call-arg]
        try:
            return await work(kb)
        finally:
            await kb.close()

    return asyncio.run(go())


@pytest.fixture
def populated(tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, int]]:
    url = fresh_database()
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    write(tmp_path / "docs", "vacation.md", "# Vacation policy\n\nFull-time employees get 25 days of paid vacation.\n")
    write(tmp_path / "docs", "vpn.md", "# VPN\n\nInstall WireGuard from the IT portal.\n")

    async def sync() -> None:
        kb = await KnowledgeBase.open(test_settings(), DatabaseSettings(_env_file=None, database_url=url))  # type: ignore[call-arg]
        try:
            assert not (await kb.sync(FolderSource(tmp_path / "docs", "handbook"))).failed
        finally:
            await kb.close()

    asyncio.run(sync())
    return url, _populate(url)


def test_forget_user_removes_their_questions_and_feedback_and_nobody_elses(populated) -> None:
    url, ids = populated
    result = runner.invoke(app, ["forget-user", "user:Alice@Example.com", "--identity", "slack:UALICE", "--no-lookup"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "discord:42" in result.output and "slack:UALICE" in result.output  # found through the identity map too
    assert "2 delivered answers" in result.output

    async def check(kb: KnowledgeBase) -> tuple[object, ...]:
        from sqlalchemy import text

        async with kb.engine.connect() as conn:
            askers = list((await conn.execute(text("SELECT DISTINCT asker FROM conversation_turns"))).scalars())
        state = BotState(kb.engine)
        return (await state.delivered_answer(ids["alice_discord"]), await state.delivered_answer(ids["alice_slack"]),
                await state.delivered_answer(ids["bob"]), await state.recent_feedback(), askers)

    alice_discord, alice_slack, bob, feedback, askers = _read(url, check)  # type: ignore[misc]
    assert alice_discord is None and alice_slack is None and bob is not None
    assert feedback == [] and askers == ["slack:UBOB"]

    unknown = runner.invoke(app, ["forget-user", "user:nobody@example.com", "--no-lookup"], catch_exceptions=False)
    assert "nothing was deleted" in unknown.output
    bad = runner.invoke(app, ["forget-user", "alice"], catch_exceptions=False)
    assert bad.exit_code == 2 and "user:<email>" in bad.output


def test_channel_commands_and_insights_json_and_csv(populated) -> None:
    url, _ = populated
    channel = "slack:T1:C1"
    assert "only from `handbook`".replace("`", "") in runner.invoke(
        app, ["channel", "sources", channel, "add", "handbook"], catch_exceptions=False).output
    runner.invoke(app, ["channel", "auto", channel, "on"], catch_exceptions=False)
    runner.invoke(app, ["channel", "mode", channel, "private"], catch_exceptions=False)
    shown = json.loads(runner.invoke(app, ["channel", "show", channel, "--json"], catch_exceptions=False).output)
    assert shown == {"channel": channel, "sources": ["handbook"], "auto": True, "mode": "private"}
    bad = runner.invoke(app, ["channel", "show", "C1"], catch_exceptions=False)
    assert bad.exit_code == 2 and "channel key" in bad.output

    report = json.loads(runner.invoke(app, ["insights", "--since", "30d", "--json"], catch_exceptions=False).output)
    topics = [g["topic"] for g in report["gaps"]]
    assert len(report["gaps"]) == 1 and "swallow" in topics[0]  # the two swallow questions: one topic
    gap = report["gaps"][0]
    assert gap["count"] == 2 and gap["outcomes"] == {"decline": 2}
    assert "private conversation" in gap["channels"] and "slack:T1:C1" in gap["channels"]
    dm = next(q for q in gap["questions"] if q["where"] == "private conversation")
    assert dm["asker"] is None  # a DM's question, without its asker
    assert [d["title"] for d in report["most_cited"]] == ["Vacation policy"]
    assert report["never_cited"]["total"] == 1

    rows = list(csv.reader(io.StringIO(runner.invoke(app, ["insights", "--csv"], catch_exceptions=False).output)))
    assert rows[0][:3] == ["topic", "count", "last_asked"] and rows[1][1] == "2"
    assert runner.invoke(app, ["insights", "--since", "soon"], catch_exceptions=False).exit_code == 2


# ---- issue 38: forget every table that holds a person; summaries do not outlive their turns ------------------------

# What a column that names a person is called (a user id, an email, a principal, an admin who changed something).
PERSON_LIKE = re.compile(
    r"(^|_)(asker|askers|user|users|user_id|identity|identities|principal|principals|member|members|author|authors"
    r"|email|emails|person|people|actor|owner|requester|recipient)($|_)|_by$"
)


async def _schema_columns(kb: KnowledgeBase) -> set[tuple[str, str]]:
    from sqlalchemy import text

    async with kb.engine.connect() as conn:
        rows = await conn.execute(text(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        ))
        return {(r.table_name, r.column_name) for r in rows}


async def test_every_column_that_names_a_person_is_declared_for_forget_user(fresh_kb) -> None:
    """A new table (or column) holding a user fails here until bot.chat.retention.PERSON_COLUMNS says what
    `ragbot forget-user` does with it (and does it)."""
    from bot.chat.retention import PERSON_COLUMNS

    schema = await _schema_columns(fresh_kb)
    declared = {(c.table, c.column) for c in PERSON_COLUMNS}
    undeclared = sorted(column for column in schema if PERSON_LIKE.search(column[1]) and column not in declared)
    assert not undeclared, f"forget-user does not handle {undeclared}: declare them in PERSON_COLUMNS"
    assert not declared - schema, f"PERSON_COLUMNS names columns the schema does not have: {declared - schema}"
    assert all(c.why for c in PERSON_COLUMNS)


async def _rows_naming(kb: KnowledgeBase, needles: list[str]) -> dict[str, int]:
    """For each column forget-user deletes or clears, how many rows still name one of `needles`."""
    from sqlalchemy import text

    from bot.chat.retention import PERSON_COLUMNS

    found: dict[str, int] = {}
    async with kb.engine.connect() as conn:
        for column in PERSON_COLUMNS:
            if column.handling == "kept":
                continue
            n = (await conn.execute(
                text(f"SELECT count(*) FROM {column.table} WHERE CAST({column.column} AS text) ILIKE ANY(:p)"),
                {"p": [f"%{needle}%" for needle in needles]},
            )).scalar_one()
            if n:
                found[f"{column.table}.{column.column}"] = n
    return found


async def test_forget_user_cancels_a_pending_question_that_no_sweeper_then_answers(
    kb_factory, fresh_database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fakes.slack_api import FakeSlackAPI
    from slack_harness import mention, running_bot, settle
    from test_answer_lease import CORPUS, QUESTION, RETRY, channel, crash_after_placeholder

    url = fresh_database()
    kb = await kb_factory(url)
    for relative, content in CORPUS.items():
        write(tmp_path / "docs", relative, content)
    assert not (await kb.sync(FolderSource(tmp_path / "docs", "handbook"))).failed
    state = BotState(kb.engine)
    # Alice asked before, voted, and as an admin changed a mapping, a grant and a channel setting.
    earlier = await _ask(kb, "How do I set up the VPN?", "slack:UALICE", "slack:T1:C1:1")
    await state.record_feedback(earlier, "slack:UALICE", "up")
    await state.map_identity("discord:42", "user:bob@example.com", "slack:UALICE")
    await state.grant_channel("slack:T1:C7", "group:eng", granted_by="slack:UALICE")
    from bot.chat.channels import set_mode

    await set_mode(state, "slack:T1:C7", "private", "slack:UALICE")
    with FakeSlackAPI() as fake:
        fake.add_user("UALICE", email="alice@example.com")
        event = mention(QUESTION, user="UALICE", channel=channel())
        # Her question is claimed, then the process answering it dies: it waits for a sweeper.
        await crash_after_placeholder(kb, fake, event, "EvForgotten", lease_seconds=0.3)

        monkeypatch.setenv("DATABASE_URL", url)
        monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
        result = await asyncio.to_thread(
            runner.invoke, app, ["forget-user", "user:alice@example.com", "--identity", "slack:UALICE", "--no-lookup"],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        assert "1 pending questions cancelled" in result.output

        await asyncio.sleep(0.4)  # the dead holder's lease has run out
        async with running_bot(kb, fake, answer_sweep_seconds=0.1) as slack:
            assert await slack.send_event(event, event_id="EvForgotten", headers=RETRY) == 200  # Slack's retry too
            await settle(1.0)
    assert fake.calls_to("chat.update") == []  # never answered, so never stored again
    assert await _rows_naming(kb, ["UALICE", "alice@example.com"]) == {}
    assert (await state.identity_mappings("discord:42"))[0].mapped_by is None  # the mapping stays, unattributed


async def test_retention_drops_a_summary_that_folded_a_deleted_turn(kb_factory, tmp_path: Path) -> None:
    kb = await kb_factory(memory_token_budget=200, memory_recent_turns=1)
    write(tmp_path / "docs", "vpn.md", "# VPN\n\nInstall WireGuard from the IT portal and import the Zephyr profile.\n")
    write(tmp_path / "docs", "vacation.md", "# Vacation\n\nEmployees get 25 vacation days a year; five carry over.\n")
    assert not (await kb.sync(FolderSource(tmp_path / "docs", "handbook"))).failed
    chat = "slack:T1:C1:1760000000.000001"
    first = await kb.answer("How do I set up the VPN?", ["everyone"], chat, asker="slack:UANN")
    for question in ("How many vacation days do employees get?", "Do vacation days carry over?",
                     "How many vacation days carry over each year?"):
        await kb.answer(question, ["everyone"], chat, asker="slack:UANN")
    folded = await kb.memory.history(chat)
    assert "Zephyr" in folded.summary  # the VPN turn was folded into the summary

    from sqlalchemy import text

    async with kb.engine.begin() as conn:  # the VPN question is past RETENTION_DAYS, the others are not
        await conn.execute(text("UPDATE conversation_turns SET created_at = now() - interval '91 days' WHERE id = :t"),
                           {"t": first.id})
    report = await enforce_retention(kb, BotState(kb.engine), 90)

    assert report.turns == 1
    async with kb.engine.connect() as conn:
        summaries = list((await conn.execute(text("SELECT summary FROM conversation_summaries"))).scalars())
    assert not any("Zephyr" in s or "VPN" in s for s in summaries)
    history = await kb.memory.history(chat)
    assert "Zephyr" not in history.summary and not any("Zephyr" in m.text for m in history.messages)
    assert any("carry over" in m.text for m in history.messages)  # the turns within retention still serve


class _HeldAnswer:
    """The real knowledge base, whose answer step waits until the test lets it go on (a question being answered
    at the very moment its asker is forgotten)."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self._kb = kb
        self.started = asyncio.Event()
        self.proceed = asyncio.Event()
        self.answered = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._kb, name)

    async def answer(self, *args: object, **kwargs: object) -> object:
        self.started.set()
        await self.proceed.wait()
        try:
            return await self._kb.answer(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            self.answered.set()


async def test_forget_user_while_their_question_is_being_answered_leaves_nothing(
    kb_factory, fresh_database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fakes.slack_api import FakeSlackAPI
    from slack_harness import mention, running_bot, settle
    from test_answer_lease import CORPUS, QUESTION, channel

    url = fresh_database()
    kb = await kb_factory(url)
    for relative, content in CORPUS.items():
        write(tmp_path / "docs", relative, content)
    assert not (await kb.sync(FolderSource(tmp_path / "docs", "handbook"))).failed
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    held = _HeldAnswer(kb)
    with FakeSlackAPI() as fake:
        fake.add_user("UALICE", email="alice@example.com")
        event = mention(QUESTION, user="UALICE", channel=channel())
        async with running_bot(held, fake, answer_sweep_seconds=0) as slack:
            assert await slack.send_event(event, event_id="EvMidAnswer") == 200
            await asyncio.wait_for(held.started.wait(), 30)
            result = await asyncio.to_thread(
                runner.invoke, app, ["forget-user", "user:alice@example.com", "--identity", "slack:UALICE",
                                     "--no-lookup"], catch_exceptions=False,
            )
            assert "1 pending questions cancelled" in result.output
            held.proceed.set()  # the answer step finishes (and stores its turn) after the person was forgotten
            await asyncio.wait_for(held.answered.wait(), 60)
            for _ in range(200):  # the holder finds its claim cancelled and drops the turn it just stored
                if not await _count(kb, "conversation_turns"):
                    break
                await asyncio.sleep(0.05)
            await settle()
    assert fake.calls_to("chat.update") == []  # not delivered
    assert await _rows_naming(kb, ["UALICE", "alice@example.com"]) == {}
