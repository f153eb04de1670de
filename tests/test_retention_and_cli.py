"""Retention (RETENTION_DAYS, run by `ragbot run`'s periodic job), `ragbot forget-user`, and the `ragbot channel`
and `ragbot insights` commands, against the real database."""

from __future__ import annotations

import asyncio
import csv
import io
import json
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
    swallow = [g for g in report["gaps"] if "swallow" in g["topic"]]
    assert len(swallow) == 1  # the two swallow questions: one topic
    # Issue 39: the fitted decision may hedge the vacation question (an `uncertain` reply is a gap); nothing else is.
    assert all(g in swallow or g["outcomes"] == {"uncertain": 1} for g in report["gaps"])
    gap = swallow[0]
    assert gap["count"] == 2 and gap["outcomes"] == {"decline": 2}
    assert "private conversation" in gap["channels"] and "slack:T1:C1" in gap["channels"]
    dm = next(q for q in gap["questions"] if q["where"] == "private conversation")
    assert dm["asker"] is None  # a DM's question, without its asker
    assert [d["title"] for d in report["most_cited"]] == ["Vacation policy"]
    assert report["never_cited"]["total"] == 1

    rows = list(csv.reader(io.StringIO(runner.invoke(app, ["insights", "--csv"], catch_exceptions=False).output)))
    assert rows[0][:3] == ["topic", "count", "last_asked"] and rows[1][1] == "2"
    assert runner.invoke(app, ["insights", "--since", "soon"], catch_exceptions=False).exit_code == 2
