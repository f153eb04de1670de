"""The Teams adapter: Teams activities into the shared chat flow (`bot.chat.flow`), the flow's replies back to Teams.

Served on PORT at `POST /api/messages` (`TeamsPlatform`: every request's Bot Connector JWT is validated first).
What is answered:
- a personal (1:1) chat: every message;
- a channel: an @mention, answered in the message's reply thread; a later reply in a thread where the bot already
  answered, mention or not (Teams delivers unmentioned channel messages only to an app granted the
  ChannelMessage.Read.Group permission; without it a follow-up needs an @mention);
- a group chat: an @mention.
Each question is claimed once on its activity id (`ChatFlow.claim_question`); a message starting with `kb` is a
command (`ChatFlow.command`, as declared in teams-manifest/manifest.json).

The chat core decides who reads an answer (`AudienceRule`, from each question's `AnswerTarget`), resumes a crashed
holder's question (`ChatFlow.resume`), the private/public choice and what an answer shows (`answer_view`). This
adapter supplies the platform facts (the `Directory`: a person's email and standing from the roster, a group chat's
or private/shared channel's members; a standard channel is open), a `Reply` for a place (`reply_for`), and the
Teams rendering: in a 1:1 chat the answer streams (informative update, streaming updates about a second apart, the
final message; a 403, the user's Stop, ends it); elsewhere a placeholder updated at most once a second becomes the
answer, with its citations (the message's citation entity), the AI label and 👍/👎 buttons (`message/submitAction`,
stored as feedback). A private answer is a targeted message only the asker sees.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bot.chat.audience import AudienceUnavailable, Member
from bot.chat.cache import BoundedCache
from bot.chat.delivery import private_conversation
from bot.chat.flow import Ask, ChatFlow, CommandUser, OnText, PrivateReply, Reply
from bot.chat.guests import Standing
from bot.chat.lease import start_sweeper, stop_sweeper
from bot.chat.readers import AnswerTarget, AudienceRule, PersonInfo, Readers
from bot.chat.render import AnswerView, answer_view
from bot.teams.activities import ConversationType, TeamsConversation, TeamsFeedback, TeamsMembershipChange, TeamsMessage
from bot.teams.messages import AnswerMessages
from bot.teams.owners import TeamOwners
from bot.teams.platform import ReplyTarget, TeamsMember, TeamsPlatform, TeamsStream, message_activity
from bot.teams.render import PLACEHOLDER, STATUS_SEARCHING, answer_content, safe_text, share_card
from bot.teams.settings import TeamsSettings
from knowledge import Person, check_principal

if TYPE_CHECKING:
    from bot.chat.state import PendingQuestion
    from bot.context import BotContext
    from knowledge import Answer

logger = logging.getLogger(__name__)

PLATFORM = "teams"
# A placeholder is updated at most this often while the answer is written (Teams throttles a bot that edits a
# message faster; "Optimize your bot: rate limiting and best practices in Microsoft Teams").
UPDATE_SECONDS = 1.0
COMMAND_WORDS = ("kb", "/kb")
# What the adapter remembers per person and per conversation (roster entries, where someone was last seen): at most
# this many of each, the least recently used forgotten first.
CACHE_ENTRIES = 10_000


@dataclass(frozen=True)
class Where:
    """Where a question was asked and where its answer goes: plain data, stored with the question's claim so a
    takeover after a crash (`ChatFlow.resume` through `TeamsAdapter.reply_for`) answers in the same place."""

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
    team_group_id: str | None = None  # a team channel's Microsoft 365 group id (Graph's team id: its owners)

    @classmethod
    def of(cls, message: TeamsMessage) -> Where:
        c = message.conversation
        return cls(c.service_url, message.reply_conversation_id, c.type, c.tenant_id,
                   message.thread_root or message.activity_id, c.base_id, c.channel_type, c.team_id,
                   message.user.id, message.user.aad_object_id, message.thread_root,
                   team_group_id=c.team_group_id if c.type == "channel" else None)

    @property
    def target(self) -> ReplyTarget:
        return ReplyTarget(self.service_url, self.conversation_id, self.conversation_type, self.tenant_id,
                           self.reply_to_id)

    @property
    def conversation(self) -> TeamsConversation:
        return TeamsConversation(self.conversation_id, self.conversation_type, self.tenant_id, self.service_url,
                                 self.team_id, self.channel_type, self.team_group_id)

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
        self.rule = AudienceRule(self.kb, context.state, self, ttl_seconds=self.settings.channel_audience_ttl,
                                 max_members=self.settings.channel_audience_max_members,
                                 guest_access=self.settings.guest_access)
        self.audiences = self.rule.channels  # member lists, invalidated on membership events
        self.flow = ChatFlow(self.kb, PLATFORM, context.metrics, state=context.state,
                             lease_seconds=self.settings.answer_lease_seconds,
                             heartbeat_seconds=self.settings.answer_heartbeat_seconds, rule=self.rule,
                             listed_admin=self.settings.is_listed_admin)
        self.platform = TeamsPlatform(self.teams, on_message=self.on_message, on_feedback=self.on_feedback,
                                      on_membership=self.on_membership)
        self.messages = AnswerMessages(context.state.engine)
        app_id, app_password = self.teams.require()
        # Team owners are kb admins in their team's channels (Microsoft Graph, cached USER_CACHE_SECONDS).
        self.owners = TeamOwners(app_id=app_id, app_password=app_password, default_tenant=self.teams.tenant_id,
                                 graph_base_url=self.teams.graph_base_url, login_base_url=self.teams.login_base_url,
                                 ttl_seconds=self.settings.user_cache_seconds)
        # Roster entries by (conversation, identity), for USER_CACHE_SECONDS.
        self._members: BoundedCache[tuple[str, str], tuple[TeamsMember | None]] = BoundedCache(
            CACHE_ENTRIES, self.settings.user_cache_seconds)
        # Teams tells emails and members only within a conversation: those seen (live, or a resumed question's),
        # by channel key and by the identity last seen in it.
        self._seen: BoundedCache[str, TeamsConversation] = BoundedCache(CACHE_ENTRIES)
        self._roster_of: BoundedCache[str, TeamsConversation] = BoundedCache(CACHE_ENTRIES)
        self._sweeper: asyncio.Task[None] | None = None

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
        await self.flow.drain()

    def _note(self, where: Where) -> None:
        """Remember where `where`'s asker was seen: the Directory asks that conversation's roster."""
        if not where.personal:
            self._seen.put(where.channel_key, where.conversation)
        self._roster_of.put(where.identity, where.conversation)

    # Events (TeamsPlatform calls these; its own handler logs what they raise).

    async def on_message(self, message: TeamsMessage) -> None:
        where = Where.of(message)
        self._note(where)
        if message.action is not None:
            await self._card_action(message, where)
            return
        if not await self._addressed(message, where):
            if where.conversation_type == "channel" and message.starts_thread:
                await self._auto_question(message, where)
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
        ack = await self.flow.feedback(answer_id, feedback.user.identity, rating)
        c = feedback.conversation
        where = ReplyTarget(c.service_url, c.id, c.type, c.tenant_id, feedback.message_id)
        # The same acknowledgement as on every platform (bot.chat.feedback), to the clicker alone.
        await self.flow.kb_reply(lambda text: self._tell_at(where, feedback.user.id, text), ack.text)

    async def on_membership(self, change: TeamsMembershipChange) -> None:
        """Someone joined or left: the conversation's audience is listed again at the next question."""
        self.audiences.invalidate(change.conversation.channel_key)
        self._members.drop(lambda key: key[0] == change.conversation.base_id)

    async def _card_action(self, message: TeamsMessage, where: Where) -> None:
        """A click on a card button. "Share in channel" under a private answer: its question answered AGAIN with
        the conversation's audience and posted in the thread for everyone (the private text is never reposted);
        only its asker may share it, once (`ChatFlow.claim_share`), anyone else is told so privately."""
        action = message.action or {}
        try:
            answer_id = int(action["answer"]) if action.get("ragbot") == "share" else None
        except (KeyError, TypeError, ValueError):
            answer_id = None
        if answer_id is None or where.personal:
            return
        share = await self.flow.claim_share(answer_id, where.identity)
        if isinstance(share, str):
            await self.flow.kb_reply(lambda text: self._tell(where, text), share)
            return
        public = replace(where, private=False)
        ask = self.flow.ask(share.question, share.conversation_id, where.identity, self._target(public))
        await self.flow.answer(ask, TeamsReply(self, public, stream=False))

    async def _auto_question(self, message: TeamsMessage, where: Where) -> None:
        """A new channel post nobody addressed to the bot, in a channel with `kb channel auto on` (Teams delivers
        it only to an app granted ChannelMessage.Read.Group): answered in its thread when it reads as a question
        and the documents answer it; otherwise nothing is posted (`ChatFlow.auto_claim`, bot.chat.auto)."""
        claim = await self.flow.auto_claim(message.text, where.channel_key,
                                           lambda: self.flow.claim_question(self._event_key(message)))
        if claim is None:
            return
        target = self._target(where)
        ask = self.flow.ask(message.text, where.conversation_key, where.identity, target, auto=True)
        await self.flow.answer(ask, TeamsReply(self, where, stream=False), claim=claim, target=target.to_json())

    # Questions.

    async def _question(self, message: TeamsMessage, where: Where) -> None:
        reply = TeamsReply(self, where)
        claim = await self.flow.claim_or_apologise(reply, self._event_key(message), where=where.conversation_key)
        if claim is None:
            return
        reply.placeholder_id = claim.placeholder  # taken over after a crash: answer in the same placeholder
        question = message.text
        if await self.flow.hint_if_empty(question, claim,
                                         lambda hint: self.platform.post(where.target, message_activity(hint))):
            return
        # History: the chat core's memory of this conversation (a thread the bot answered in). Messages the bot
        # never received cannot be read back: the Bot Connector has no API for them (Microsoft Graph has).
        conversation = where.conversation_key
        answer_reply: Reply = reply
        privacy = await self.flow.answers_privately(question, None if where.personal else where.channel_key)
        question = privacy.question
        if privacy.private:
            where = replace(where, private=True)
            answer_reply = TeamsPrivateReply(self, where)
            conversation = private_conversation(conversation, where.identity)
        target = self._target(where)
        ask = self.flow.ask(question, conversation, where.identity, target, settings=privacy.settings)
        await self.flow.answer(ask, answer_reply, claim=claim, target=target.to_json())

    @staticmethod
    def _target(where: Where) -> AnswerTarget:
        """Readers: the asker alone (a 1:1 chat, a private answer) or the conversation; its settings; `Where`."""
        alone = where.personal or where.private
        return AnswerTarget(Readers(None if alone else where.channel_key), asdict(where),
                            settings=None if where.personal else where.channel_key)

    @staticmethod
    def _event_key(message: TeamsMessage) -> str:
        return f"teams:msg:{message.conversation.base_id}:{message.activity_id}"

    async def resume(self, pending: PendingQuestion) -> tuple[Ask, Reply] | None:
        """A question whose holder died: rebuilt by the chat core from its stored target (`ChatFlow.resume`)."""
        return await self.flow.resume(pending, self.reply_for)

    async def reply_for(self, post: Mapping[str, Any], placeholder: str | None) -> Reply:
        """The answer replaces the placeholder the dead holder posted, or is posted afresh (never streamed: a
        half-written stream cannot be taken over); a private answer is sent to its asker alone again."""
        where = Where(**post)
        self._note(where)  # a new process: the Directory learns the conversation from the stored place
        if where.private:
            return TeamsPrivateReply(self, where)
        return TeamsReply(self, where, placeholder_id=placeholder, stream=False)

    # The core's Directory (bot.chat.readers): what Teams says of a person and of a conversation's members.

    async def person(self, identity: str) -> PersonInfo:
        """The email and standing (guest/anonymous `userRole`, or another tenant) the roster of the conversation
        `identity` was last seen in gives, cached USER_CACHE_SECONDS; a member with no known email when Teams does
        not say."""
        conversation = self._roster_of.get(identity)
        if conversation is None:
            return PersonInfo()
        key = (conversation.base_id, identity)
        cached = self._members.get(key)
        if cached is not None:
            member = cached[0]
        else:
            try:
                member = await self.platform.member(conversation, identity.partition(":")[2])
            except Exception as exc:
                logger.warning("Teams: could not read %s from the roster: %s", identity, exc)
                return PersonInfo()
            self._members.put(key, (member,))
        if member is None or not member.is_guest(self.platform.home_tenant):
            return PersonInfo(member.principal_email if member is not None else None)
        role = (member.user_role or "").lower()
        why = "a guest" if role in ("guest", "anonymous") else "a user of another organisation"
        return PersonInfo(member.principal_email, Standing(True, why))

    async def channel_members(self, channel_key: str, limit: int) -> Sequence[Member] | None:
        """None for a standard channel (its whole team may read it); the members of a group chat or a private or
        shared channel, paged. AudienceUnavailable when Teams cannot tell (the audience falls back to everyone +
        grants, never the asker's own access)."""
        conversation = self._seen.get(channel_key)
        if conversation is None:
            raise AudienceUnavailable("this process has not seen the conversation, so cannot list its members")
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
            await self.flow.kb_reply(lambda text: self._tell(where, text),
                                     self.flow.failure("claim", exc, where=where.conversation_key))
            return
        # Admins: ADMIN_USER_IDS (teams:<aadObjectId>), and in a team's channel the team's owners (Microsoft Graph).
        who = CommandUser(where.user_aad or where.user_id, channel_key=None if where.personal else where.channel_key,
                          person=await self._commander(where),
                          workspace=f"teams:{where.tenant_id or '-'}:", resolve_person=self.resolve_person,
                          reads_channel=lambda key: self._reads_channel(key, where.identity))
        await self.flow.kb_command(text, who, lambda reply: self._tell(where, reply))

    async def _commander(self, where: Where) -> PersonInfo:
        """What the roster says of a command's caller (`person`), with `admin` set when they own the team whose
        channel they typed in. A personal or group chat has no team: ADMIN_USER_IDS alone makes admins there. The
        core counts `admin` only for a member of the home organisation (`trusted_admin`): a guest owner is not one."""
        try:
            person = await self.person(where.identity)
        except Exception:
            logger.warning("Teams: could not look %s up for a kb command", where.identity, exc_info=True)
            person = PersonInfo()
        if where.conversation_type != "channel" or not where.team_group_id or not where.user_aad:
            return person
        owner = await self.owners.is_owner(where.team_group_id, where.user_aad, where.tenant_id)
        return replace(person, admin=owner)

    async def _tell(self, where: Where, text: str) -> None:
        """A reply only the asker sees (a command's, a refused Share)."""
        await self._tell_at(where.target, where.user_id, text)

    async def _tell_at(self, target: ReplyTarget, user_id: str, text: str) -> None:
        """A message only `user_id` sees: in a 1:1 chat, a message; elsewhere a targeted message."""
        if target.conversation_type == "personal":
            await self.platform.post(target, message_activity(text))
        else:
            await self.platform.post_private(target, user_id, message_activity(text))

    async def _reads_channel(self, key: str, identity: str) -> bool:
        """Could this user read the conversation `key` as a member? Only conversations this process has seen."""
        if key not in self._seen:
            return False
        return await self.audiences.may_read(key, identity, lambda limit: self.channel_members(key, limit))

    async def resolve_person(self, argument: str) -> Person | str:
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
        text, citations = answer_content(answer_view(answer, answer_id))
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


class TeamsPrivateReply(PrivateReply):
    """A private answer in a channel or group chat (bot.chat.flow.PrivateReply): a targeted message only the asker
    sees, in the thread; under an answer, the private note and the "Share in channel" card button."""

    def __init__(self, adapter: TeamsAdapter, where: Where) -> None:
        self.adapter = adapter
        self.where = where

    async def post_privately(self, view: AnswerView) -> None:
        platform, where = self.adapter.platform, self.where
        if view.feedback is None:  # an apology
            await platform.post_private(where.target, where.user_id, message_activity(view.text))
            return
        text, citations = answer_content(view)
        activity = message_activity(text, citations=citations, ai_generated=True, feedback=True,
                                    attachments=[share_card(view.feedback, view.share)] if view.share else ())
        message_id = await platform.post_private(where.target, where.user_id, activity)
        await self.adapter.messages.remember(where.base_id, message_id, view.feedback)
