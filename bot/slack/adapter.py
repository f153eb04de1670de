"""The Slack adapter: slack-bolt's AsyncApp in HTTP mode (POST /slack/events on PORT, signed requests) or Socket
Mode (SLACK_APP_TOKEN).

A Slack event becomes an `Ask` for the shared chat flow (`bot.chat.flow`: claim → audience → history → answer →
deliver, errors, `/kb`, feedback); `SlackReply` is the flow's `Reply` for Slack: the answer streamed into the thread
(Claude) or a placeholder replaced by it, then the Sources list and feedback buttons. What is Slack-specific lives
here and in `bot/slack/format.py`.

Events handled: `app_mention` (answer in the thread, starting one under the mention), `message.im` (answer in the
DM), `message.channels` / `message.groups` top-level questions in a help channel (`/kb channel auto on`: answered
in a thread only when there is an answer), replies in a thread the bot already answered in (a follow-up without a re-mention, `SLACK_THREAD_FOLLOWUPS`),
and the AI-assistant surface (`assistant_thread_started`, messages in assistant threads). The bot's own messages,
other bots, edits and other subtypes are ignored.

Who reads an answer (docs/permissions.md, "In chat"): a DM or assistant thread answers from the asker's access
(`kb.principals_for`, with the email from users.info); a private channel or group DM from what every member may see
(`conversations.info` + `conversations.members`, bot.chat.audience), refreshed on `member_joined_channel` /
`member_left_channel`; a public channel from `everyone` + grants. A question with the word "privately", or any
question in a channel whose mode is private (bot.chat.delivery), is answered with `chat.postEphemeral` from the
asker's access, with a "Share in channel" button that answers again for the channel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.middleware.assistant.async_assistant import AsyncAssistant
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.audience import AudienceUnavailable, Member
from bot.chat.delivery import private_conversation
from bot.chat.errors import new_error_id
from bot.chat.feedback import parse_button_value
from bot.chat.flow import Ask, ChatFlow, CommandUser, OnText, PrivateReply
from bot.chat.guests import MEMBER, Standing
from bot.chat.history import PRIOR_MESSAGES_LIMIT, ThreadMessage
from bot.chat.lease import start_sweeper, stop_sweeper
from bot.chat.readers import AnswerTarget, AudienceRule, PersonInfo, Readers
from bot.chat.render import SHARE_LABEL, AnswerView, answer_view
from bot.server import StartupError
from bot.slack.format import (
    BLOCKS_PER_MESSAGE,
    FEEDBACK_ACTION_ID,
    PLACEHOLDER,
    SlackMessage,
    answer_messages,
    question_text,
    stream_safe,
    stream_tail_blocks,
    to_mrkdwn,
)
from knowledge import Person, check_principal

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from bot.chat.flow import Reply
    from bot.chat.state import PendingQuestion
    from bot.context import BotContext
    from knowledge import Answer

logger = logging.getLogger(__name__)

PLATFORM = "slack"
EVENTS_PATH = "/slack/events"
GREETING = ("Hi! I answer questions from your company's documents, with sources. In this private thread I can use "
            "every document you may see.")
SUGGESTED_PROMPTS = [
    {"title": "What can you answer?", "message": "Which topics do the documents cover?"},
    {"title": "Time off", "message": "How many vacation days do I get?"},
    {"title": "Expenses", "message": "How do I submit an expense report?"},
]
STATUS_SEARCHING = "is searching the documents…"
# conversations.replies pages: a thread longer than this many pages keeps the last messages of the pages read.
THREAD_PAGE_SIZE = 200
THREAD_MAX_PAGES = 10
MEMBERS_PAGE_SIZE = 200  # conversations.members: Slack recommends no more than 200 per page
USERS_INFO_CONCURRENCY = 8  # users.info calls in flight while resolving a channel's members
SHARE_ACTION_ID = "ragbot_share"
_USER_MENTION = re.compile(r"^<@([UW][A-Z0-9]+)(?:\|[^>]*)?>$")
_USER_ID = re.compile(r"^(?:slack:)?([UW][A-Z0-9]{2,})$")


@dataclass(frozen=True)
class SlackUser:
    """What users.info says of a user (https://api.slack.com/types/user): `team_id`, the guest flags
    `is_restricted` (multi-channel guest) / `is_ultra_restricted` (single-channel guest), `is_stranger` (a user of
    another organisation met through Slack Connect)."""

    id: str
    email: str | None
    is_admin: bool
    is_bot: bool
    team_id: str | None = None
    guest: bool = False  # is_restricted or is_ultra_restricted
    stranger: bool = False  # is_stranger
    enterprise_id: str | None = None  # enterprise_user.enterprise_id: their Enterprise Grid organisation

    def standing(self, home_team: str | None, home_enterprise: str | None = None) -> Standing:
        """A guest, or a user of another organisation: a stranger, or a team that is not the installed one (on
        Enterprise Grid, another workspace of the installing organisation is the same organisation)."""
        same_org = home_enterprise is not None and self.enterprise_id == home_enterprise
        other_team = home_team is not None and self.team_id is not None and self.team_id != home_team
        if self.stranger or (other_team and not same_org):
            return Standing(True, "a user of another organisation")
        if self.guest:
            return Standing(True, "a guest")
        return MEMBER


class UserDirectory:
    """users.info with a TTL cache: the asker's email (principal `user:<email>`) and admin flag."""

    def __init__(self, client: AsyncWebClient, ttl_seconds: float) -> None:
        self.client = client
        self.ttl = ttl_seconds
        self._cache: dict[str, tuple[float, SlackUser]] = {}

    async def get(self, user_id: str) -> SlackUser | None:
        cached = self._cache.get(user_id)
        if cached and time.monotonic() - cached[0] < self.ttl:
            return cached[1]
        try:
            response = await self.client.users_info(user=user_id)
        except SlackClientError as exc:
            logger.warning("users.info failed for %s: %s", user_id, getattr(exc, "response", exc))
            return None
        data = response.get("user") or {}
        user = SlackUser(
            id=user_id,
            email=(data.get("profile") or {}).get("email") or None,
            is_admin=bool(data.get("is_admin") or data.get("is_owner") or data.get("is_primary_owner")),
            is_bot=bool(data.get("is_bot")),
            team_id=data.get("team_id") or None,
            guest=bool(data.get("is_restricted") or data.get("is_ultra_restricted")),
            stranger=bool(data.get("is_stranger")),
            enterprise_id=(data.get("enterprise_user") or {}).get("enterprise_id") or None,
        )
        self._cache[user_id] = (time.monotonic(), user)
        return user


@dataclass(frozen=True)
class Where:
    """Where a question was asked and where its answer goes."""

    team: str
    channel: str
    thread_ts: str | None  # None: answer at the top level of a DM
    message_ts: str
    user: str
    private: bool  # a DM or assistant thread: the asker's own documents may be used
    assistant: bool = False
    ephemeral: bool = False  # a private answer in a channel: chat.postEphemeral to the asker only

    @property
    def conversation_id(self) -> str:
        return f"slack:{self.team}:{self.channel}:{self.thread_ts or 'dm'}"

    @property
    def channel_key(self) -> str:
        return f"slack:{self.team}:{self.channel}"


class SlackStartError(StartupError):
    """Slack would not let the bot in, or could not be reached: the message names the setting and the fix."""


# Slack's answers to a refused token (auth.test's documented errors, https://api.slack.com/methods/auth.test, and
# the errors every Web API method may return, https://api.slack.com/web#errors).
_REFUSED_TOKEN = {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired",
                  "not_allowed_token_type", "invalid_token"}


@contextmanager
def slack_start_errors(api_url: str, setting: str) -> Iterator[None]:
    """Turn what Slack answers at start-up into SlackStartError: a refused token names `setting`, a missing scope
    names the scope (`needed`, per https://api.slack.com/web#errors), an unreachable host names SLACK_API_URL."""
    try:
        yield
    except SlackApiError as exc:
        error = str(exc.response.get("error", "")) if exc.response is not None else ""
        if error == "missing_scope":
            needed = exc.response.get("needed") or "a scope"
            raise SlackStartError(
                f"Slack: {setting} lacks the scope {needed}: add it to the app (OAuth & Permissions → Scopes, or "
                "from slack-manifest.yml), reinstall the app to the workspace and copy the new token into "
                f"{setting}") from None
        if error in _REFUSED_TOKEN:
            kind = "app-level token (xapp-…, Basic Information → App-Level Tokens, with connections:write)" if \
                setting == "SLACK_APP_TOKEN" else "Bot User OAuth Token (xoxb-…, OAuth & Permissions)"
            raise SlackStartError(f"Slack refused {setting} ({error}): copy the app's {kind} into {setting}") \
                from None
        raise SlackStartError(f"Slack answered {error or 'an error'} at start-up: check {setting} and the app's "
                              "settings at https://api.slack.com/apps") from None
    except (TimeoutError, SlackClientError, aiohttp.ClientError, OSError) as exc:
        raise SlackStartError(f"could not reach Slack at {api_url} ({type(exc).__name__}): check the network (a "
                              "proxy, a firewall), or SLACK_API_URL") from None


def _bolt_logger() -> logging.Logger:
    """slack-bolt's logger, without the warning it logs at every start when SLACK_BOT_TOKEN is in the environment
    ("As you gave `client` as well, `token` will be unused": it reads the variable itself although we hand it the
    client built from the same token), a line before any real error that would only confuse."""
    bolt = logging.getLogger("slack_bolt")
    if not any(isinstance(f, _TokenUnusedFilter) for f in bolt.filters):
        bolt.addFilter(_TokenUnusedFilter())
    return bolt


class _TokenUnusedFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "`token` will be unused" not in record.getMessage()


class SlackAdapter:
    name = PLATFORM

    def __init__(self, context: BotContext, *, client: AsyncWebClient | None = None) -> None:
        self.context = context
        self.kb = context.kb
        self.settings = context.settings
        self.metrics = context.metrics
        self.rule = AudienceRule(self.kb, context.state, self, ttl_seconds=self.settings.channel_audience_ttl,
                                 max_members=self.settings.channel_audience_max_members,
                                 guest_access=self.settings.guest_access)
        self.audiences = self.rule.channels  # channel member lists, invalidated on membership events
        self.flow = ChatFlow(self.kb, PLATFORM, self.metrics, state=context.state,
                             lease_seconds=self.settings.answer_lease_seconds,
                             heartbeat_seconds=self.settings.answer_heartbeat_seconds, rule=self.rule,
                             listed_admin=self.settings.is_listed_admin)
        self._sweeper: asyncio.Task[None] | None = None
        token = self.settings.slack_bot_token.get_secret_value() if self.settings.slack_bot_token else None
        self.client = client or AsyncWebClient(
            token=token,
            base_url=self.settings.slack_api_url.rstrip("/") + "/",
            retry_handlers=[
                AsyncConnectionErrorRetryHandler(max_retry_count=2),
                AsyncRateLimitErrorRetryHandler(max_retry_count=4),
                AsyncServerErrorRetryHandler(max_retry_count=2),
            ],
        )
        self.socket_mode = bool(self.settings.slack_app_token and self.settings.slack_app_token.get_secret_value())
        signing_secret = self.settings.slack_signing_secret.get_secret_value() if self.settings.slack_signing_secret else ""
        if not self.socket_mode and not signing_secret:
            raise SlackStartError("SLACK_SIGNING_SECRET is required in HTTP mode: copy the Signing Secret from your "
                                  "app's Basic Information page (or set SLACK_APP_TOKEN for Socket Mode)")
        self.app = AsyncApp(
            client=self.client,
            signing_secret=signing_secret or "socket-mode-has-no-signatures",
            request_verification_enabled=not self.socket_mode,
            logger=_bolt_logger(),
        )
        self.users = UserDirectory(self.client, self.settings.user_cache_seconds)
        self.team_id: str | None = None  # the installed workspace (auth.test): users of other teams are outsiders
        self.enterprise_id: str | None = None
        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self._socket_handler: Any = None
        self._register()

    # Lifecycle (bot.app.Adapter).

    def routes(self) -> list[web.RouteDef]:
        return [] if self.socket_mode else [web.post(EVENTS_PATH, self.handle_http)]

    async def start(self) -> None:
        """Check the token (auth.test), then connect (Socket Mode). A refusal or an unreachable Slack raises
        SlackStartError, one line naming the setting to fix (`ragbot run` shows it without a traceback)."""
        with slack_start_errors(self.settings.slack_api_url, "SLACK_BOT_TOKEN"):
            identity = await self.client.auth_test()
        self.bot_user_id = identity.get("user_id")
        self.bot_id = identity.get("bot_id")
        self.team_id = identity.get("team_id") or None
        self.enterprise_id = identity.get("enterprise_id") or None  # Enterprise Grid: the installing organisation
        logger.info("Slack: connected as %s in %s (%s mode)", identity.get("user"), identity.get("team"),
                    "Socket" if self.socket_mode else "HTTP")
        # Questions a crashed process claimed but never answered: finished in their placeholders (bot.chat.lease).
        self._sweeper = start_sweeper(self.flow, self.resume, self.settings.answer_sweep_seconds)
        if self.socket_mode:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler  # Socket Mode only

            app_token = self.settings.slack_app_token
            assert app_token is not None  # socket_mode is set only when there is an app token
            self._socket_handler = AsyncSocketModeHandler(self.app, app_token.get_secret_value())
            socket = self._socket_handler.client
            # The socket URL is asked for here, not by connect_async, which would log a refused app token and retry
            # it for ever: a refusal is a one-line error naming SLACK_APP_TOKEN (connect uses the URL given).
            try:
                with slack_start_errors(self.settings.slack_api_url, "SLACK_APP_TOKEN"):
                    opened = await socket.web_client.apps_connections_open(app_token=app_token.get_secret_value())
            except SlackStartError:
                await self.stop()  # not started, so `ragbot run` will not stop it: the sweeper and socket client
                raise
            socket.wss_uri = opened["url"]
            await self._socket_handler.connect_async()

    async def stop(self) -> None:
        await stop_sweeper(self._sweeper)
        self._sweeper = None
        if self._socket_handler is not None:
            await self._socket_handler.close_async()
            self._socket_handler = None
        await self.flow.drain()

    async def handle_http(self, request: web.Request) -> web.Response:
        """POST /slack/events: events, interactivity and slash commands, verified by bolt (401 on a bad or stale
        signature). A payload bolt cannot make sense of is a 400, never a crash."""
        try:
            bolt_request = await to_bolt_request(request)
            bolt_response = await self.app.async_dispatch(bolt_request)
        except Exception:
            reference = new_error_id()
            logger.exception("Slack: could not handle a request (error id %s)", reference)
            return web.json_response({"error": "malformed request", "error_id": reference}, status=400,
                                     headers={"X-Slack-No-Retry": "1"})
        return await to_aiohttp_response(bolt_response)

    # Listeners.

    def _register(self) -> None:
        app = self.app
        assistant = AsyncAssistant()
        assistant.thread_started(self._on_assistant_thread_started)
        assistant.user_message(self._on_assistant_message)
        app.assistant(assistant)
        app.event("app_mention")(self._on_mention)
        app.event("message")(self._on_message)
        app.command("/kb")(self._on_kb_command)
        app.action(FEEDBACK_ACTION_ID)(self._on_feedback)
        app.action(SHARE_ACTION_ID)(self._on_share)
        app.event("member_joined_channel")(self._on_membership_change)
        app.event("member_left_channel")(self._on_membership_change)
        app.error(self._on_error)

    async def _on_error(self, error: Exception, body: dict[str, Any]) -> None:
        logger.error("Slack listener error: %s", error, exc_info=error)

    async def _on_assistant_thread_started(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        thread = event.get("assistant_thread") or {}
        channel, thread_ts = thread.get("channel_id"), thread.get("thread_ts")
        if not channel or not thread_ts:
            return
        if not await self._claim(body, None):
            return
        try:
            await self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=GREETING)
            await self.client.assistant_threads_setSuggestedPrompts(
                channel_id=channel, thread_ts=thread_ts, prompts=SUGGESTED_PROMPTS, title="Try asking:"
            )
        except SlackClientError:
            logger.exception("Slack: could not greet a new assistant thread")

    async def _on_assistant_message(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        if not self._is_user_message(event):
            return
        where = Where(self._team(body, event), event["channel"], event.get("thread_ts") or event["ts"], event["ts"],
                      event["user"], private=True, assistant=True)
        await self._question(body, event, where)

    async def _on_mention(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        if not self._is_user_message(event, allow_subtype=False):
            return
        channel = event["channel"]
        where = Where(self._team(body, event), channel, event.get("thread_ts") or event["ts"], event["ts"],
                      event["user"], private=channel.startswith("D"))
        await self._question(body, event, where, mid_thread=bool(event.get("thread_ts")))

    async def _on_message(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        if not self._is_user_message(event):
            return
        channel_type = event.get("channel_type")
        if channel_type == "im":
            where = Where(self._team(body, event), event["channel"], event.get("thread_ts"), event["ts"],
                          event["user"], private=True)
            await self._question(body, event, where)
            return
        thread_ts = event.get("thread_ts")
        text = event.get("text") or ""
        mentions_me = bool(self.bot_user_id and f"<@{self.bot_user_id}" in text)
        if channel_type in ("channel", "group") and (not thread_ts or thread_ts == event["ts"]) and not mentions_me:
            await self._auto_question(body, event)  # message.channels / message.groups: a help channel's question
            return
        if (not thread_ts or thread_ts == event["ts"] or not self.settings.slack_thread_followups
                or (self.bot_user_id and f"<@{self.bot_user_id}" in text)):  # a mention arrives as app_mention
            return
        where = Where(self._team(body, event), event["channel"], thread_ts, event["ts"], event["user"], private=False)
        if not await self.flow.answered_in(where.conversation_id):
            return
        await self._question(body, event, where)

    async def _auto_question(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        """A top-level message in a channel with `/kb channel auto on`: answered in a thread under it when it reads
        as a question and the documents answer it; otherwise nothing is posted (bot.chat.auto)."""
        text = event.get("text") or ""
        where = Where(self._team(body, event), event["channel"], event["ts"], event["ts"], event["user"],
                      private=False)
        if not await self.flow.auto_claim(text, where.channel_key, lambda: self._claim(body, event)):
            return
        question = question_text(text, self.bot_user_id)
        ask = self.flow.ask(question, where.conversation_id, f"slack:{where.user}", self._target(where), auto=True)
        await self.flow.answer(ask, SlackReply(self, where))

    def _is_user_message(self, event: dict[str, Any], allow_subtype: bool = False) -> bool:
        """A person's new message: not the bot's, not another bot's, not an edit, deletion or other subtype."""
        if not isinstance(event, dict) or event.get("bot_id") or event.get("bot_profile"):
            return False
        if event.get("subtype") and not allow_subtype:
            return False
        user = event.get("user")
        if not user or user == self.bot_user_id or not event.get("channel") or not event.get("ts"):
            return False
        return isinstance(event.get("text", ""), str)

    @staticmethod
    def _team(body: dict[str, Any], event: dict[str, Any]) -> str:
        return str(body.get("team_id") or event.get("team") or "T")

    async def _claim(self, body: dict[str, Any], event: dict[str, Any] | None) -> bool:
        """Exactly once: the event id, and for messages channel + ts (an app_mention and a message event for the
        same message, a retry, a second replica). Claimed in Postgres before any work."""
        keys = []
        if body.get("event_id"):
            keys.append(f"slack:event:{body['event_id']}")
        if event is not None:
            keys.append(f"slack:msg:{self._team(body, event)}:{event['channel']}:{event['ts']}")
        return await self.flow.claim(*keys)

    async def resume(self, pending: PendingQuestion) -> tuple[Ask, Reply] | None:
        """A question whose holder died: rebuilt by the chat core from its stored target (`ChatFlow.resume`)."""
        return await self.flow.resume(pending, self.reply_for)

    async def reply_for(self, post: Mapping[str, Any], placeholder: str | None) -> Reply:
        """The answer replaces the placeholder the dead holder posted (chat.update on its ts), or is posted afresh
        if it never got that far; a private answer (`ephemeral`) is posted ephemerally to its asker again."""
        where = Where(**post)
        return SlackEphemeralReply(self, where) if where.ephemeral else SlackReply(self, where, placeholder)

    @staticmethod
    def _target(where: Where) -> AnswerTarget:
        """Who reads the answer (a DM, an assistant thread or an ephemeral answer: the asker alone; otherwise the
        channel), whose settings apply (the channel's, also for a private answer in it) and where to post."""
        alone = where.private or where.ephemeral or where.channel.startswith("D")
        return AnswerTarget(Readers(None if alone else where.channel_key), asdict(where),
                            settings=None if where.private else where.channel_key)

    # Answering.

    async def _question(self, body: dict[str, Any], event: dict[str, Any], where: Where, mid_thread: bool = False) -> None:
        reply = SlackReply(self, where)
        # Exactly once, as a lease on the message (channel + ts; the event id is an alias): a retry after the lease
        # ran out undelivered takes the question over, with the placeholder to answer in.
        keys = [f"slack:event:{body['event_id']}"] if body.get("event_id") else []
        keys.append(f"slack:msg:{self._team(body, event)}:{event['channel']}:{event['ts']}")
        if (claim := await self.flow.claim_or_apologise(reply, *keys, where=where.conversation_id)) is None:
            return
        reply.placeholder_ts = claim.placeholder  # taken over after a crash: answer in the same placeholder
        question = question_text(event.get("text") or "", self.bot_user_id)
        if await self.flow.hint_if_empty(question, claim, lambda hint: self._post(where, SlackMessage(hint))):
            return
        history = self.flow.history(where.conversation_id, lambda: self._prior_messages(where),
                                    me=self.bot_user_id, before=_ts_float(where.message_ts),
                                    question_id=where.message_ts) if mid_thread else None
        identity = f"slack:{where.user}"
        conversation = where.conversation_id
        answer_reply: SlackReply | SlackEphemeralReply = reply
        privacy = await self.flow.answers_privately(question, None if where.private else where.channel_key)
        question = privacy.question
        if privacy.private:
            where = replace(where, ephemeral=True)
            answer_reply = SlackEphemeralReply(self, where)
            conversation = private_conversation(conversation, identity)
        target = self._target(where)
        ask = self.flow.ask(question, conversation, identity, target, history=history, settings=privacy.settings)
        # Claimed like every question (a private one too): if this process dies, a retry or the sweeper finishes it
        # from the stored target (`resume`), ephemerally when it was private.
        await self.flow.answer(ask, answer_reply, claim=claim, target=target.to_json())

    # The core's Directory (bot.chat.readers): what Slack says of a person and of a channel's members.

    async def person(self, identity: str) -> PersonInfo:
        user = await self.users.get(identity.partition(":")[2])
        if user is None:
            return PersonInfo()
        return PersonInfo(user.email, user.standing(self.team_id, self.enterprise_id), admin=user.is_admin)

    async def channel_members(self, channel_key: str, limit: int) -> Sequence[Member] | None:
        return await self._channel_members(channel_key.rpartition(":")[2], limit)

    async def _channel_members(self, channel: str, limit: int) -> list[Member] | None:
        """None for a public channel (everyone may join it); the members of a private channel or group DM
        (conversations.info `is_private`/`is_mpim`, then conversations.members paged by next_cursor), each with the
        email users.info gives. Raises AudienceUnavailable when Slack cannot tell us (the audience then falls back
        to everyone + grants)."""
        try:
            info = (await self.client.conversations_info(channel=channel)).get("channel") or {}
        except SlackClientError as exc:
            raise AudienceUnavailable(f"conversations.info failed: {_slack_error(exc)}") from exc
        if not (info.get("is_private") or info.get("is_mpim") or info.get("is_group") or info.get("is_ext_shared")):
            return None  # public, and not shared with another organisation: open to every member of the workspace
        ids: list[str] = []
        cursor: str | None = None
        try:
            while True:
                response = await self.client.conversations_members(channel=channel, limit=MEMBERS_PAGE_SIZE,
                                                                   cursor=cursor or None)
                ids += [u for u in response.get("members") or [] if u != self.bot_user_id]
                if len(ids) > limit:
                    raise AudienceUnavailable(f"more than CHANNEL_AUDIENCE_MAX_MEMBERS={limit} members")
                cursor = (response.get("response_metadata") or {}).get("next_cursor") or None
                if not cursor:
                    break
        except SlackClientError as exc:
            raise AudienceUnavailable(f"conversations.members failed: {_slack_error(exc)}") from exc
        gate = asyncio.Semaphore(USERS_INFO_CONCURRENCY)

        async def member(user_id: str) -> Member:
            async with gate:
                user = await self.users.get(user_id)
            if user is None:
                raise AudienceUnavailable(f"users.info failed for {user_id}")
            return Member(f"slack:{user_id}", user.email, user.is_bot, user.standing(self.team_id, self.enterprise_id).outsider)

        return list(await asyncio.gather(*(member(u) for u in dict.fromkeys(ids))))

    async def _on_membership_change(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        """member_joined_channel / member_left_channel: the channel's audience is recomputed at the next question
        (a newcomer who may not see a document stops it reaching the channel at once)."""
        channel = event.get("channel")
        if channel:
            self.audiences.invalidate(f"slack:{self._team(body, event)}:{channel}")

    async def resolve_person(self, argument: str) -> Person | str:
        """`/kb access USER`: a Slack user (`<@U1>`, `slack:U1`, `U1`) with their email from users.info, or a
        principal (`user:alice@acme.com`) as it is."""
        argument = argument.strip()
        match = _USER_MENTION.match(argument) or _USER_ID.match(argument)
        if match is None:
            return check_principal(argument)
        user_id = match.group(1)
        user = await self.users.get(user_id)
        email = user.email if user else None
        return Person((f"user:{email}",) if email else (), f"slack:{user_id}")

    async def _prior_messages(self, where: Where) -> list[ThreadMessage]:
        """Mentioned mid-thread: the thread's messages before the mention (which the bot never saw), for the core's
        history policy (`ChatFlow.history`). conversations.replies pages oldest first, so the pages are followed
        (response_metadata.next_cursor, at most THREAD_MAX_PAGES) and only the tail is held; a page that fails
        ends the reading with what was read."""
        if where.thread_ts is None:  # (a question mid-thread always has its thread's ts)
            return []
        before = _ts_value(where.message_ts)
        kept: dict[str, dict[str, Any]] = {}  # ts -> message, only those before the mention
        cursor: str | None = None
        try:
            for _ in range(THREAD_MAX_PAGES):
                response = await self.client.conversations_replies(
                    channel=where.channel, ts=where.thread_ts, limit=THREAD_PAGE_SIZE, cursor=cursor or None,
                    latest=where.message_ts, inclusive=False,
                )
                for message in response.get("messages") or []:
                    ts = str(message.get("ts") or "")
                    if ts and ts != where.message_ts and _ts_value(ts) < before:
                        kept[ts] = message
                if len(kept) > 2 * PRIOR_MESSAGES_LIMIT:  # only the tail is needed: bound what is held
                    kept = dict(sorted(kept.items(), key=lambda item: _ts_value(item[0]))[-PRIOR_MESSAGES_LIMIT:])
                cursor = (response.get("response_metadata") or {}).get("next_cursor") or None
                if not cursor:
                    break
        except SlackClientError as exc:
            if not kept:
                raise
            logger.warning("Slack: read only part of the thread for context: %s", exc)
        prior = []
        for ts, message in sorted(kept.items(), key=lambda item: _ts_value(item[0])):
            if message.get("subtype") not in (None, "thread_broadcast", "bot_message"):
                continue  # joins, edits' tombstones...
            mine = message.get("user") == self.bot_user_id or bool(self.bot_id and message.get("bot_id") == self.bot_id)
            author = self.bot_user_id if mine else str(message.get("user") or message.get("bot_id") or "")
            prior.append(ThreadMessage(author or "", mine or bool(message.get("bot_id")),
                                       question_text(message.get("text") or "", self.bot_user_id), _ts_float(ts),
                                       ts))
        return prior

    # Posting.

    async def _post(self, where: Where, message: SlackMessage) -> str | None:
        response = await self.client.chat_postMessage(
            channel=where.channel, thread_ts=where.thread_ts, text=message.text, blocks=message.blocks or None,
            unfurl_links=False, unfurl_media=False,
        )
        return response.get("ts")

    async def _deliver(self, where: Where, messages: list[SlackMessage], placeholder_ts: str | None) -> None:
        first, rest = messages[0], messages[1:]
        if placeholder_ts:
            await self.client.chat_update(channel=where.channel, ts=placeholder_ts, text=first.text,
                                          blocks=first.blocks or None)
        else:
            await self._post(where, first)
        for message in rest:
            await self._post(where, message)

    async def _set_status(self, where: Where, status: str) -> None:
        if where.thread_ts is None:  # only assistant threads have a status, and they always have their thread's ts
            return
        try:
            await self.client.assistant_threads_setStatus(channel_id=where.channel, thread_ts=where.thread_ts,
                                                          status=status)
        except SlackClientError as exc:
            logger.info("Slack: setStatus failed: %s", exc)

    # /kb and feedback.

    async def _on_kb_command(self, ack: Any, command: dict[str, Any], respond: Any) -> None:
        """`/kb …`: run by the chat core (`ChatFlow.kb_command`: who is an admin, refusals, the command, a job's
        report); its first reply is the slash command's ephemeral acknowledgement, later ones go through the
        response_url (or, once that has expired after 30 minutes, an ephemeral message)."""
        user_id = command.get("user_id") or ""
        channel = command.get("channel_id") or ""
        team = command.get("team_id") or "T"
        acknowledged = False

        async def reply(text: str) -> None:
            nonlocal acknowledged
            if not acknowledged:
                acknowledged = True
                await ack(response_type="ephemeral", text=to_mrkdwn(text))
                return
            try:
                await respond(response_type="ephemeral", text=to_mrkdwn(text), replace_original=False)
            except Exception:  # the response_url lasts 30 minutes: fall back to an ephemeral message
                await self.client.chat_postEphemeral(channel=channel, user=user_id, text=to_mrkdwn(text))

        who = CommandUser(user_id, channel_key=None if channel.startswith("D") or not channel
                          else f"slack:{team}:{channel}", workspace=f"slack:{team}:",
                          resolve_person=self.resolve_person,
                          reads_channel=lambda key: self._reads_channel(key, user_id))
        await self.flow.kb_command(command.get("text") or "", who, reply)

    async def _reads_channel(self, key: str, user_id: str) -> bool:
        """Could this user read the channel `key` ("slack:T1:C2") as a member? Public: yes; private: if a member."""
        prefix, _, channel = key.rpartition(":")
        if not channel or prefix != f"slack:{self.team_id or prefix.partition(':')[2]}":
            return False  # another workspace's channel
        return await self.audiences.may_read(key, f"slack:{user_id}",
                                             lambda limit: self._channel_members(channel, limit))

    async def _on_feedback(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        parsed = parse_button_value(str(action.get("value") or ""))
        user_id = (body.get("user") or {}).get("id")
        if parsed is None or not user_id:
            return
        rating, answer_id = parsed
        result = await self.flow.feedback(answer_id, f"slack:{user_id}", rating)
        channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id")
        message = body.get("message") or {}
        if channel:
            try:
                await self.client.chat_postEphemeral(channel=channel, user=user_id, text=result.text,
                                                     thread_ts=message.get("thread_ts") or message.get("ts"))
            except SlackClientError as exc:
                logger.info("Slack: could not acknowledge feedback: %s", exc)


    async def _on_share(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        """"Share in channel" under a private answer: the same question answered AGAIN with the channel's audience
        and posted in the thread for everyone; the private text is never reposted. Only its asker may share it,
        once."""
        await ack()
        user_id = (body.get("user") or {}).get("id") or ""
        channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id") or ""
        team = str((body.get("team") or {}).get("id") or (body.get("user") or {}).get("team_id") or "T")
        try:
            value = json.loads(str(action.get("value") or "{}"))
            answer_id, thread_ts = int(value["a"]), str(value["t"])
        except (ValueError, KeyError, TypeError):
            return
        if not user_id or not channel:
            return
        share = await self.flow.claim_share(answer_id, f"slack:{user_id}")
        if isinstance(share, str):
            return  # not the asker's, or shared already: the button sits under the asker's own ephemeral answer
        where = Where(team, channel, thread_ts, thread_ts, user_id, private=False)
        # Answered again as any question in this channel: its audience and its sources (`/kb channel sources`).
        ask = self.flow.ask(share.question, share.conversation_id, f"slack:{user_id}", self._target(where))
        await self.flow.answer(ask, SlackReply(self, where))


def view_messages(view: AnswerView, thread_ts: str | None = None) -> list[SlackMessage]:
    """The core's view of an answer (bot.chat.render.answer_view) as Slack messages; a private answer's note and
    "Share in channel" button (answering in the thread `thread_ts`) close the last one."""
    messages = answer_messages(view.text, view.sources, view.feedback, view.note, view.sources_title)
    if view.private_note is None or view.feedback is None:
        return messages
    private_note = to_mrkdwn(view.private_note)
    tail = [{"type": "context", "elements": [{"type": "mrkdwn", "text": private_note}]},
            share_block(view.feedback, thread_ts, view.share or SHARE_LABEL)]
    if len(messages[-1].blocks) + len(tail) > BLOCKS_PER_MESSAGE:
        messages.append(SlackMessage(private_note, []))
    messages[-1].blocks.extend(tail)
    return messages


def _ts_value(ts: str) -> tuple[int, int]:
    """A Slack ts ("1700000000.000100") as a comparable pair (a float would lose the microseconds)."""
    seconds, _, micro = ts.partition(".")
    try:
        return int(seconds), int(micro or 0)
    except ValueError:
        return (0, 0)


def _ts_float(ts: str) -> float:
    seconds, micro = _ts_value(ts)
    return seconds + micro / 1_000_000


def _slack_error(exc: SlackClientError) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("error")) if response is not None and response.get("error") else type(exc).__name__


def share_block(answer_id: int, thread_ts: str | None, label: str) -> dict[str, Any]:
    """The "Share in channel" button under a private answer (Block Kit: an `actions` block holding a `button`
    element: https://api.slack.com/reference/block-kit/block-elements#button)."""
    return {"type": "actions", "block_id": "ragbot_share", "elements": [{
        "type": "button", "action_id": SHARE_ACTION_ID, "text": {"type": "plain_text", "text": label},
        "value": json.dumps({"a": answer_id, "t": thread_ts}),
    }]}


class SlackEphemeralReply(PrivateReply):
    """A private answer in a channel (bot.chat.flow.PrivateReply): chat.postEphemeral to the asker alone, in the
    thread."""

    def __init__(self, adapter: SlackAdapter, where: Where) -> None:
        self.adapter = adapter
        self.where = where

    async def post_privately(self, view: AnswerView) -> None:
        for message in view_messages(view, self.where.thread_ts):
            await self.adapter.client.chat_postEphemeral(
                channel=self.where.channel, user=self.where.user, thread_ts=self.where.thread_ts, text=message.text,
                blocks=message.blocks or None,
            )


class SlackReply:
    """The chat flow's `Reply` for Slack: an assistant-thread status while searching, then the answer streamed into
    the thread (Claude, SLACK_STREAM_ANSWERS) or a placeholder that the answer replaces; an apology replaces
    whichever of them was posted."""

    def __init__(self, adapter: SlackAdapter, where: Where, placeholder_ts: str | None = None) -> None:
        self.adapter = adapter
        self.where = where
        self.placeholder_ts = placeholder_ts  # set: a placeholder posted before a crash, to answer in
        self.stream: _AnswerStream | None = None

    @property
    def placeholder(self) -> str | None:
        """The placeholder's ts, stored with the claim (`bot.chat.lease`). A streamed answer has none: a crash
        mid-stream leaves the partial message, and the takeover posts the answer anew."""
        return self.placeholder_ts or (self.stream.placeholder_ts if self.stream is not None else None)

    async def begin(self) -> None:
        if self.where.assistant:
            await self.adapter._set_status(self.where, STATUS_SEARCHING)

    async def open(self) -> OnText | None:
        if self.placeholder_ts:  # resumed: the placeholder is already there
            return None
        thread_ts = self.where.thread_ts
        if self.adapter.settings.slack_stream_answers and thread_ts is not None and self.adapter.kb.answer_mode == "llm":
            self.stream = _AnswerStream(self.adapter, self.where, thread_ts)
            return self.stream.on_text
        self.placeholder_ts = await self.adapter._post(self.where, SlackMessage(PLACEHOLDER))
        return None

    async def end(self) -> None:
        if self.stream is not None and self.stream.refused and self.placeholder_ts is None:
            self.placeholder_ts = self.stream.placeholder_ts
        if self.where.assistant:
            await self.adapter._set_status(self.where, "")

    async def deliver(self, answer: Answer, answer_id: int) -> None:
        view = answer_view(answer, answer_id)
        if self.stream is not None and self.stream.started:
            await self.stream.finish(answer, view)
        else:
            await self.adapter._deliver(self.where, view_messages(view), self.placeholder_ts)

    async def fail(self, text: str) -> None:
        stream, client, where = self.stream, self.adapter.client, self.where
        try:
            if stream is not None and stream.started:
                await stream.abort(text)
            elif placeholder := self.placeholder:
                await client.chat_update(channel=where.channel, ts=placeholder, text=text, blocks=[])
            else:
                await self.adapter._post(where, SlackMessage(text))
        except SlackClientError:
            logger.exception("Slack: could not even post the apology")


class _AnswerStream:
    """Claude's text streamed into the thread with chat.startStream/appendStream/stopStream. If Slack refuses to
    stream (older workspace, unsupported channel), it falls back to a placeholder that is updated at the end."""

    def __init__(self, adapter: SlackAdapter, where: Where, thread_ts: str) -> None:
        self.adapter = adapter
        self.where = where
        self.thread_ts = thread_ts  # where.thread_ts: a stream goes into a thread
        self.streamer: Any = None
        self.started = False
        self.refused = False
        self.placeholder_ts: str | None = None
        self._pending = ""
        self.received = ""  # every delta, as Claude wrote it

    async def on_text(self, delta: str) -> None:
        self.received += delta
        if self.refused:
            return
        self._pending += delta
        # Hold back the last partial word: a mention split across deltas is neutralised only once it is whole.
        cut = max(self._pending.rfind(" "), self._pending.rfind("\n"))
        if cut < 0:
            return
        ready, self._pending = self._pending[: cut + 1], self._pending[cut + 1 :]
        await self._append(ready)

    async def _append(self, text: str) -> None:
        client = self.adapter.client
        try:
            if self.streamer is None:
                self.streamer = await client.chat_stream(
                    channel=self.where.channel, thread_ts=self.thread_ts, buffer_size=80,
                    recipient_team_id=self.where.team, recipient_user_id=self.where.user,
                )
            await self.streamer.append(markdown_text=stream_safe(text))
            if self.streamer.ts:
                self.started = True
        except SlackApiError as exc:
            if self.started:
                raise
            logger.info("Slack refused to stream (%s); answering with a placeholder instead",
                        exc.response.get("error") if exc.response else exc)
            self.refused = True
            self.placeholder_ts = await self.adapter._post(self.where, SlackMessage(PLACEHOLDER))

    async def finish(self, answer: Answer, view: AnswerView) -> None:
        tail = stream_tail_blocks(view.sources, view.feedback, view.note, view.sources_title)
        remaining = stream_safe(self._pending) if self._pending else None
        self._pending = ""
        response = await self.streamer.stop(markdown_text=remaining, blocks=tail or None)
        ts = self.streamer.ts or response.get("ts")
        if ts and (answer.abstained or answer.note or answer.text.strip() != self.received.strip()):
            # What was streamed is not the answer (the stream broke off and excerpts replaced it, or the model
            # declined): the message becomes the final answer.
            await self.adapter._deliver(self.where, view_messages(view), ts)

    async def abort(self, text: str) -> None:
        try:
            await self.streamer.stop()
        except SlackClientError:
            pass
        if self.streamer.ts:
            await self.adapter.client.chat_update(channel=self.where.channel, ts=self.streamer.ts, text=text,
                                                  blocks=[])
