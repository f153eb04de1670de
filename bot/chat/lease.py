"""Answer leases: a claimed question is answered even if the process answering it dies.

Claiming a question (`BotState.claim_lease`) gives this process a lease on it for ANSWER_LEASE_SECONDS (10 s). While
the answer is worked on, `LeaseKeeper` stores what was asked and where to answer (so nobody needs the original
event again), the placeholder message once it is posted, and renews the lease every ANSWER_HEARTBEAT_SECONDS (3 s, a
heartbeat: a slow answer keeps its lease however long it takes); delivering the answer marks the claim delivered,
after which it is never answered again. If the process dies (kill -9, an OOM kill, a lost node), the heartbeat stops,
the lease runs out undelivered within ANSWER_LEASE_SECONDS and the question is taken over — by the platform's retry of the same event (Slack retries;
`BotState.claim_lease` hands the retry the lease and the placeholder) or by `sweep` (at the start of
`ragbot run` and every ANSWER_SWEEP_SECONDS; a Discord message is never redelivered) — and answered in the same
placeholder. The SQL is in `bot.chat.state`; adapters only say how to rebuild an answer's `Reply` from the stored
target and placeholder (`Resume`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from bot.chat.state import BotState, LeaseClaim, PendingQuestion

if TYPE_CHECKING:
    from bot.chat.flow import Ask, ChatFlow, Reply

logger = logging.getLogger(__name__)

# Rebuild the answer to a stored question: the Ask and a Reply that edits the stored placeholder (None: cannot).
Resume = Callable[[PendingQuestion], Awaitable["tuple[Ask, Reply] | None"]]

LEASE_SECONDS = 10.0  # the defaults of ANSWER_LEASE_SECONDS, ANSWER_HEARTBEAT_SECONDS and ANSWER_SWEEP_SECONDS:
HEARTBEAT_SECONDS = 3.0  # a dead holder's question is answered within LEASE + SWEEP = 15 s
SWEEP_SECONDS = 5.0
MAX_ATTEMPTS = 3  # a question whose answering keeps killing the process is not retried forever
MAX_AGE_SECONDS = 3600.0  # an hour-old question is not answered out of the blue after a long outage


def new_holder(platform: str) -> str:
    """Who holds a lease: this process and this adapter (a restarted process is a new holder)."""
    return f"{platform}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseKeeper:
    """One claimed question while it is answered: records it, renews its lease every `heartbeat_seconds` (at most a
    third of the lease, so one late or failed renewal never lets a live answer be taken over), and tells the flow
    whether it still holds the claim before the answer is delivered."""

    def __init__(self, state: BotState, claim: LeaseClaim, lease_seconds: float,
                 heartbeat_seconds: float = HEARTBEAT_SECONDS) -> None:
        self.state = state
        self.claim = claim
        self.lease_seconds = lease_seconds
        self.heartbeat_seconds = min(heartbeat_seconds, lease_seconds / 3)
        self.placeholder = claim.placeholder
        self.lost = False
        self._renewer: asyncio.Task[None] | None = None

    async def start(self, platform: str, ask: Ask, target: Mapping[str, Any] | None) -> None:
        recorded = await self.state.record_lease_question(
            self.claim, platform=platform, question=ask.question, conversation_id=ask.conversation_id,
            asker=ask.asker, target=target or {}, lease_seconds=self.lease_seconds,
        )
        self.lost = not recorded
        self.heartbeat()

    def heartbeat(self) -> None:
        """Start renewing the lease in the background until `stop` (or until another holder took it over)."""
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew(), name=f"ragbot-lease-{self.claim.key}")

    async def _renew(self) -> None:
        while not self.lost:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                self.lost = not await self.state.renew_lease(self.claim, self.lease_seconds)
            except Exception:  # the database blinked: try again next round (the lease is longer than a round)
                logger.warning("could not renew the lease on %s", self.claim.key, exc_info=True)

    async def note_placeholder(self, reply: Reply) -> None:
        """Store the reply's placeholder reference once it exists (a takeover edits that message)."""
        ref = getattr(reply, "placeholder", None)
        if ref and ref != self.placeholder:
            self.placeholder = ref
            await self.state.record_lease_placeholder(self.claim, str(ref))

    async def still_held(self) -> bool:
        if not self.lost:
            self.lost = not await self.state.renew_lease(self.claim, self.lease_seconds)
        return not self.lost

    async def delivered(self) -> None:
        try:
            await self.state.mark_lease_delivered(self.claim)
        except Exception:  # delivered but not marked: a takeover may answer again, in the same placeholder
            logger.exception("could not mark %s delivered", self.claim.key)

    def stop(self) -> None:
        """Stop renewing. The claim is not released: a process that dies never releases it either, and a claim
        that was not delivered is then taken over once the lease runs out."""
        if self._renewer is not None:
            self._renewer.cancel()


async def sweep(flow: ChatFlow, resume: Resume, *, limit: int = 20) -> int:
    """Take over and answer this platform's undelivered questions whose lease ran out. Returns how many."""
    answered = 0
    for _ in range(limit):
        pending = await flow.state.take_expired_lease(
            flow.platform, flow.holder, flow.lease_seconds, max_attempts=flow.max_attempts,
            max_age_seconds=MAX_AGE_SECONDS,
        )
        if pending is None:
            break
        logger.warning("%s: answering %s, whose answer was never delivered (attempt %d)", flow.platform,
                       pending.claim.key, pending.claim.attempts)
        flow.count("resumed_answers", "sweeper")
        try:
            made = await resume(pending)
        except Exception:
            logger.exception("%s: could not resume %s", flow.platform, pending.claim.key)
            continue
        if made is None:  # it cannot be answered any more (a Discord interaction token expired): settle it
            logger.warning("%s: %s can no longer be answered; dropping it", flow.platform, pending.claim.key)
            await flow.delivered(pending.claim)
            continue
        ask, reply = made
        await flow.answer(ask, reply, claim=pending.claim, target=pending.target)
        answered += 1
    return answered


async def sweep_forever(flow: ChatFlow, resume: Resume, every_seconds: float) -> None:
    """`sweep` now (a restart after a crash) and then every `every_seconds`, until cancelled."""
    while True:
        try:
            await sweep(flow, resume)
        except Exception:
            logger.exception("%s: the answer sweeper failed; trying again in %s s", flow.platform, every_seconds)
        await asyncio.sleep(every_seconds)


def start_sweeper(flow: ChatFlow, resume: Resume, every_seconds: float) -> asyncio.Task[None] | None:
    """The adapters' start-up hook: None when ANSWER_SWEEP_SECONDS is 0 (no sweeper in this process)."""
    if every_seconds <= 0:
        return None
    return asyncio.create_task(sweep_forever(flow, resume, every_seconds), name=f"ragbot-{flow.platform}-sweeper")


async def stop_sweeper(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
