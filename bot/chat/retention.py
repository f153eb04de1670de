"""Retention and data-protection deletes for what the bots store about people: questions, answers, feedback.

- `enforce_retention`: RETENTION_DAYS (default 90) for delivered answers and their feedback (bot state) and the
  conversation memory's turns (the questions and answers the follow-ups are understood from). Run by
  `RetentionService` beside the sync scheduler in `ragbot run` (and `ragbot scheduler`): at start, then every
  `interval_seconds`. Plain DELETEs by age: several replicas running it at once only repeat work.
- `forget_user`: `ragbot forget-user user:EMAIL` deletes a person's questions (their conversation turns and
  delivered answers, with any feedback on them), their feedback on other answers, and the summaries of every
  conversation they took part in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bot.chat.state import BotState

if TYPE_CHECKING:
    from knowledge import KnowledgeBase

logger = logging.getLogger(__name__)

EVENT_KEYS_DAYS = 7  # exactly-once keys: retries stop after minutes


@dataclass(frozen=True)
class RetentionReport:
    days: int
    answers: int
    feedback: int
    turns: int
    events: int


async def enforce_retention(kb: KnowledgeBase, state: BotState, days: int) -> RetentionReport:
    if days < 1:
        raise ValueError("RETENTION_DAYS must be at least 1")
    bot_state = await state.forget_bot_state_older_than(days)
    turns = await kb.forget_turns_older_than(days)
    events = await state.forget_events_older_than(min(days, EVENT_KEYS_DAYS))
    report = RetentionReport(days, bot_state["answers"], bot_state["feedback"], turns, events)
    if report.answers or report.feedback or report.turns:
        logger.info("retention (%d days): deleted %d answers, %d feedback rows, %d conversation turns", days,
                    report.answers, report.feedback, report.turns)
    return report


class RetentionService:
    """The retention job as a background service (`start()` / `stop()`), the shape `ragbot run` gives services."""

    def __init__(self, get_kb: Callable[[], KnowledgeBase], days: int, interval_seconds: float = 6 * 3600) -> None:
        self.get_kb = get_kb
        self.days = days
        self.interval = interval_seconds
        self._task: asyncio.Task[None] | None = None
        self.runs = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="ragbot-retention")

    async def _loop(self) -> None:
        while True:
            try:
                kb = self.get_kb()
                await enforce_retention(kb, BotState(kb.engine), self.days)
                self.runs += 1
            except Exception:
                logger.exception("retention: the periodic delete failed; retrying at the next interval")
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None


@dataclass
class ForgetReport:
    person: str
    identities: list[str]
    answers: int = 0
    feedback: int = 0
    turns: int = 0
    summaries: int = 0
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        if not self.identities:
            return (f"No chat identity is known for {self.person}: nothing was deleted. Give one with --identity "
                    "(slack:U123, discord:42).")
        lines = [f"Forgot {self.person} ({', '.join(self.identities)}): {self.turns} conversation turns, "
                 f"{self.answers} delivered answers, {self.feedback} feedback rows, {self.summaries} conversation "
                 "summaries deleted."]
        lines += self.notes
        return "\n".join(lines)


async def forget_identities(kb: KnowledgeBase, state: BotState, person: str, identities: Sequence[str]) -> ForgetReport:
    ids = sorted({i.strip() for i in identities if i and i.strip()})
    report = ForgetReport(person, ids)
    if not ids:
        return report
    bot_state = await state.forget_bot_state_of(ids)
    report.turns, report.summaries = await kb.forget_turns_of(ids)
    report.answers, report.feedback = bot_state["answers"], bot_state["feedback"]
    if await state.identities_for_principal(person):
        report.notes.append(f"The identity map still maps them to {person} (access, not history): remove it with "
                            "`ragbot users unmap IDENTITY`.")
    return report


async def forget_user(kb: KnowledgeBase, state: BotState, person: str, identities: Sequence[str] = (), *,
                      lookup: Callable[[str], Awaitable[list[str]]] | None = None) -> ForgetReport:
    """Identities: the identity map's (any identity mapped to `person`), `lookup(email)` (the CLI passes Slack's
    users.lookupByEmail), and `identities`."""
    found = list(identities) + await state.identities_for_principal(person)
    if lookup is not None:
        found += await lookup(person.removeprefix("user:"))
    return await forget_identities(kb, state, person, found)
