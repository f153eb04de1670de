"""The Teams adapter: Teams activities into the shared chat flow (`bot.chat.flow`), the flow's replies back to Teams.

Served on PORT at `POST /api/messages` (`TeamsPlatform`: every request's Bot Connector JWT is validated first).
What is answered:
- a personal (1:1) chat: every message;
- a channel: an @mention, answered in the message's reply thread; a later reply in a thread where the bot already
  answered, mention or not (Teams delivers unmentioned channel messages only to an app granted the
  ChannelMessage.Read.Group permission; without it a follow-up needs an @mention);
- a group chat: an @mention.
Each question is claimed once on its activity id (`ChatFlow.claim_question`: a redelivered activity is dropped, and
a claim whose process died is answered by the sweeper, `resume`). A message starting with `kb` is a command
(`ChatFlow.command`, as declared in teams-manifest/manifest.json).

Who reads the answer (docs/permissions.md, "In chat"): a 1:1 chat → the asker's access (`user:<email>` with the
email the roster gives for `from.aadObjectId`); a group chat or a private/shared channel → what every member may
see (the conversation's own members, paged by continuation token); a standard channel → everyone + grants. Guests
(`userRole` guest/anonymous, or another tenant than TEAMS_TENANT_ID) get what GUEST_ACCESS gives them.

How it is shown (`TeamsReply`): in a 1:1 chat the answer streams (informative update, streaming updates about a
second apart, the final message; a 403, the user's Stop, ends it); elsewhere a placeholder is posted and updated at
most once a second, then replaced by the answer. The answer carries its citations (the message's citation entity),
the AI label and Teams' 👍/👎 buttons, whose clicks (`message/submitAction`) are stored as feedback. A question with
"privately", or any question in a channel whose mode is private, is answered with a targeted message only the asker
sees, from the asker's access.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bot.chat import admin
from bot.chat.access import Audience, private_audience
from bot.chat.audience import AudienceUnavailable, ChannelAudiences, Member
from bot.chat.delivery import asks_privately, channel_mode, private_conversation
from bot.chat.flow import Ask, ChatFlow, OnText
from bot.chat.guests import MEMBER, Standing, outsider_audience
from bot.chat.lease import start_sweeper, stop_sweeper
from bot.teams.activities import ConversationType, TeamsConversation, TeamsFeedback, TeamsMembershipChange, TeamsMessage
from bot.teams.messages import AnswerMessages
from bot.teams.platform import ReplyTarget, TeamsMember, TeamsPlatform, TeamsStream, message_activity
from bot.teams.render import EMPTY_QUESTION, PLACEHOLDER, STATUS_SEARCHING, answer_citations, answer_text, safe_text
from bot.teams.settings import TeamsSettings
from knowledge import Person, check_principal

if TYPE_CHECKING:
    from bot.chat.state import LeaseClaim, PendingQuestion
    from bot.context import BotContext
    from knowledge import Answer

logger = logging.getLogger(__name__)

PLATFORM = "teams"
# A placeholder is updated at most this often while the answer is written (Teams throttles a bot that edits a
# message faster; "Optimize your bot: rate limiting and best practices in Microsoft Teams").
UPDATE_SECONDS = 1.0
COMMAND_WORDS = ("kb", "/kb")


@dataclass(frozen=True)
class Where:
    """Where a question was asked and where its answer goes: plain data, stored with the question's claim so a
    takeover after a crash (`TeamsAdapter.resume`) answers in the same place."""

    service_url: str
    conversation_id: str  # where the answer goes: a channel's thread form ("19:…;messageid=<root>") or the chat
    conversation_type: ConversationType
    tenant_id: str | None
    reply_to_id: str | None  # the thread root in a channel, the question in a chat
    base_id: str  # the channel or chat itself
    channel_type: str | None
    team_id: str | None
    user_id: str  # the asker's 29: id (a targeted message's recipient)
    user_aad: str | None  # the asker's Entra object id: their identity and roster key
    thread_root: str | None
    private: bool = False  # answered with a targeted message to the asker alone, from the asker's access

    @classmethod
    def of(cls, message: TeamsMessage) -> Where:
        c = message.conversation
        return cls(c.service_url, message.reply_conversation_id, c.type, c.tenant_id,
                   message.thread_root or message.activity_id, c.base_id, c.channel_type, c.team_id,
                   message.user.id, message.user.aad_object_id, message.thread_root)

    @property
    def target(self) -> ReplyTarget:
        return ReplyTarget(self.service_url, self.conversation_id, self.conversation_type, self.tenant_id,
                           self.reply_to_id)

    @property
    def conversation(self) -> TeamsConversation:
        return TeamsConversation(self.conversation_id, self.conversation_type, self.tenant_id, self.service_url,
                                 self.team_id, self.channel_type)

    @property
    def personal(self) -> bool:
        return self.conversation_type == "personal"

    @property
    def identity(self) -> str:
        return f"teams:{self.user_aad or self.user_id}"

    @property
    def conversation_key(self) -> str:
        """The chat core's conversation (memory and follow-ups): a channel thread, a group chat, a 1:1 chat."""
        part = self.thread_root or ("dm" if self.personal else "chat")
        return f"teams:{self.tenant_id or '-'}:{self.base_id}:{part}"

    @property
    def channel_key(self) -> str:
        return self.conversation.channel_key


def command_text(text: str) -> str | None:
    """The `kb …` command a message holds ("kb status" → "status"), or None for a question."""
    words = text.split(maxsplit=1)
    if not words or words[0].lower() not in COMMAND_WORDS:
        return None
    return words[1] if len(words) > 1 else ""


class TeamsAdapter:
    name = PLATFORM

    def __init__(self, context: BotContext, *, teams: TeamsSettings | None = None) -> None:
        self.context = context
        self.kb = context.kb
        self.settings = context.settings
        self.teams = teams or TeamsSettings()
        self.flow = ChatFlow(self.kb, PLATFORM, context.metrics, state=context.state,
                             lease_seconds=self.settings.answer_lease_seconds,
                             heartbeat_seconds=self.settings.answer_heartbeat_seconds)
        self.platform = TeamsPlatform(self.teams, on_message=self.on_message, on_feedback=self.on_feedback,
                                      on_membership=self.on_membership)
        self.audiences = ChannelAudiences(self.kb, self.flow.state, ttl_seconds=self.settings.channel_audience_ttl,
                                          max_members=self.settings.channel_audience_max_members,
                                          guest_access=self.settings.guest_access)
        self.messages = AnswerMessages(context.state.engine)
        self._members: dict[tuple[str, str], tuple[float, TeamsMember | None]] = {}
        self._seen: dict[str, TeamsConversation] = {}  # channel key -> conversation (for `kb gaps`)
        self._sweeper: asyncio.Task[None] | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    # Lifecycle (bot.app.Adapter).

    def routes(self) -> list[web.RouteDef]:
        return self.platform.routes()

    async def start(self) -> None:
        """Teams calls the bot (no connection to open): only the sweeper of questions a crashed process left."""
        logger.info("Teams: serving %s for app %s", "/api/messages", self.platform.app_id)
        self._sweeper = start_sweeper(self.flow, self.resume, self.settings.answer_sweep_seconds)

    async def stop(self) -> None:
        await stop_sweeper(self._sweeper)
        self._sweeper = None
        await self.platform.drain()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=30)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # Events (TeamsPlatform calls these; its own handler logs what they raise).

    async def on_message(self, message: TeamsMessage) -> None:
        where = Where.of(message)
        if not where.personal:
            self._seen[where.channel_key] = where.conversation
        if not await self._addressed(message, where):
            return
        command = command_text(message.text)
        if command is not None:
            await self._command(message, where, command)
        else:
            await self._question(message, where)

    async def _addressed(self, message: TeamsMessage, where: Where) -> bool:
        """To the bot: a 1:1 message, an @mention, or a reply in a channel thread the bot already answered in."""
        if where.personal or message.mentions_bot:
            return True
        if where.conversation_type != "channel" or message.starts_thread:
            return False
        return await self.flow.answered_in(where.conversation_key)

    async def on_feedback(self, feedback: TeamsFeedback) -> None:
        """A 👍/👎 click: stored against the answer the rated message shows (looked up by its id)."""
        answer_id = await self.messages.answer_of(feedback.conversation.base_id, feedback.message_id)
        if answer_id is None:
            logger.info("Teams: feedback on message %s, which is not an answer", feedback.message_id)
            return
        rating: Any = "up" if feedback.reaction == "like" else "down"
        await self.flow.feedback(answer_id, feedback.user.identity, rating)

    async def on_membership(self, change: TeamsMembershipChange) -> None:
        """Someone joined or left: the conversation's audience is listed again at the next question."""
        self.audiences.invalidate(change.conversation.channel_key)
        self._members = {k: v for k, v in self._members.items() if k[0] != change.conversation.base_id}

    # Questions.

    async def _question(self, message: TeamsMessage, where: Where) -> None:
        reply = TeamsReply(self, where)
        try:
            claim: LeaseClaim | None = await self.flow.claim_question(self._event_key(message))
            if claim is None:
                return
        except Exception as exc:  # the database is down: say so rather than stay silent
            await reply.fail(self.flow.failure("claim", exc, where=where.conversation_key))
            return
        reply.placeholder_id = claim.placeholder  # taken over after a crash: answer in the same placeholder
        question = message.text
        if not question:
            await self.platform.post(where.target, message_activity(EMPTY_QUESTION))
            await self.flow.delivered(claim)
            return
        conversation = where.conversation_key
        answer_reply: TeamsReply | TeamsPrivateReply = reply
        if not where.personal:
            privately, question = asks_privately(question)
            if privately or await channel_mode(self.flow.state, where.channel_key) == "private":
                where = replace(where, private=True)
                answer_reply = TeamsPrivateReply(self, where)
                conversation = private_conversation(conversation, where.identity)
        ask = self._ask(question, conversation, where)
        await self.flow.answer(ask, answer_reply, claim=claim, target=asdict(where))

    def _ask(self, question: str, conversation: str, where: Where) -> Ask:
        # History: the chat core's memory of this conversation (a thread the bot answered in). Messages the bot
        # never received cannot be read back: the Bot Connector has no API for them (Microsoft Graph has).
        return Ask(question, conversation, where.identity, lambda: self._audience(where),
                   channel_key=None if where.personal else where.channel_key)

    @staticmethod
    def _event_key(message: TeamsMessage) -> str:
        return f"teams:msg:{message.conversation.base_id}:{message.activity_id}"

    async def resume(self, pending: PendingQuestion) -> tuple[Ask, TeamsReply | TeamsPrivateReply]:
        """A question whose holder died, rebuilt from its stored target: the answer replaces the placeholder that
        holder posted, or is posted afresh (never streamed: a half-written stream cannot be taken over). A private
        answer is sent to its asker alone again."""
        where = Where(**pending.target)
        reply: TeamsReply | TeamsPrivateReply = (
            TeamsPrivateReply(self, where) if where.private
            else TeamsReply(self, where, placeholder_id=pending.claim.placeholder, stream=False))
        return self._ask(pending.question, pending.conversation_id, where), reply

    # Who reads the answer.

    async def member(self, where: Where) -> TeamsMember | None:
        """The asker as the conversation's roster has them (email, tenant, role), cached USER_CACHE_SECONDS. None
        when Teams does not say (they are then treated as a member without a known email)."""
        user = where.user_aad or where.user_id
        key = (where.base_id, user)
        cached = self._members.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.settings.user_cache_seconds:
            return cached[1]
        try:
            found = await self.platform.member(where.conversation, user)
        except Exception as exc:
            logger.warning("Teams: could not read %s from the roster: %s", where.identity, exc)
            return None
        self._members[key] = (time.monotonic(), found)
        return found

    def standing(self, member: TeamsMember | None) -> Standing:
        if member is None or not member.is_guest(self.platform.home_tenant):
            return MEMBER
        role = (member.user_role or "").lower()
        return Standing(True, "a guest" if role in ("guest", "anonymous") else "a user of another organisation")

    async def _audience(self, where: Where) -> Audience:
        """A 1:1 chat or a private answer: the asker's access. Elsewhere: the conversation's audience."""
        member = await self.member(where)
        standing = self.standing(member)
        if where.personal or where.private:
            email = member.principal_email if member is not None and not standing.outsider else None
            audience = await private_audience(self.kb, where.identity, email)
        else:
            conversation = where.conversation
            audience = await self.audiences.audience(where.channel_key, where.identity,
                                                     lambda limit: self._list_members(conversation, limit))
        if standing.outsider:
            logger.info("Teams: %s is %s: GUEST_ACCESS=%s applies", where.identity, standing.why,
                        self.settings.guest_access)
        return outsider_audience(audience, standing, self.settings.guest_access)

    async def _list_members(self, conversation: TeamsConversation, limit: int) -> list[Member] | None:
        """None for a standard channel (its whole team may read it); the members of a group chat or a private or
        shared channel, paged. AudienceUnavailable when Teams cannot tell (the audience falls back to everyone +
        grants, never the asker's own access)."""
        if not conversation.is_restricted:
            return None
        try:
            found = await self.platform.members(conversation, limit)
        except ValueError as exc:
            raise AudienceUnavailable(f"{exc} (CHANNEL_AUDIENCE_MAX_MEMBERS={limit})") from exc
        except Exception as exc:
            raise AudienceUnavailable(f"listing the members failed: {type(exc).__name__}") from exc
        home = self.platform.home_tenant
        return [Member(m.identity, m.principal_email, m.id.startswith("28:"), m.is_guest(home)) for m in found]

    # kb commands.

    async def _command(self, message: TeamsMessage, where: Where, text: str) -> None:
        try:
            if not await self.flow.claim(self._event_key(message)):
                return
        except Exception as exc:
            await self._tell(where, self.flow.failure("claim", exc, where=where.conversation_key))
            return
        member = await self.member(where)
        standing = self.standing(member)
        # Team owners would need Microsoft Graph: admins are ADMIN_USER_IDS (teams:<aadObjectId>) for now.
        listed = self.settings.is_listed_admin(PLATFORM, where.user_aad or where.user_id)
        caller = admin.Caller(
            where.identity, listed, channel_key=None if where.personal else where.channel_key,
            workspace=f"teams:{where.tenant_id or '-'}:", resolve_person=self.person,
            email=member.principal_email if member is not None and not standing.outsider else None,
            operator=listed, reads_channel=lambda key: self._reads_channel(key, where.identity),
        )
        result = await self.flow.command(text, caller)
        await self._tell(where, result.text)
        if result.followup is not None:
            self._spawn(self._followup(result.followup, where))

    async def _followup(self, job: Callable[[], Awaitable[str]], where: Where) -> None:
        await self._tell(where, await self.flow.followup(job))

    async def _tell(self, where: Where, text: str) -> None:
        """A command's reply: in a 1:1 chat, a message; elsewhere a targeted message only the caller sees."""
        try:
            if where.personal:
                await self.platform.post(where.target, message_activity(text))
            else:
                await self.platform.post_private(where.target, where.user_id, message_activity(text))
        except Exception:
            logger.exception("Teams: could not post a command's reply")

    async def _reads_channel(self, key: str, identity: str) -> bool:
        """Could this user read the conversation `key` as a member? Only conversations this process has seen."""
        conversation = self._seen.get(key)
        if conversation is None:
            return False
        return await self.audiences.may_read(key, identity, lambda limit: self._list_members(conversation, limit))

    async def person(self, argument: str) -> Person | str:
        """`kb access USER`: a Teams user (`teams:<aadObjectId>`, mapped principals only: Teams gives an email
        only for a member of the conversation at hand) or a principal (`user:alice@acme.com`) as it is."""
        argument = argument.strip()
        if argument.lower().startswith("teams:") and len(argument) > len("teams:"):
            return Person((), f"teams:{argument[len('teams:'):]}")
        return check_principal(argument)


class TeamsReply:
    """The chat flow's `Reply` for Teams: the answer streamed into a 1:1 chat, or a placeholder updated at most
    once a second and replaced by the answer; an apology ends the stream or replaces the placeholder."""

    def __init__(self, adapter: TeamsAdapter, where: Where, placeholder_id: str | None = None, *,
                 stream: bool = True) -> None:
        self.adapter = adapter
        self.where = where
        self.placeholder_id = placeholder_id  # set: a placeholder posted before a crash, to answer in
        self.may_stream = stream
        self.stream: TeamsStream | None = None
        self.written = ""
        self._updated_at = 0.0

    @property
    def placeholder(self) -> str | None:
        """The placeholder's id, stored with the claim (`bot.chat.lease`). A stream has none: a crash mid-stream
        leaves it unfinished, and the takeover posts the answer anew."""
        return self.placeholder_id

    async def begin(self) -> None:
        return None

    async def open(self) -> OnText | None:
        if self.placeholder_id:  # resumed: the placeholder is already there
            return None
        platform = self.adapter.platform
        if self.where.personal and self.may_stream and self.adapter.teams.stream_personal:
            try:
                self.stream = await platform.stream(self.where.target)
            except Exception as exc:
                logger.info("Teams refused to stream (%s); answering with a placeholder instead", exc)
            else:
                self.stream.informative(STATUS_SEARCHING)
                return self._stream_text
        self.placeholder_id = await platform.post(self.where.target, message_activity(PLACEHOLDER))
        self._updated_at = time.monotonic()
        return self._paced_text

    async def _stream_text(self, delta: str) -> None:
        assert self.stream is not None
        self.stream.append(delta)  # the SDK sends the text so far about once a second

    async def _paced_text(self, delta: str) -> None:
        self.written += delta
        if self.placeholder_id is None or time.monotonic() - self._updated_at < UPDATE_SECONDS:
            return
        self._updated_at = time.monotonic()
        try:
            await self.adapter.platform.update(self.where.target, self.placeholder_id,
                                               message_activity(safe_text(self.written) + " …"))
        except Exception as exc:  # a missed progress update is not a failure: the answer replaces it
            logger.info("Teams: a progress update failed: %s", exc)

    async def end(self) -> None:
        return None

    async def deliver(self, answer: Answer, answer_id: int) -> None:
        text, citations = answer_text(answer), answer_citations(answer)
        platform = self.adapter.platform
        message_id: str | None
        if self.stream is not None:
            message_id = await self.stream.finish(text, citations=citations, feedback=True)
            if message_id is None:  # the user pressed Stop: nothing more is sent
                return
        else:
            activity = message_activity(text, citations=citations, ai_generated=True, feedback=True)
            if self.placeholder_id:
                await platform.update(self.where.target, self.placeholder_id, activity)
                message_id = self.placeholder_id
            else:
                message_id = await platform.post(self.where.target, activity)
        await self.adapter.messages.remember(self.where.base_id, message_id, answer_id)

    async def fail(self, text: str) -> None:
        platform = self.adapter.platform
        try:
            if self.stream is not None:
                if not self.stream.stopped:
                    await self.stream.finish(text, feedback=False, ai_generated=False)
            elif self.placeholder_id:
                await platform.update(self.where.target, self.placeholder_id, message_activity(text))
            else:
                await platform.post(self.where.target, message_activity(text))
        except Exception:
            logger.exception("Teams: could not even post the apology")


class TeamsPrivateReply:
    """The flow's `Reply` for a private answer in a channel or group chat: nothing is shown until the answer is
    ready, then a targeted message only the asker sees, in the thread; an apology goes the same way."""

    def __init__(self, adapter: TeamsAdapter, where: Where) -> None:
        self.adapter = adapter
        self.where = where

    async def begin(self) -> None:
        return None

    async def open(self) -> OnText | None:
        return None

    async def end(self) -> None:
        return None

    async def deliver(self, answer: Answer, answer_id: int) -> None:
        activity = message_activity(answer_text(answer), citations=answer_citations(answer), ai_generated=True,
                                    feedback=True)
        message_id = await self.adapter.platform.post_private(self.where.target, self.where.user_id, activity)
        await self.adapter.messages.remember(self.where.base_id, message_id, answer_id)

    async def fail(self, text: str) -> None:
        try:
            await self.adapter.platform.post_private(self.where.target, self.where.user_id, message_activity(text))
        except Exception:
            logger.exception("Teams: could not even post the apology")
