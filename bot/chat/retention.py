"""Retention and data-protection deletes for what the bots store about people: questions, answers, feedback.

- `enforce_retention`: RETENTION_DAYS (default 90) for delivered answers and their feedback (bot state) and the
  conversation memory's turns (the questions and answers the follow-ups are understood from). Run by
  `RetentionService` beside the sync scheduler in `ragbot run` (and `ragbot scheduler`): at start, then every
  `interval_seconds`. Plain DELETEs by age: several replicas running it at once only repeat work.
  A summary that folded a deleted turn is dropped with it (the memory folds the remaining turns again).
- `forget_user`: `ragbot forget-user user:EMAIL` deletes a person's questions (their conversation turns and
  delivered answers, with any feedback on them), their feedback on other answers, and the summaries of every
  conversation they took part in; cancels their undelivered questions (never answered or stored again); and
  clears them from every other column that names a person (`PERSON_COLUMNS`, which a test checks against the live
  schema: a new table with a person in it fails the suite until it is declared here).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from bot.chat.state import BotState
from knowledge import identity_kinds

if TYPE_CHECKING:
    from knowledge import KnowledgeBase

logger = logging.getLogger(__name__)

EVENT_KEYS_DAYS = 7  # exactly-once keys: retries stop after minutes

Handling = Literal["deleted", "cleared", "kept"]


@dataclass(frozen=True)
class PersonColumn:
    """A column that may name a person, and what `forget_user` does with it: `deleted` (the rows go), `cleared`
    (set to NULL or the person removed; the row stays) or `kept` (deliberately: `why` says so)."""

    table: str
    column: str
    handling: Handling
    why: str


# Every column of the schema that names a person (tests/test_retention_and_cli.py compares this list with
# information_schema and fails on a person-like column that is not here).
PERSON_COLUMNS: tuple[PersonColumn, ...] = (
    PersonColumn("conversation_turns", "asker", "deleted", "their questions and the answers to them"),
    PersonColumn("conversation_turns", "principals", "cleared", "their principal in other turns' audience"),
    PersonColumn("conversation_summaries", "conversation_id", "deleted",
                 "summaries of conversations they took part in (a summary may retell them)"),
    PersonColumn("bot_answers", "asker", "deleted", "their delivered answers, with the feedback on them"),
    PersonColumn("bot_feedback", "platform_user", "deleted", "their votes"),
    PersonColumn("bot_events", "asker", "cleared", "claims: undelivered ones cancelled, question and target dropped"),
    PersonColumn("bot_events", "conversation_id", "cleared", "with the claim's asker"),
    PersonColumn("bot_events", "question", "cleared", "with the claim's asker"),
    PersonColumn("bot_events", "target", "cleared", "with the claim's asker (it names the asker's user id)"),
    PersonColumn("bot_identities", "mapped_by", "cleared", "the mapping stays, unattributed"),
    PersonColumn("bot_channel_grants", "granted_by", "cleared", "the grant stays, unattributed"),
    PersonColumn("bot_channel_settings", "updated_by", "cleared", "the setting stays, unattributed"),
    PersonColumn("bot_identities", "identity", "kept",
                 "access, not history: reported, removed with `ragbot users unmap IDENTITY`"),
    PersonColumn("bot_identities", "principal", "kept", "access, not history (as identity)"),
    PersonColumn("bot_channel_grants", "principal", "kept",
                 "access given to a channel, not history: reported, removed with `ragbot channel-access remove`"),
    PersonColumn("directory_members", "member", "kept",
                 "a copy of the group directory, re-synced from it: remove the person there"),
    PersonColumn("directory_members", "group_principal", "kept", "names a group, not a person"),
    PersonColumn("documents", "author", "kept", "document metadata, re-synced from the source"),
    PersonColumn("documents", "access", "kept", "a document's sharing list, re-synced from the source"),
    PersonColumn("chunks", "access", "kept", "a copy of its document's sharing list"),
    PersonColumn("audit_log", "actor", "kept",
                 "the security record of who changed access: kept like the access it audits (docs/security.md)"),
    PersonColumn("audit_log", "actor_role", "kept", "operator or platform admin: a role, not a person"),
    PersonColumn("audit_log", "principal", "kept", "the principal an access change named (as actor)"),
)


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
    cancelled: int = 0
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        if not self.identities:
            kinds = ", ".join(f"{kind}:<id>" for kind in identity_kinds()) or "<platform>:<id>"
            return (f"No chat identity is known for {self.person}: nothing was deleted. Give one with --identity "
                    f"({kinds}).")
        lines = [f"Forgot {self.person} ({', '.join(self.identities)}): {self.turns} conversation turns, "
                 f"{self.answers} delivered answers, {self.feedback} feedback rows, {self.summaries} conversation "
                 f"summaries deleted; {self.cancelled} pending questions cancelled."]
        lines += self.notes
        return "\n".join(lines)


async def forget_identities(kb: KnowledgeBase, state: BotState, person: str, identities: Sequence[str]) -> ForgetReport:
    ids = sorted({i.strip() for i in identities if i and i.strip()})
    report = ForgetReport(person, ids)
    if not ids:
        return report
    # Pending questions first: once cancelled, no sweeper or retry answers them and stores a turn again.
    bot_state = await state.forget_bot_state_of(ids)
    principals = [person.strip().lower()] if person.strip().lower().startswith("user:") else []
    report.turns, report.summaries = await kb.forget_turns_of(ids, principals)
    report.answers, report.feedback = bot_state["answers"], bot_state["feedback"]
    report.cancelled = bot_state["cancelled"]
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
