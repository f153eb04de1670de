"""The one chat flow every platform adapter calls.

A question walks: claim the event (exactly once, in Postgres) → who will read the answer (`Audience`) → the
conversation so far (memory, or the platform's thread history) → `KnowledgeBase.answer` → render and deliver through
the adapter's `Reply` (a placeholder replaced by the answer, or the answer streamed) → remember it for feedback.
A failure anywhere becomes an apology with an error id (`bot.chat.errors`), logged with the traceback and counted
by stage in /metrics. `/kb` admin commands and feedback clicks go through here too.

An adapter (a platform package registered in `bot.platforms`) parses its platform's events and implements `Reply`
for its message API; the rest is shared. Its interface with the core (docs/teams.md, "The platform interface the
chat core calls"):
- `ChatFlow(kb, name, metrics, state=..., rule=AudienceRule(kb, state, directory, ...))`: the adapter is the
  `Directory` (bot.chat.readers: a person's email and standing, a channel's members);
- `flow.ask(question, conversation_id, asker, target, history=, auto=, person=, settings=)`: the `Ask`, whose
  audience comes from `target.readers` by the one rule (`settings`: what `flow.answers_privately` read, if it
  did); `flow.answer(ask, reply, claim=, target=target.to_json())` answers it;
- `flow.resume(pending, reply_for)`: a crashed holder's question rebuilt from its stored `AnswerTarget`, the adapter
  giving only the `Reply` for the stored place (`reply_for(post, placeholder)`): live and resumed answers have the
  same readers by construction;
- `bot.chat.render.answer_view`: what an answer shows (sources, or a decline's closest documents; feedback);
- `flow.claim` / `claim_question` / `delivered`, `flow.command` / `followup`, `flow.feedback`, `flow.sweep`.
`Ask` built directly (with an `audience` callable) keeps working for callers that decide the audience themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from bot.chat import admin, feedback, lease
from bot.chat.access import Audience
from bot.chat.auto import is_answer, looks_like_question, outcome_of
from bot.chat.channels import ChannelSettings, channel_settings
from bot.chat.delivery import asks_privately, public_conversation
from bot.chat.errors import apology, new_error_id
from bot.chat.guests import OUTSIDER_REPLY, trusted_admin
from bot.chat.history import ThreadMessage, thread_history
from bot.chat.readers import AnswerTarget, AudienceRule, PersonInfo
from bot.chat.render import EMPTY_QUESTION, AnswerView, answer_view, text_view
from bot.chat.state import BotState
from knowledge import QuestionTooLong

if TYPE_CHECKING:
    from bot.chat.state import LeaseClaim, PendingQuestion, Rating
    from bot.server import BotMetrics
    from knowledge import Answer, ChatMessage, KnowledgeBase

logger = logging.getLogger(__name__)

OnText = Callable[[str], Awaitable[None]]
T = TypeVar("T")
# What the clicker of "Share in channel" is told when the answer is not theirs to share, or was shared already.
SHARE_NOT_YOURS = "Only the person who asked can share this answer."
SHARE_DONE = "This answer was shared already."
# How an adapter answers a resumed question: a `Reply` for the plain data it stored (`AnswerTarget.post`) and the
# placeholder posted before the crash (None: none was); None when it can no longer answer there (a token expired).
ReplyFor = Callable[[Mapping[str, Any], "str | None"], Awaitable["Reply | None"]]


class Reply(Protocol):
    """How one answer reaches the platform. The flow calls, in order: `begin` (before any work: a typing or
    status indicator), `open` once the audience and history are known (post a placeholder, or return a callback
    that streams the text as it is written), `end` once the answer is computed (whatever happened), then `deliver`
    with the final answer and its feedback id, or `fail` with an apology."""

    async def begin(self) -> None: ...

    async def open(self) -> OnText | None: ...

    async def end(self) -> None: ...

    async def deliver(self, answer: Answer, answer_id: int) -> None: ...

    async def fail(self, text: str) -> None: ...


class PrivateReply:
    """The `Reply` for an answer only its asker sees in a channel (Slack's ephemeral message, Teams' targeted
    message: neither can be edited or streamed): nothing is shown while it is written, then the answer's view with
    the private note and "Share in channel" (`answer_view(..., private=True)`), or the apology as a plain view. A
    platform subclasses it for its one "post privately" call, `post_privately`; a failure to post an apology is
    logged, never raised."""

    placeholder: str | None = None  # nothing is posted before the answer: a takeover posts it anew

    async def post_privately(self, view: AnswerView) -> None:
        raise NotImplementedError

    async def begin(self) -> None:
        return None

    async def open(self) -> OnText | None:
        return None

    async def end(self) -> None:
        return None

    async def deliver(self, answer: Answer, answer_id: int) -> None:
        await self.post_privately(answer_view(answer, answer_id, private=True))

    async def fail(self, text: str) -> None:
        try:
            await self.post_privately(text_view(text))
        except Exception:
            logger.exception("could not even post the apology privately")


@dataclass(frozen=True)
class Ask:
    """A question as the platform adapter parsed it."""

    question: str
    conversation_id: str  # platform-qualified: "slack:T1:C2:1700.1", "discord:G:thread"
    asker: str  # platform identity: "slack:U1", "discord:42"
    audience: Callable[[], Awaitable[Audience]]  # who reads the answer (may call the platform: users.info)
    history: Callable[[], Awaitable[Sequence[ChatMessage] | None]] | None = None  # earlier thread messages
    channel_key: str | None = None  # the channel asked in ("slack:T1:C2"): its settings apply; None in a DM
    auto: bool = False  # a help-channel question nobody addressed to the bot: posted only if it is an answer
    # The channel's settings as this question's privacy decision read them (`Privacy.settings`), so that its answer
    # uses those and does not read them again; None: the answer reads them (a DM, a resumed question).
    settings: ChannelSettings | None = None


@dataclass(frozen=True)
class Privacy:
    """What `ChatFlow.answers_privately` decided for one question: answered privately or not, the question without
    the word "privately" if the asker said it, and the channel's settings it read to decide (None when it read none:
    a DM, or the asker chose). The adapter passes `settings` on to `ChatFlow.ask`, so the question's answer uses the
    same settings its decision saw, read once."""

    private: bool
    question: str
    settings: ChannelSettings | None = None


Respond = Callable[[str], Awaitable[None]]  # posts a text only the caller sees (an ephemeral, a targeted message)


@dataclass(frozen=True)
class CommandUser:
    """Who typed a `/kb` command, and where. `user_id`: the platform's own id (ADMIN_USER_IDS lists it bare or as
    "<platform>:<id>"); `person`: what the live event said of them (Discord's Manage Server in that server), else
    the adapter's Directory is asked; the rest as `admin.Caller`."""

    user_id: str
    channel_key: str | None = None
    workspace: str | None = None
    person: PersonInfo | None = None
    resolve_person: Callable[[str], Awaitable[Any]] | None = None
    reads_channel: Callable[[str], Awaitable[bool]] | None = None


@dataclass(frozen=True)
class Share:
    """A private answer its asker shares: the question to answer AGAIN for the channel (never the private text),
    and the thread's public conversation."""

    question: str
    conversation_id: str


class _NoAudience(Exception):
    """The answer's audience holds no principal (an outsider under GUEST_ACCESS=none): nothing is answered."""


class ChatFlow:
    """The platform-neutral flow, one per adapter (it counts metrics under the adapter's platform name)."""

    def __init__(self, kb: KnowledgeBase, platform: str, metrics: BotMetrics | None = None, *,
                 state: BotState | None = None, lease_seconds: float = lease.LEASE_SECONDS,
                 heartbeat_seconds: float = lease.HEARTBEAT_SECONDS, max_attempts: int = lease.MAX_ATTEMPTS,
                 rule: AudienceRule | None = None, listed_admin: Callable[[str, str], bool] | None = None) -> None:
        self.kb = kb
        self.rule = rule  # who reads an answer (bot.chat.readers): `ask` and `resume` need it
        self.state = state if state is not None else BotState.answering(kb)  # the bot tables (bot.chat.state)
        self.platform = platform
        self.metrics = metrics
        self.lease_seconds = lease_seconds  # ANSWER_LEASE_SECONDS: how long a claimed question waits for a dead holder
        self.heartbeat_seconds = heartbeat_seconds  # ANSWER_HEARTBEAT_SECONDS: how often a live holder renews it
        self.max_attempts = max_attempts
        self.holder = lease.new_holder(platform)
        self.listed_admin = listed_admin  # BotSettings.is_listed_admin: ADMIN_USER_IDS (platform, user id) -> bool
        self.tasks: set[asyncio.Task[Any]] = set()  # `/kb` jobs still running (a reindex); `drain` waits for them

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

    def ask(self, question: str, conversation_id: str, asker: str, target: AnswerTarget, *,
            history: Callable[[], Awaitable[Sequence[ChatMessage] | None]] | None = None, auto: bool = False,
            person: PersonInfo | None = None, settings: ChannelSettings | None = None) -> Ask:
        """The `Ask` for a question answered at `target`: its audience by the one rule (`AudienceRule`) from
        `target.readers`, its channel settings from `target.settings`. A resumed question is rebuilt by the same
        call from the stored target, so a live answer and a resumed one always have the same readers. `person`:
        what the live event told of the asker (their email and standing), else asked of the adapter. `settings`:
        the channel's settings this question's privacy decision read (`Privacy.settings`), used by its answer
        instead of a second read; a resumed question has none and reads them."""
        rule = self.rule
        if rule is None:
            raise RuntimeError("ChatFlow.ask needs the adapter's AudienceRule: pass rule= to ChatFlow")
        return Ask(question, conversation_id, asker, lambda: rule.audience(asker, target.readers, person), history,
                   channel_key=target.settings, auto=auto, settings=settings)

    async def resume(self, pending: PendingQuestion, reply_for: ReplyFor) -> tuple[Ask, Reply] | None:
        """A question whose holder died (`bot.chat.lease`), rebuilt from its stored `AnswerTarget`: the Ask here,
        with the same readers as the first attempt; only the `Reply` for the stored place comes from the adapter.
        None when it cannot be answered any more (the sweeper then settles it)."""
        target = AnswerTarget.from_json(pending.target)
        if target is None:
            logger.warning("%s: %s was stored by an older version; it cannot be resumed", self.platform,
                           pending.claim.key)
            return None
        reply = await reply_for(target.post, pending.claim.placeholder)
        if reply is None:
            return None
        return self.ask(pending.question, pending.conversation_id, pending.asker, target), reply

    async def claim(self, *keys: str) -> bool:
        """True the first time every key is seen: a retried event, the same message delivered as two events, or a
        second replica of the bot never answers twice. Raises if the database is unreachable."""
        for key in keys:
            if not await self.state.claim_event(key):
                self.count("duplicate_events")
                logger.info("%s: ignoring duplicate delivery %s", self.platform, key)
                return False
        return bool(keys)

    async def claim_question(self, *keys: str) -> LeaseClaim | None:
        """Claim a question as a lease (`bot.chat.lease`): None for a duplicate (answered, or being answered by a
        live holder); a claim, possibly taken over from a holder that died, with the placeholder to answer in."""
        claim = await self.state.claim_lease(keys, self.holder, self.lease_seconds)
        if claim is None:
            self.count("duplicate_events")
            logger.info("%s: ignoring duplicate delivery %s", self.platform, " ".join(keys))
        elif claim.resumed:
            self.count("resumed_answers", "retry")
            logger.warning("%s: taking over %s, whose answer was never delivered (attempt %d)", self.platform,
                           claim.key, claim.attempts)
        return claim

    async def claim_or_apologise(self, reply: Reply, *keys: str, where: str = "") -> LeaseClaim | None:
        """`claim_question`; when the database cannot be reached, the asker gets an apology through `reply` rather
        than silence (and None)."""
        try:
            return await self.claim_question(*keys)
        except Exception as exc:
            await reply.fail(self.failure("claim", exc, where=where))
            return None

    def keeper(self, claim: LeaseClaim | None) -> lease.LeaseKeeper | None:
        """The heartbeat of a claimed question while it is answered (None: nothing was claimed)."""
        if claim is None:
            return None
        return lease.LeaseKeeper(self.state, claim, self.lease_seconds, self.heartbeat_seconds)

    async def hint_if_empty(self, question: str, claim: LeaseClaim | None,
                            say: Callable[[str], Awaitable[object]]) -> bool:
        """A mention without a question gets the same hint on every platform (`render.EMPTY_QUESTION`, posted by
        `say` where the answer would go) instead of an answer, and its claimed event counts as handled. False
        when there is a question to answer."""
        if question.strip():
            return False
        try:
            await say(EMPTY_QUESTION)
        except Exception:
            logger.exception("%s: could not post the hint for an empty question", self.platform)
        await self.delivered(claim)
        return True

    async def delivered(self, claim: LeaseClaim | None) -> None:
        """A claimed event was handled without an answer (an empty mention got a hint): never handle it again."""
        if claim is not None:
            await self.state.mark_lease_delivered(claim)

    async def sweep(self, resume: lease.Resume) -> int:
        """Answer this platform's questions whose holder died before delivering (see `bot.chat.lease`)."""
        return await lease.sweep(self, resume)

    async def auto_claim(self, text: str, channel_key: str, claim: Callable[[], Awaitable[T]]) -> T | None:
        """A message nobody addressed to the bot, in a channel: claimed (by `claim`) only when it reads as a
        question (bot.chat.auto) and the channel answers unasked (`/kb channel auto on`); None otherwise. A failure
        is logged and counted, never answered: nobody asked the bot."""
        if not looks_like_question(text):
            return None
        try:
            if not (await self.channel_settings(channel_key)).auto:
                return None
            return await claim() or None
        except Exception as exc:
            self.failure("claim", exc, where=channel_key)
            return None

    async def answers_privately(self, question: str, channel_key: str | None, *, said: bool | None = None,
                                by_word: bool = True) -> Privacy:
        """Is a question in a channel answered privately (an answer only the asker sees, from their own access,
        with "Share in channel")? As the asker said (`said`; or, `by_word`, the word "privately" in the question,
        which is then removed), else the channel's mode (bot.chat.delivery). Never in a DM (`channel_key` None).
        The settings read for the mode come back with the decision: they belong to this question, and its answer
        uses them (`ask(settings=...)`) rather than reading them a second time."""
        if channel_key is None:
            return Privacy(False, question)
        if said is None and by_word:
            said, question = asks_privately(question)
        if said:
            return Privacy(True, question)
        if said is None or by_word:
            settings = await self.channel_settings(channel_key)
            return Privacy(settings.mode == "private", question, settings)
        return Privacy(False, question)

    async def claim_share(self, answer_id: int, clicker: str) -> Share | str:
        """"Share in channel" under a private answer: only its asker may share it, and only once (claimed here).
        The question to answer again for the channel, or what to tell the clicker."""
        delivered = await self.state.delivered_answer(answer_id)
        if delivered is None or delivered.asker != clicker:
            return SHARE_NOT_YOURS
        if not await self.claim(f"{self.platform}:share:{answer_id}"):
            return SHARE_DONE
        return Share(delivered.question, public_conversation(delivered.conversation_id))

    def history(self, conversation_id: str, fetch: Callable[[], Awaitable[Iterable[ThreadMessage]]], *,
                me: str | None, before: float, question_id: str | None = None,
                ) -> Callable[[], Awaitable[Sequence[ChatMessage] | None]]:
        """The history of a question asked in a thread (`Ask.history`): nothing when the bot has answered in this
        conversation already (its own memory holds the turns), else the thread's earlier messages the adapter
        fetches, through the one policy (`bot.chat.history.thread_history`: before the question, the bot's own
        answers and people's messages, the last few, not too old). A thread that cannot be read is no history."""

        async def read() -> Sequence[ChatMessage] | None:
            if await self.answered_in(conversation_id):
                return None
            try:
                messages = list(await fetch())
            except Exception as exc:
                logger.warning("%s: could not read the thread for context: %s", self.platform, exc)
                return None
            return thread_history(messages, me=me, before=before, question_id=question_id)

        return read

    async def answered_in(self, conversation_id: str) -> bool:
        """Whether the bot has answered in this conversation (a thread reply there is a follow-up)."""
        return await self.state.bot_answered_in(conversation_id)

    async def channel_settings(self, channel_key: str | None) -> ChannelSettings:
        """A channel's settings (sources, auto, mode; defaults for a DM or an unconfigured channel). Adapters ask
        before treating an unaddressed message as a help-channel question; the flow reads them once per question."""
        return await channel_settings(self.state, channel_key)

    async def answer(self, ask: Ask, reply: Reply, claim: LeaseClaim | None = None,
                     target: Mapping[str, Any] | None = None) -> Answer | None:
        """Answer `ask` through `reply`; None when it failed (the user then sees an apology). With a `claim` (a
        lease), the question and `target` (the adapter's JSON saying where to answer) are stored first, the
        placeholder once posted, and the claim is marked delivered after the answer (or apology) is posted."""
        keeper = self.keeper(claim)
        if ask.auto:
            try:
                if keeper is not None:
                    keeper.heartbeat()  # renewed while it works: a retry does not answer it a second time
                return await self._auto_answer(ask, reply)
            finally:
                # Posted or deliberately withheld, the question is settled: no retry or sweeper may answer it.
                if keeper is not None:
                    keeper.stop()
                    await keeper.delivered()
        self.count("questions")
        started = time.perf_counter()
        try:
            return await self._answer(ask, reply, keeper, target, started)
        finally:
            if keeper is not None:
                keeper.stop()

    async def _answer(self, ask: Ask, reply: Reply, keeper: lease.LeaseKeeper | None,
                      target: Mapping[str, Any] | None, started: float) -> Answer | None:
        first_text_at: float | None = None
        stage = "answer"
        try:
            if keeper is not None:
                await keeper.start(self.platform, ask, target)
                if keeper.lost:  # taken over again before we began: the new holder answers
                    return None
            self.kb.check_question(ask.question)  # MAX_QUESTION_CHARS: refused before any work
            try:
                await reply.begin()
                channel = await self._settings_of(ask)
                audience = await ask.audience()
                if not audience.principals:  # an outsider asks or reads (bot.chat.guests): no answer at all
                    raise _NoAudience()
                prior = await ask.history() if ask.history is not None else None
                on_text = await reply.open()
                if keeper is not None:
                    await keeper.note_placeholder(reply)

                async def timed_text(delta: str) -> None:
                    nonlocal first_text_at
                    if first_text_at is None:
                        first_text_at = time.perf_counter()
                    assert on_text is not None  # timed_text is passed on only when the reply streams
                    await on_text(delta)
                    if keeper is not None and keeper.placeholder is None:
                        await keeper.note_placeholder(reply)

                answer = await self.kb.answer(
                    ask.question, list(audience.principals), ask.conversation_id, asker=ask.asker,
                    prior_messages=list(prior) if prior else None, on_text=timed_text if on_text else None,
                    sources=channel.sources,
                )
            finally:
                await reply.end()
            stage = "post"
            if keeper is not None and not await keeper.still_held():
                # This process was presumed dead and another took the question over (it answers, not us), or the
                # asker was forgotten meanwhile (`ragbot forget-user` cancelled it): the turn just stored goes too.
                logger.warning("%s: %s was taken over or cancelled while answering; not delivering it",
                               self.platform, keeper.claim.key)
                if answer.id is not None:
                    await self.kb.forget_turn(answer.id)
                return None
            answer_id = await feedback.remember_answer(
                self.state, platform=self.platform, conversation_id=ask.conversation_id, asker=ask.asker,
                question=ask.question, answer=answer, channel_key=ask.channel_key, private=audience.is_private,
            )
            await reply.deliver(answer, answer_id)
            if keeper is not None:
                await keeper.delivered()
        except _NoAudience:
            logger.info("%s: %s not answered: its audience holds no principal (GUEST_ACCESS)", self.platform,
                        ask.conversation_id)
            await reply.fail(OUTSIDER_REPLY)
            if keeper is not None:
                await keeper.delivered()
            return None
        except QuestionTooLong as exc:  # the asker's to fix: its one line, not an apology with an error id
            await reply.fail(str(exc))
            if keeper is not None:
                await keeper.delivered()
            return None
        except Exception as exc:
            text = self.failure(stage, exc, where=ask.conversation_id)
            try:
                await reply.fail(text)
            except Exception:
                logger.exception("%s: could not even post the apology", self.platform)
            if keeper is not None:  # an apology is an answer: the asker knows, and may ask again
                await keeper.delivered()
            return None
        if self.metrics is not None:
            self.metrics.observe_answer(self.platform, answer, time.perf_counter() - started)
            if first_text_at is not None:
                self.metrics.stage_seconds.labels("first_text").observe(first_text_at - started)
        return answer

    async def _settings_of(self, ask: Ask) -> ChannelSettings:
        """The channel's settings for this question's answer: those its privacy decision read (`Ask.settings`), if
        they are its own channel's; else read now (a DM, a resumed question, an `Ask` built without them)."""
        if ask.settings is not None and ask.channel_key and ask.settings.channel_key == ask.channel_key:
            return ask.settings
        return await self.channel_settings(ask.channel_key)

    async def _auto_answer(self, ask: Ask, reply: Reply) -> Answer | None:
        """A help-channel question nobody addressed to the bot: answered without any placeholder or streaming, and
        posted only when the outcome is an answer. A decline, an uncertain answer or a failure stays silent (logged;
        the question still counts as a gap in `ragbot insights`)."""
        try:
            self.kb.check_question(ask.question)
        except QuestionTooLong:
            return None  # nobody asked the bot: a pasted log in a help channel is left alone
        try:
            channel = await self.channel_settings(ask.channel_key)
            if not channel.auto:
                return None  # switched off between the event and now
            self.count("questions")
            started = time.perf_counter()
            audience = await ask.audience()
            if not audience.principals:  # an outsider asked or reads the channel: nothing is posted
                return None
            answer = await self.kb.answer(ask.question, list(audience.principals), ask.conversation_id,
                                          asker=ask.asker, sources=channel.sources)
            posting = is_answer(answer)
            answer_id = await feedback.remember_answer(
                self.state, platform=self.platform, conversation_id=ask.conversation_id, asker=ask.asker,
                question=ask.question, answer=answer, channel_key=ask.channel_key, private=False, posted=posting,
            )
            if not posting:
                logger.info("%s: auto-answer in %s withheld (%s)", self.platform, ask.channel_key, outcome_of(answer))
                return None
            await reply.deliver(answer, answer_id)
        except Exception as exc:
            self.failure("auto", exc, where=ask.conversation_id)  # logged and counted; nobody asked, so no apology
            return None
        if self.metrics is not None:
            self.metrics.observe_answer(self.platform, answer, time.perf_counter() - started)
        return answer

    async def kb_command(self, text: str, who: CommandUser, respond: Respond,
                         working: Callable[[], Awaitable[None]] | None = None) -> None:
        """A `/kb` command from end to end, the same on every platform: who is an admin (the platform's admin
        flag, for a member of the installing organisation, or ADMIN_USER_IDS "<platform>:<id>"), the refusal of an
        admin command to anyone else (before anything runs), the command itself, and its reply `respond`ed to the
        caller alone; a long job's report follows the same way when it is done. `working`: called once the command
        may run, before it does (Discord acknowledges the interaction there, within its 3 seconds)."""
        identity = f"{self.platform}:{who.user_id}"
        person = who.person
        if person is None:
            try:
                person = await self.rule.directory.person(identity) if self.rule is not None else PersonInfo()
            except Exception:
                logger.warning("%s: could not look %s up for /kb", self.platform, identity, exc_info=True)
                person = PersonInfo()
        listed = bool(self.listed_admin and self.listed_admin(self.platform, who.user_id))
        caller = admin.Caller(
            identity, listed or trusted_admin(person.admin, person.standing), channel_key=who.channel_key,
            workspace=who.workspace, resolve_person=who.resolve_person,
            email=None if person.standing.outsider else person.email, operator=listed, reads_channel=who.reads_channel,
        )
        refused = admin.refusal(text, caller)
        if refused is not None:
            await self.kb_reply(respond, refused)
            return
        if working is not None:
            await working()
        result = await self.command(text, caller)
        await self.kb_reply(respond, result.text)
        if result.followup is not None:
            job = result.followup
            task = asyncio.ensure_future(self._report(job, respond))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _report(self, job: Callable[[], Awaitable[str]], respond: Respond) -> None:
        await self.kb_reply(respond, await self.followup(job))

    async def kb_reply(self, respond: Respond, text: str) -> None:
        """`respond(text)`, a failure to post it logged (never raised into the platform's handler)."""
        try:
            await respond(text)
        except Exception:  # e.g. Discord's interaction ran out during a long sync: nobody to tell but the log
            logger.exception("%s: could not reply to a /kb command", self.platform)

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for the `/kb` jobs still running (an adapter's `stop`)."""
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=timeout)

    async def command(self, text: str, caller: admin.Caller) -> admin.CommandResult:
        """A `/kb` command; an unexpected failure becomes an apology (never a stack trace in chat)."""
        try:
            return await admin.run_command(self.kb, self.state, text, caller)
        except Exception as exc:
            return admin.CommandResult(self.failure("command", exc, doing=f"running /kb {text}".strip()), ok=False)

    async def followup(self, job: Callable[[], Awaitable[str]]) -> str:
        """The long part of a `/kb` command (a reindex): its report, or an apology."""
        try:
            return await job()
        except Exception as exc:
            return self.failure("command", exc, doing="running the /kb job")

    async def feedback(self, answer_id: int, identity: str, rating: Rating) -> feedback.FeedbackAck:
        """A 👍/👎 click; the acknowledgement is the same whatever was rated."""
        try:
            ack = await feedback.record_click(self.state, answer_id, identity, rating)
        except Exception as exc:
            return feedback.FeedbackAck(None, self.failure("feedback", exc, doing="saving your feedback"))
        if ack.stored is not None:
            self.count("feedback", rating)
        return ack
