"""Microsoft Teams platform primitives on the Microsoft 365 Agents SDK, which `bot.teams.adapter` calls.

What the adapter needs (docs/teams.md, "The platform interface"): receive events, post / update / stream a
message, list a conversation's members, resolve a user's email and tell guests apart. Everything goes through the
SDK (`microsoft-agents-hosting-aiohttp`, core 1.9, and `microsoft-agents-authentication-msal`):

- **Receiving.** `POST /api/messages` validates the Bot Connector's JWT with the SDK's `JwtTokenValidator`: RS256
  signature from the Bot Framework signing keys, audience = TEAMS_APP_ID, expiry with 5 minutes of skew, and the
  issuer allow-list (`validate_issuer=True`: the SDK leaves it off by default). The SDK only logs a token whose
  `serviceurl` claim differs from the activity's serviceUrl; here that is a 401 too, as the Bot Connector
  authentication page requires. The activity then runs through the SDK's `CloudAdapter`; a message is handed to
  `on_message` in the background (the HTTP answer is a 202 at once: the Connector gives a bot 15 seconds), a
  feedback click to `on_feedback` before its invoke response.
- **Sending.** The bot's token comes from MSAL (client credentials for the app id/secret/tenant, cached by MSAL);
  posts and updates use the SDK's `TeamsConnectorClient` on the activity's serviceUrl. A channel answer goes into
  the thread: the conversation id with `;messageid=<root>`, replying to the root.
- **Streaming** (personal chats only: Teams answers 405 elsewhere) runs the SDK's `StreamingResponse` in a
  proactive turn (`continue_conversation`): informative update, streaming updates paced at 1 s by the SDK, final
  message. A 403 (the user pressed Stop) ends it: nothing more is sent.
- **Members.** `members()` pages `GET …/pagedmembers` of the conversation itself (a private channel's own members;
  the SDK's team-roster look-ups would return the whole team), `member()` reads one member by Entra object id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientResponseError, web
from jwt import PyJWTError
from microsoft_agents.activity import (
    Activity,
    ActivityTypes,
    ChannelAccount,
    ChannelId,
    ClientCitation,
    ClientCitationAppearance,
    ConversationAccount,
    InvokeResponse,
)
from microsoft_agents.authentication.msal import MsalConnectionManager
from microsoft_agents.hosting.aiohttp import CloudAdapter
from microsoft_agents.hosting.core import (
    AgentAuthConfiguration,
    ClaimsIdentity,
    RestChannelServiceClientFactory,
    TurnContext,
)
from microsoft_agents.hosting.core.app.streaming import Citation, StreamingResponse
from microsoft_agents.hosting.core.authorization import AuthTypes
from microsoft_agents.hosting.core.authorization.jwt import JwtTokenValidator
from microsoft_agents.hosting.core.connector.teams import TeamsConnectorClient
from yarl import URL

from bot.teams.activities import (
    ConversationType,
    TeamsConversation,
    TeamsFeedback,
    TeamsMembershipChange,
    TeamsMessage,
    base_conversation_id,
    parse_activity,
)
from bot.teams.settings import TeamsSettings

logger = logging.getLogger(__name__)

MESSAGES_PATH = "/api/messages"
CHANNEL_ID = ChannelId("msteams")
# A multi-tenant bot signs in at the botframework.com tenant ("Authentication with the Bot Connector API").
MULTI_TENANT_AUTHORITY_TENANT = "botframework.com"

OnMessage = Callable[[TeamsMessage], Awaitable[None]]
OnFeedback = Callable[[TeamsFeedback], Awaitable[None]]
OnMembership = Callable[[TeamsMembershipChange], Awaitable[None]]


class Unauthorized(Exception):
    """An incoming request whose token is missing or invalid (answered 401; the reason is logged, not sent)."""


@dataclass(frozen=True)
class TeamsMember:
    """One conversation member as the roster gives it ("Get Teams-specific context for your bot")."""

    id: str
    aad_object_id: str | None
    name: str
    email: str | None
    user_principal_name: str | None
    tenant_id: str | None
    user_role: str | None  # "user", "guest" or "anonymous"

    @property
    def identity(self) -> str:
        return f"teams:{self.aad_object_id or self.id}"

    def is_guest(self, home_tenant: str | None) -> bool:
        """A guest (Teams says so in userRole), an anonymous meeting participant, or an account from another
        tenant: none may use the company's documents beyond what everyone may see."""
        if (self.user_role or "").lower() in ("guest", "anonymous"):
            return True
        return bool(home_tenant and self.tenant_id and self.tenant_id.lower() != home_tenant.lower())

    @property
    def principal_email(self) -> str | None:
        """The email for `user:<email>`: Teams' `email`, else a UPN that is an address (never a guest's
        `…#EXT#@tenant` UPN, which names nobody's mailbox)."""
        if self.email:
            return self.email.strip() or None
        upn = (self.user_principal_name or "").strip()
        return upn if "@" in upn and "#EXT#" not in upn.upper() else None


@dataclass(frozen=True)
class ReplyTarget:
    """Where a message goes; plain data, so the chat core can store it with a claim and resume after a crash."""

    service_url: str
    conversation_id: str  # a channel's thread form ("19:…;messageid=<root>") or a chat's id
    conversation_type: ConversationType
    tenant_id: str | None
    reply_to_id: str | None  # the thread root in a channel, the user's message in a chat

    @classmethod
    def for_message(cls, message: TeamsMessage) -> ReplyTarget:
        return cls(message.conversation.service_url, message.reply_conversation_id, message.conversation.type,
                   message.conversation.tenant_id, message.thread_root or message.activity_id)


def _member(account: Any) -> TeamsMember:
    data = account.model_dump(by_alias=True, exclude_none=True) if hasattr(account, "model_dump") else dict(account)
    return TeamsMember(
        id=str(data.get("id") or ""), aad_object_id=data.get("aadObjectId"), name=str(data.get("name") or ""),
        email=data.get("email"), user_principal_name=data.get("userPrincipalName"),
        tenant_id=data.get("tenantId"), user_role=data.get("userRole"),
    )


def client_citations(citations: Sequence[Citation]) -> list[ClientCitation]:
    """Citations as Teams renders them on an AI message (numbered `[n]` markers in the text, each with a title,
    an abstract of at most 480 characters and a URL), the same conversion the SDK's StreamingResponse makes."""
    return [ClientCitation(position=n, appearance=ClientCitationAppearance(
        name=c.title or f"Document #{n}", abstract=(c.content or "")[:480], url=c.url))
        for n, c in enumerate(citations, start=1)]


def message_activity(text: str, *, citations: Sequence[Citation] = (), ai_generated: bool = False,
                     feedback: bool = False, attachments: Sequence[Any] = ()) -> Activity:
    """A message the bot posts: markdown text, optional Adaptive Card attachments, the "AI generated" label with
    its citations, and Teams' 👍/👎 feedback buttons (channelData.feedbackLoopEnabled)."""
    activity = Activity(type=ActivityTypes.message, text=text, text_format="markdown", channel_id=CHANNEL_ID)
    if attachments:
        activity.attachments = list(attachments)
    if ai_generated or citations:
        activity.add_ai_metadata(client_citations(citations) or None)
    if feedback:
        activity.channel_data = {"feedbackLoopEnabled": True}
    return activity


def _same_service_url(claimed: str | None, actual: str | None) -> bool:
    if not claimed or not actual:
        return False
    a, b = URL(claimed), URL(actual)
    return (a.scheme, (a.host or "").casefold(), a.port) == (b.scheme, (b.host or "").casefold(), b.port) and \
        a.path.rstrip("/") == b.path.rstrip("/")


class TeamsPlatform:
    """The Teams primitives: one instance per bot (one app id)."""

    def __init__(self, settings: TeamsSettings, *, on_message: OnMessage | None = None,
                 on_feedback: OnFeedback | None = None, on_membership: OnMembership | None = None) -> None:
        self.settings = settings
        self.app_id, secret = settings.require()
        self.home_tenant = settings.tenant_id if settings.tenant_id not in (None, "", "common") else None
        self.auth = AgentAuthConfiguration(
            auth_type=AuthTypes.client_secret, client_id=self.app_id, client_secret=secret,
            tenant_id=self.home_tenant or MULTI_TENANT_AUTHORITY_TENANT, validate_issuer=True,
        )
        self.connections = MsalConnectionManager(connections_configurations={"SERVICE_CONNECTION": self.auth})
        self.adapter = CloudAdapter(connection_manager=self.connections)
        # The SDK's default turn-error handler posts the exception's text into the chat: log it instead.
        self.adapter.on_turn_error = self._on_turn_error
        self.clients = RestChannelServiceClientFactory(self.connections)
        self.on_message = on_message
        self.on_feedback = on_feedback
        self.on_membership = on_membership
        self.tasks: set[asyncio.Task[Any]] = set()

    # ---- receiving ------------------------------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [web.post(MESSAGES_PATH, self.handle)]

    async def authenticate(self, authorization: str | None) -> ClaimsIdentity:
        """The Bot Connector's token, validated by the SDK; Unauthorized (with the reason, for the log) if not."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("no bearer token")
        try:
            return await JwtTokenValidator(self.auth).validate_token(token.strip())
        except (PyJWTError, ValueError) as exc:
            raise Unauthorized(type(exc).__name__) from None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """POST /api/messages."""
        try:
            identity = await self.authenticate(request.headers.get("Authorization"))
        except Unauthorized as exc:
            logger.warning("Teams: refused a request to %s (%s)", MESSAGES_PATH, exc)
            return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(body, dict) or not _same_service_url(identity.get_claim_value("serviceurl"),
                                                               body.get("serviceUrl")):
            logger.warning("Teams: refused an activity whose serviceUrl is not the token's")
            return web.json_response({"error": "Unauthorized"}, status=401)
        with warnings.catch_warnings():  # the SDK's adapter reads this plain-string key
            warnings.simplefilter("ignore", web.NotAppKeyWarning)
            request["claims_identity"] = identity
        response = await self.adapter.process(request, self)
        return response if response is not None else web.Response(status=202)

    async def on_turn(self, context: TurnContext) -> None:
        """The SDK's Agent protocol: one incoming activity."""
        data = context.activity.model_dump(mode="json", by_alias=True, exclude_none=True)
        bot_id = str((data.get("recipient") or {}).get("id") or "")
        event = parse_activity(data, bot_id)
        if isinstance(event, TeamsMessage):
            if self.on_message is not None:
                self._spawn(self._run(self.on_message(event), "message"))
        elif isinstance(event, TeamsFeedback):
            if self.on_feedback is not None:
                await self._run(self.on_feedback(event), "feedback")
            await context.send_activity(Activity(type=ActivityTypes.invoke_response,
                                                 value=InvokeResponse(status=200, body={})))
        elif isinstance(event, TeamsMembershipChange):
            if self.on_membership is not None:
                await self._run(self.on_membership(event), "membership change")

    async def _run(self, work: Awaitable[None], what: str) -> None:
        try:
            await work
        except Exception:
            logger.exception("Teams: handling a %s failed", what)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _on_turn_error(self, context: TurnContext, error: Exception) -> None:
        logger.error("Teams: a turn failed", exc_info=error)

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for the messages being handled (at shutdown, and in tests)."""
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=timeout)

    # ---- sending --------------------------------------------------------------------------------------------------

    @asynccontextmanager
    async def connector(self, service_url: str) -> AsyncIterator[TeamsConnectorClient]:
        """The SDK's connector client for a service URL, with the bot's token (MSAL caches it between calls)."""
        identity = self._bot_identity()
        client = await self.clients.create_connector_client(None, identity, service_url,
                                                            identity.get_token_audience())
        assert isinstance(client, TeamsConnectorClient)
        try:
            yield client
        finally:
            await client.close()

    def _bot_identity(self) -> ClaimsIdentity:
        return self.adapter.create_claims_identity(self.app_id)

    async def post(self, target: ReplyTarget, activity: Activity) -> str:
        """Post a message where `target` says (into the thread in a channel); the new message's id."""
        activity.conversation = ConversationAccount(id=target.conversation_id,
                                                    conversation_type=target.conversation_type,
                                                    tenant_id=target.tenant_id)
        activity.channel_id = activity.channel_id or CHANNEL_ID
        async with self.connector(target.service_url) as client:
            if target.reply_to_id:
                response = await client.conversations.reply_to_activity(target.conversation_id, target.reply_to_id,
                                                                        activity)
            else:
                response = await client.conversations.send_to_conversation(target.conversation_id, activity)
        return str(response.id or "")

    async def post_private(self, target: ReplyTarget, user_id: str, activity: Activity) -> str:
        """Post a message only `user_id` (a 29: id) sees, in the thread of a channel or in a group chat: a Teams
        "targeted message" (developer preview; the SDK adds `isTargetedActivity=true`). The private answer in a
        channel, like Slack's ephemeral message; Teams has no such thing in a 1:1 chat, which is private anyway."""
        if target.conversation_type == "personal":
            raise ValueError("a personal chat is already private: post the message")
        return await self.post(target, activity.with_targeted_recipient(user_id))

    async def update(self, target: ReplyTarget, activity_id: str, activity: Activity) -> None:
        """Replace one of the bot's messages (a placeholder by the answer, an answer by an apology)."""
        activity.id = activity_id
        activity.channel_id = activity.channel_id or CHANNEL_ID
        activity.conversation = ConversationAccount(id=target.conversation_id)
        async with self.connector(target.service_url) as client:
            await client.conversations.update_activity(target.conversation_id, activity_id, activity)

    async def stream(self, target: ReplyTarget) -> TeamsStream:
        """A started stream into a personal chat (Teams streams nowhere else: use post + update there)."""
        if target.conversation_type != "personal":
            raise ValueError("Teams streams only in personal chats; post a message and update it instead")
        stream = TeamsStream(self, target)
        await stream.start()
        return stream

    # ---- members --------------------------------------------------------------------------------------------------

    async def member(self, conversation: TeamsConversation | ReplyTarget, user_id: str) -> TeamsMember | None:
        """One member of the conversation by Entra object id (or 29: id); None when Teams does not know them
        there (they left, or the id is wrong)."""
        service_url, conversation_id = _where(conversation)
        async with self.connector(service_url) as client:
            try:
                account = await client.get_conversation_member(conversation_id, user_id)
            except ClientResponseError as exc:
                if exc.status == 404:
                    return None
                raise
        return _member(account)

    async def members(self, conversation: TeamsConversation | ReplyTarget, limit: int) -> list[TeamsMember]:
        """Every member of the conversation itself (a group chat's, a private channel's own, a standard channel's
        team), paged by continuation token; ValueError past `limit` members (the audience then falls back)."""
        service_url, conversation_id = _where(conversation)
        found: list[TeamsMember] = []
        token: str | None = None
        async with self.connector(service_url) as client:
            while True:
                page = await client.get_conversation_paged_member(conversation_id, self.settings.members_page_size,
                                                                  token or "")
                found += [_member(m) for m in page.members or []]
                if len(found) > limit:
                    raise ValueError(f"more than {limit} members")
                token = page.continuation_token or None
                if not token:
                    return found


def _where(conversation: TeamsConversation | ReplyTarget) -> tuple[str, str]:
    if isinstance(conversation, ReplyTarget):
        return conversation.service_url, base_conversation_id(conversation.conversation_id)
    return conversation.service_url, conversation.base_id


_END = object()


class TeamsStream:
    """The SDK's StreamingResponse, held open in a proactive turn while the answer is written.

    `informative(text)` (a status line such as "Searching the documents…"), `append(delta)` (queued; the SDK sends
    the text so far about once a second), then `finish(...)`, which sends the final message with its citations,
    AI label and feedback buttons and returns its id. `stopped` turns true when Teams answered 403 (the user pressed
    Stop, or the stream ran too long): from then on nothing is sent, and `finish` returns None."""

    def __init__(self, platform: TeamsPlatform, target: ReplyTarget) -> None:
        self.platform = platform
        self.target = target
        self.stopped = False
        self.stream_id: str | None = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        continuation = Activity(
            type=ActivityTypes.event, name="ContinueConversation", id=self.target.reply_to_id,
            channel_id=CHANNEL_ID, service_url=self.target.service_url,
            conversation=ConversationAccount(id=self.target.conversation_id, conversation_type="personal",
                                             tenant_id=self.target.tenant_id),
            recipient=ChannelAccount(id=f"28:{self.platform.app_id}"),
        )
        self._task = asyncio.ensure_future(
            self.platform.adapter.continue_conversation(self.platform.app_id, continuation, self._turn))
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait({self._task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if not self._ready.is_set():
            ready.cancel()
            await self._task  # it failed before the stream opened: raise its error

    async def _turn(self, context: TurnContext) -> None:
        context.on_send_activities(self._watch)
        response = StreamingResponse(context)
        self._ready.set()
        try:
            while True:
                op, value = await self._queue.get()
                if op is _END:
                    text, citations, feedback, ai_generated = value
                    streamed, replacement = response.get_message(), None
                    if text is not None and text != streamed:
                        if text.startswith(streamed):
                            response.queue_text_chunk(text[len(streamed):])
                        else:
                            # What streamed is not the answer (it broke off and excerpts replaced it): the final
                            # message is then replaced, so the user keeps the answer, not the partial text.
                            replacement = text
                    if citations:
                        response.set_citations(list(citations))
                    response.set_generated_by_ai_label(ai_generated)
                    response.set_feedback_loop(feedback)
                    await response.end_stream()
                    if replacement is not None and not self.stopped and self.stream_id:
                        final = message_activity(replacement, citations=citations, ai_generated=ai_generated,
                                                 feedback=feedback)
                        final.id = self.stream_id
                        await context.update_activity(final)
                    return
                if op == "informative":
                    response.queue_informative_update(value)
                elif op == "text":
                    response.queue_text_chunk(value)
        finally:
            await response.wait_for_queue()

    async def _watch(self, context: TurnContext, activities: list[Activity],
                     send: Callable[[], Awaitable[Any]]) -> Any:
        try:
            responses = await send()
        except ClientResponseError as exc:
            if exc.status == 403:
                self.stopped = True
            raise
        if self.stream_id is None and responses:
            self.stream_id = getattr(responses[0], "id", None) or None
        return responses

    def informative(self, text: str) -> None:
        if not self.stopped:
            self._queue.put_nowait(("informative", text[:1000]))

    def append(self, delta: str) -> None:
        if delta and not self.stopped:
            self._queue.put_nowait(("text", delta))

    async def finish(self, text: str | None = None, *, citations: Sequence[Citation] = (),
                     feedback: bool = True, ai_generated: bool = True) -> str | None:
        """End the stream with the final message; its id, or None when the user stopped it. An apology ends it
        too, without the AI label or the feedback buttons (`ai_generated=False, feedback=False`)."""
        assert self._task is not None, "start() first"
        self._queue.put_nowait((_END, (text, citations, feedback, ai_generated)))
        await self._task
        return None if self.stopped else self.stream_id

    async def close(self) -> None:
        """Abandon the stream without a final message (the caller could not finish it); its turn ends."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
