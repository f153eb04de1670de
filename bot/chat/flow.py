"""The one chat flow every platform adapter calls.

A question walks: claim the event (exactly once, in Postgres) → who will read the answer (`Audience`) → the
conversation so far (memory, or the platform's thread history) → `KnowledgeBase.answer` → render and deliver through
the adapter's `Reply` (a placeholder replaced by the answer, or the answer streamed) → remember it for feedback.
A failure anywhere becomes an apology with an error id (`bot.chat.errors`), logged with the traceback and counted
by stage in /metrics. `/kb` admin commands and feedback clicks go through here too.

An adapter (Slack, Discord; Teams or Mattermost tomorrow) only parses its platform's events into an `Ask` and
implements `Reply` for its message API; everything else is shared. Adding a platform is one module that does that.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol, Sequence

from bot.chat import admin, feedback
from bot.chat.access import Audience
from bot.chat.errors import apology, new_error_id

if TYPE_CHECKING:
    from bot.chat.state import Rating
    from bot.server import BotMetrics
    from knowledge.answer.answering import Answer
    from knowledge.answer.memory import ChatMessage
    from knowledge.kb import KnowledgeBase

logger = logging.getLogger(__name__)

OnText = Callable[[str], Awaitable[None]]


class Reply(Protocol):
    """How one answer reaches the platform. The flow calls, in order: `begin` (before any work: a typing or
    status indicator), `open` once the audience and history are known (post a placeholder, or return a callback
    that streams the text as it is written), `end` once the answer is computed (whatever happened), then `deliver`
    with the final answer and its feedback id, or `fail` with an apology."""

    async def begin(self) -> None: ...

    async def open(self) -> OnText | None: ...

    async def end(self) -> None: ...

    async def deliver(self, answer: "Answer", answer_id: int) -> None: ...

    async def fail(self, text: str) -> None: ...


@dataclass(frozen=True)
class Ask:
    """A question as the platform adapter parsed it."""

    question: str
    conversation_id: str  # platform-qualified: "slack:T1:C2:1700.1", "discord:G:thread"
    asker: str  # platform identity: "slack:U1", "discord:42"
    audience: Callable[[], Awaitable[Audience]]  # who reads the answer (may call the platform: users.info)
    history: Callable[[], Awaitable["Sequence[ChatMessage] | None"]] | None = None  # earlier thread messages


class ChatFlow:
    """The platform-neutral flow, one per adapter (it counts metrics under the adapter's platform name)."""

    def __init__(self, kb: "KnowledgeBase", platform: str, metrics: "BotMetrics | None" = None) -> None:
        self.kb = kb
        self.platform = platform
        self.metrics = metrics

    def count(self, what: str, *labels: str) -> None:
        if self.metrics is not None:
            getattr(self.metrics, what).labels(self.platform, *labels).inc()

    def failure(self, stage: str, exc: BaseException | None = None, doing: str = "answering",
                where: str = "") -> str:
        """Log a failure with a fresh error id and the traceback, count it by stage, and return the apology."""
        error_id = new_error_id()
        logger.error("%s: %s failed at %s (error id %s)%s", self.platform, doing, stage, error_id,
                     f" in {where}" if where else "", exc_info=exc or True)
        self.count("errors", stage)
        return apology(error_id, doing)

    async def claim(self, *keys: str) -> bool:
        """True the first time every key is seen: a retried event, the same message delivered as two events, or a
        second replica of the bot never answers twice. Raises if the database is unreachable."""
        for key in keys:
            if not await self.kb.claim_event(key):
                self.count("duplicate_events")
                logger.info("%s: ignoring duplicate delivery %s", self.platform, key)
                return False
        return bool(keys)

    async def answered_in(self, conversation_id: str) -> bool:
        """Whether the bot has answered in this conversation (a thread reply there is a follow-up)."""
        return await self.kb.bot_answered_in(conversation_id)

    async def answer(self, ask: Ask, reply: Reply) -> "Answer | None":
        """Answer `ask` through `reply`; None when it failed (the user then sees an apology)."""
        self.count("questions")
        started = time.perf_counter()
        first_text_at: float | None = None
        stage = "answer"
        try:
            try:
                await reply.begin()
                audience = await ask.audience()
                prior = await ask.history() if ask.history is not None else None
                on_text = await reply.open()

                async def timed_text(delta: str) -> None:
                    nonlocal first_text_at
                    if first_text_at is None:
                        first_text_at = time.perf_counter()
                    await on_text(delta)  # type: ignore[misc]

                answer = await self.kb.answer(
                    ask.question, list(audience.principals), ask.conversation_id, asker=ask.asker,
                    prior_messages=list(prior) if prior else None, on_text=timed_text if on_text else None,
                )
            finally:
                await reply.end()
            stage = "post"
            answer_id = await feedback.remember_answer(
                self.kb, platform=self.platform, conversation_id=ask.conversation_id, asker=ask.asker,
                question=ask.question, answer=answer,
            )
            await reply.deliver(answer, answer_id)
        except Exception as exc:
            text = self.failure(stage, exc, where=ask.conversation_id)
            try:
                await reply.fail(text)
            except Exception:
                logger.exception("%s: could not even post the apology", self.platform)
            return None
        if self.metrics is not None:
            self.metrics.observe_answer(self.platform, answer, time.perf_counter() - started)
            if first_text_at is not None:
                self.metrics.stage_seconds.labels("first_text").observe(first_text_at - started)
        return answer

    async def command(self, text: str, caller: admin.Caller) -> admin.CommandResult:
        """A `/kb` command; an unexpected failure becomes an apology (never a stack trace in chat)."""
        try:
            return await admin.run_command(self.kb, text, caller)
        except Exception as exc:
            return admin.CommandResult(self.failure("command", exc, doing=f"running /kb {text}".strip()), ok=False)

    async def followup(self, job: Callable[[], Awaitable[str]]) -> str:
        """The long part of a `/kb` command (a reindex): its report, or an apology."""
        try:
            return await job()
        except Exception as exc:
            return self.failure("command", exc, doing="running the /kb job")

    async def feedback(self, answer_id: int, identity: str, rating: "Rating") -> feedback.FeedbackAck:
        """A 👍/👎 click; the acknowledgement is the same whatever was rated."""
        try:
            ack = await feedback.record_click(self.kb, answer_id, identity, rating)
        except Exception as exc:
            return feedback.FeedbackAck(None, self.failure("feedback", exc, doing="saving your feedback"))
        if ack.stored is not None:
            self.count("feedback", rating)
        return ack
