"""A fake Microsoft Teams Bot Connector, its sign-in services, and the HTTPS proxy that reaches them.

What the Microsoft 365 Agents SDK talks to, served on 127.0.0.1 from a thread with its own event loop (it answers
while a test's loop awaits), built from Microsoft's documented shapes only:

- **the Bot Connector REST API** (plain HTTP on `service_url`, the activity's `serviceUrl`): send to a
  conversation, reply to an activity, update an activity, a conversation's paged members, one member. Every call
  needs a bot token this fake issued (`Authorization: Bearer`), as the Connector requires.
- **the Bot Framework OpenID metadata and signing keys** (`https://login.botframework.com/v1/.well-known/...`):
  the fake signs each activity it delivers with its own RSA key, served there as a JWKS.
- **the Microsoft identity platform** (`https://login.microsoftonline.com/<tenant>/...`): the tenant's OpenID
  configuration MSAL reads, and the OAuth 2.0 client-credentials token endpoint that issues the bot's tokens (for
  the Bot Connector, and for Microsoft Graph: `graph_tokens`, which the fake Graph of tests/fakes/graph_api.py
  accepts).

The SDK fetches signing keys from a hard-coded `https://login.botframework.com` URL (pyjwt's PyJWKClient, urllib)
and MSAL accepts only https authorities (requests), so those two hosts cannot be given as base URLs: the fake
serves them over TLS with a certificate from its own test CA, behind a CONNECT proxy. A test points the process at
them with the standard variables (`environ()`): HTTPS_PROXY, and SSL_CERT_FILE / REQUESTS_CA_BUNDLE naming the CA.
The proxy tunnels only those two hosts; any other CONNECT is refused and recorded (`refused_hosts`).

    with FakeTeamsConnector() as fake:
        fake.add_conversation(CHANNEL, "channel", members=[...], tenant_id=fake.tenant_id, channel_type="private")
        activity = fake.channel_message("<at>ragbot</at> How many vacation days?", CHANNEL, user)
        status, _ = await fake.deliver(bot_url, activity)                 # signed; token=... or sign=False
        fake.thread(CHANNEL, root_id)                                      # the bot's replies in that thread
        fake.stop_streams(conversation_id)                                 # the user pressed "Stop": 403 from now on

Anything the references do not document is refused: an unknown route is 404, a call without a token this fake
issued is 401, a streaming update outside a personal chat is 405 (Teams streams only in 1:1 chats), an update of an
activity the bot never sent is 404.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import functools
import itertools
import json
import secrets
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import aiohttp
import jwt
from aiohttp import web
from aiohttp.typedefs import Handler
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from fakes.server import AiohttpServer

BOTFRAMEWORK_HOST = "login.botframework.com"
IDENTITY_HOST = "login.microsoftonline.com"
TUNNELLED_HOSTS = (BOTFRAMEWORK_HOST, IDENTITY_HOST)
BOTFRAMEWORK_ISSUER = "https://api.botframework.com"
BOT_SCOPE = "https://api.botframework.com/.default"
GRAPH_SCOPE = "https://graph.microsoft.com/.default"  # the app's Microsoft Graph token (tests/fakes/graph_api.py)
# "Get Teams-specific context for your bot" (Fetch the roster): pages hold 50 to 500 members.
MIN_PAGE, MAX_PAGE = 50, 500
INFORMATIVE_LIMIT = 1000  # "Stream bot messages": an informative update holds at most 1,000 characters


def _b64url_uint(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate(subject: str, key: rsa.RSAPrivateKey, issuer_key: rsa.RSAPrivateKey, issuer: x509.Name | None,
                 *, ca: bool, hosts: tuple[str, ...] = ()) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
        ), critical=True)
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                                        critical=False)
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@dataclass
class Member:
    """A TeamsChannelAccount ("Get Teams-specific context for your bot": id, name, aadObjectId, email,
    userPrincipalName, tenantId, userRole, givenName, surname)."""

    aad_object_id: str
    name: str
    email: str | None = None
    user_principal_name: str | None = None
    tenant_id: str | None = None
    user_role: str = "user"  # "user" | "guest" | "anonymous"
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"29:{self.aad_object_id}"

    def to_api(self) -> dict[str, Any]:
        data = {"id": self.id, "name": self.name, "aadObjectId": self.aad_object_id,
                "givenName": self.name.split(" ")[0], "surname": self.name.split(" ")[-1],
                "email": self.email, "userPrincipalName": self.user_principal_name or self.email,
                "tenantId": self.tenant_id, "userRole": self.user_role}
        return {k: v for k, v in data.items() if v is not None}

    def account(self) -> dict[str, Any]:
        """The `from` of an activity the user sends."""
        return {"id": self.id, "name": self.name, "aadObjectId": self.aad_object_id}


@dataclass
class Conversation:
    id: str
    type: str  # "personal" | "channel" | "groupChat"
    tenant_id: str
    members: list[Member] = field(default_factory=list)
    team_id: str | None = None
    channel_type: str | None = None  # a channel's membership: "standard" | "private" | "shared"
    streams_stopped: bool = False
    aad_group_id: str | None = None  # the team's Microsoft 365 group id (channelData.team.aadGroupId)


@dataclass
class Sent:
    """One call the bot made to the Connector, as received."""

    method: str  # "send" (POST .../activities), "reply" (POST .../activities/{id}), "update" (PUT)
    conversation_id: str  # as the bot named it (with ";messageid=" for a threaded reply)
    reply_to: str | None  # the {activityId} of a reply or an update
    activity: dict[str, Any]
    id: str  # the id of the activity this call created (or updated)

    @property
    def type(self) -> str:
        return str(self.activity.get("type"))

    @property
    def stream_info(self) -> dict[str, Any] | None:
        """The activity's `streaminfo` entity ("Stream bot messages"), if it has one."""
        for entity in self.activity.get("entities") or []:
            if entity.get("type") == "streaminfo":
                return entity
        return None


@dataclass
class Message:
    """A message as a Teams user sees it: where it is (the channel and the thread root, None at the top level or
    in a chat), its text, and how often it was edited."""

    id: str
    conversation_id: str  # the base conversation (channel / chat) id, without ";messageid="
    thread_root: str | None
    text: str
    from_bot: bool
    activity: dict[str, Any]
    updates: int = 0
    visible_to: str | None = None  # a targeted message: the only member (29: id) who sees it

    def seen_by(self, member_id: str) -> bool:
        return self.visible_to in (None, member_id)


@dataclass(frozen=True)
class _Keys:
    kid: str
    signing_key: rsa.RSAPrivateKey
    signing_cert: x509.Certificate
    entra_kid: str
    entra_key: rsa.RSAPrivateKey
    ca_key: rsa.RSAPrivateKey
    ca_cert: x509.Certificate
    tls_key: rsa.RSAPrivateKey
    tls_cert: x509.Certificate


@functools.cache
def _key_material() -> _Keys:
    """The fake Microsoft's CA, TLS and signing keys, made once per test process. Per fake they would break the
    SDK's key look-up: it keeps one PyJWKClient per JWKS address for the whole process, and pyjwt refetches for an
    unknown kid at most once per 30 s (its refresh cooldown), so a second fake's new kid inside that window fails."""
    signing_key, ca_key, tls_key = _new_key(), _new_key(), _new_key()
    ca_cert = _certificate("ragbot fake Microsoft CA", ca_key, ca_key, None, ca=True)
    return _Keys(
        kid=secrets.token_hex(8), signing_key=signing_key,
        signing_cert=_certificate("botframework signing", signing_key, ca_key, ca_cert.subject, ca=False,
                                  hosts=(BOTFRAMEWORK_HOST,)),
        entra_kid=secrets.token_hex(8), entra_key=_new_key(), ca_key=ca_key, ca_cert=ca_cert, tls_key=tls_key,
        tls_cert=_certificate(BOTFRAMEWORK_HOST, tls_key, ca_key, ca_cert.subject, ca=False, hosts=TUNNELLED_HOSTS))


class FakeTeamsConnector(AiohttpServer):
    def __init__(self, *, app_id: str | None = None, app_password: str | None = None,
                 tenant_id: str | None = None) -> None:
        super().__init__()
        self.app_id = app_id or str(uuid.uuid4())
        self.app_password = app_password or secrets.token_urlsafe(24)
        self.tenant_id = tenant_id or str(uuid.uuid4())
        self.bot_id = f"28:{self.app_id}"
        keys = _key_material()  # one set per process, as Microsoft's keys are stable (see _key_material)
        self.kid, self._signing_key = keys.kid, keys.signing_key
        self.entra_kid, self._entra_key = keys.entra_kid, keys.entra_key  # Entra ID's own (discovery/v2.0/keys)
        self._ca_key, self._ca_cert = keys.ca_key, keys.ca_cert
        self._tls_key, self._tls_cert = keys.tls_key, keys.tls_cert
        self._signing_cert = keys.signing_cert
        self._dir = Path(tempfile.mkdtemp(prefix="fake-teams-"))
        self.ca_file = self._dir / "ca.pem"
        self.ca_file.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        self.conversations: dict[str, Conversation] = {}
        self.messages: list[Message] = []
        self.sent: list[Sent] = []
        self.identity_requests: list[tuple[str, str, str]] = []  # (method, host, path) over the tunnel
        self.connector_requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, query)
        self.refused_hosts: list[str] = []
        self.issued_tokens: set[str] = set()  # Bot Connector tokens (scope BOT_SCOPE)
        self.graph_tokens: dict[str, str] = {}  # Microsoft Graph tokens (scope GRAPH_SCOPE) -> tenant issued for
        self.token_requests: list[dict[str, str]] = []
        self._streams: dict[str, dict[str, Any]] = {}  # stream id -> {"conversation", "sequence", "ended"}
        self._ids = itertools.count(1)
        self._proxy: asyncio.AbstractServer | None = None
        self._tunnels: set[asyncio.StreamWriter] = set()
        self.tls_port = self.proxy_port = 0

    # ---- test-facing helpers ---------------------------------------------------------------------------------------

    @property
    def service_url(self) -> str:
        return f"{self.url}/"

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def environ(self) -> dict[str, str]:
        """The environment that sends the SDK's and MSAL's https calls to this fake (and trusts its CA)."""
        return {"HTTPS_PROXY": self.proxy_url, "https_proxy": self.proxy_url,
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                "SSL_CERT_FILE": str(self.ca_file), "REQUESTS_CA_BUNDLE": str(self.ca_file)}

    def add_conversation(self, conversation_id: str, type_: str, *, members: list[Member] | None = None,
                         team_id: str | None = None, channel_type: str | None = None,
                         aad_group_id: str | None = None) -> Conversation:
        conversation = Conversation(conversation_id, type_, self.tenant_id, list(members or []), team_id,
                                    channel_type, aad_group_id=aad_group_id)
        self.conversations[conversation_id] = conversation
        return conversation

    def stop_streams(self, conversation_id: str) -> None:
        """The user pressed Stop in this chat: every further streaming update is refused with 403."""
        self.conversations[conversation_id].streams_stopped = True

    def thread(self, conversation_id: str, root_id: str) -> list[Message]:
        """The replies under a channel message, in order."""
        return [m for m in self.messages if m.conversation_id == conversation_id and m.thread_root == root_id]

    def top_level(self, conversation_id: str) -> list[Message]:
        return [m for m in self.messages if m.conversation_id == conversation_id and m.thread_root is None]

    def bot_messages(self, conversation_id: str | None = None) -> list[Message]:
        return [m for m in self.messages if m.from_bot and conversation_id in (None, m.conversation_id)]

    def sent_to(self, conversation_id: str) -> list[Sent]:
        """Every call the bot made for this conversation (its threads included), in order."""
        return [s for s in self.sent if _base(s.conversation_id) == conversation_id]

    def token(self, *, audience: str | None = None, issuer: str = BOTFRAMEWORK_ISSUER,
              expires_in: float = 3600.0, service_url: str | None = None, key: rsa.RSAPrivateKey | None = None,
              kid: str | None = None) -> str:
        """A token as the Bot Connector signs it for the bot ("Authentication with the Bot Connector API": issuer
        https://api.botframework.com, audience = the bot's app id, serviceurl = the activity's serviceUrl, RS256
        with a key from the OpenID metadata's jwks_uri). Every part can be made wrong for a test."""
        now = int(time.time())
        claims = {"iss": issuer, "aud": audience or self.app_id, "nbf": now - 60, "iat": now - 60,
                  "exp": int(now + expires_in), "serviceurl": service_url or self.service_url}
        return jwt.encode(claims, _pem(key or self._signing_key), algorithm="RS256",
                          headers={"kid": kid or self.kid, "x5t": kid or self.kid, "typ": "JWT"})

    def entra_token(self, issuer: str, **kwargs: Any) -> str:
        """A token signed by a genuine Entra ID key (served at the tenant's jwks_uri) but with another issuer:
        only the bot's issuer allow-list can refuse it."""
        return self.token(issuer=issuer, key=self._entra_key, kid=self.entra_kid, **kwargs)

    def forged_token(self, **kwargs: Any) -> str:
        """A token with the right claims and key id, signed by a key that is not in the metadata."""
        return self.token(key=_new_key(), **kwargs)

    def _activity(self, text: str, conversation: Conversation, user: Member, *,
                  conversation_id: str | None = None, mention: bool = False) -> dict[str, Any]:
        """A message activity as Teams delivers it ("Channel and group chat conversations with a bot": a channel
        message's conversation id carries ";messageid=<thread root>", channelData names the team, channel and
        tenant; an @mention is `<at>name</at>` in the text plus a `mention` entity)."""
        activity_id = str(int(time.time() * 1000) * 1000 + next(self._ids))
        account: dict[str, Any] = {"id": conversation_id or conversation.id, "conversationType": conversation.type,
                                   "tenantId": conversation.tenant_id}
        if conversation.type != "personal":
            account["isGroup"] = True
        channel_data: dict[str, Any] = {"tenant": {"id": conversation.tenant_id}}
        if conversation.type == "channel":
            # TeamInfo (Bot Framework schema; "Conversation events in your Teams bot" shows it): id, name and
            # aadGroupId, the team's Microsoft 365 group id (Microsoft Graph's team id).
            channel_data["team"] = {"id": conversation.team_id or conversation.id, "name": "Team",
                                    **({"aadGroupId": conversation.aad_group_id} if conversation.aad_group_id else {})}
            channel_data["channel"] = {"id": conversation.id, "name": "General",
                                       **({"type": conversation.channel_type} if conversation.channel_type else {})}
            channel_data["teamsTeamId"] = conversation.team_id or conversation.id
            channel_data["teamsChannelId"] = conversation.id
        activity: dict[str, Any] = {
            "type": "message", "id": activity_id, "timestamp": dt.datetime.now(dt.UTC).isoformat(),
            "serviceUrl": self.service_url, "channelId": "msteams", "from": user.account(),
            "conversation": account, "recipient": {"id": self.bot_id, "name": "ragbot"},
            "text": text, "textFormat": "plain", "locale": "en-US", "channelData": channel_data, "entities": [],
        }
        if mention:
            activity["entities"].append({"type": "mention", "text": "<at>ragbot</at>",
                                         "mentioned": {"id": self.bot_id, "name": "ragbot"}})
        root = _thread_root(account["id"])
        self.messages.append(Message(activity_id, conversation.id, root, text, False, activity))
        return activity

    def personal_message(self, text: str, user: Member) -> dict[str, Any]:
        conversation_id = f"a:personal-{user.aad_object_id}"
        conversation = self.conversations.get(conversation_id) or self.add_conversation(
            conversation_id, "personal", members=[user])
        return self._activity(text, conversation, user)

    def channel_message(self, text: str, channel_id: str, user: Member, *, thread_root: str | None = None,
                        mention: bool = True) -> dict[str, Any]:
        """A channel post (a new thread, whose conversation id names itself as the root) or a reply in a thread."""
        conversation = self.conversations[channel_id]
        if thread_root is None:
            activity = self._activity(text, conversation, user, mention=mention)
            activity["conversation"]["id"] = f"{channel_id};messageid={activity['id']}"
            self.messages[-1].thread_root = None  # a new post is a top-level message: the root of its own thread
            return activity
        return self._activity(text, conversation, user, conversation_id=f"{channel_id};messageid={thread_root}",
                              mention=mention)

    def group_message(self, text: str, chat_id: str, user: Member) -> dict[str, Any]:
        return self._activity(text, self.conversations[chat_id], user, mention=True)

    def feedback_invoke(self, reply_to_id: str, conversation_id: str, user: Member, reaction: str,
                        feedback: str = "") -> dict[str, Any]:
        """A 👍/👎 click on an AI message ("Feedback buttons": an invoke `message/submitAction` whose value has
        actionName "feedback" and actionValue {reaction: like|dislike, feedback: JSON text})."""
        conversation = self.conversations[_base(conversation_id)]
        return {
            "type": "invoke", "name": "message/submitAction", "id": f"f:{next(self._ids)}",
            "replyToId": reply_to_id, "serviceUrl": self.service_url, "channelId": "msteams",
            "from": user.account(), "recipient": {"id": self.bot_id, "name": "ragbot"},
            "conversation": {"id": conversation_id, "conversationType": conversation.type,
                             "tenantId": conversation.tenant_id},
            "channelData": {"tenant": {"id": conversation.tenant_id}},
            "value": {"actionName": "feedback",
                      "actionValue": {"reaction": reaction, "feedback": json.dumps({"feedbackText": feedback})}},
        }

    def card_submit(self, reply_to_id: str, conversation_id: str, user: Member, data: dict[str, Any]) -> dict[str, Any]:
        """A click on an Adaptive Card's Action.Submit button in one of the bot's messages ("Card actions",
        Adaptive Cards actions, learn.microsoft.com/microsoftteams/platform/task-modules-and-cards/cards/
        cards-actions: Teams sends a message activity whose `value` is the action's `data` object, with no text;
        replyToId is the card's message). `conversation_id` as the card's conversation names it (a channel thread:
        "<channel>;messageid=<root>")."""
        conversation = self.conversations[_base(conversation_id)]
        activity = self._activity("", conversation, user, conversation_id=conversation_id)
        self.messages.pop()  # a card click shows no message in the conversation
        activity["replyToId"] = reply_to_id
        activity["value"] = data
        del activity["text"]
        return activity

    def membership_update(self, conversation_id: str, *, added: Sequence[Member] = (),
                          removed: Sequence[Member] = ()) -> dict[str, Any]:
        """People joined or left ("Conversation events in your Teams bot": a conversationUpdate with
        membersAdded / membersRemoved; in a team, channelData.eventType teamMemberAdded / teamMemberRemoved). The
        fake's roster changes with it."""
        conversation = self.conversations[conversation_id]
        conversation.members = [m for m in conversation.members if m not in removed] + list(added)
        channel_data: dict[str, Any] = {"tenant": {"id": conversation.tenant_id}}
        if conversation.type == "channel":
            channel_data["team"] = {"id": conversation.team_id or conversation.id}
            channel_data["eventType"] = "teamMemberAdded" if added else "teamMemberRemoved"
        activity: dict[str, Any] = {
            "type": "conversationUpdate", "id": f"f:{next(self._ids)}", "serviceUrl": self.service_url,
            "channelId": "msteams", "from": {"id": "29:admin", "aadObjectId": "aad-admin"},
            "recipient": {"id": self.bot_id, "name": "ragbot"},
            "conversation": {"id": conversation.id, "conversationType": conversation.type,
                             "tenantId": conversation.tenant_id, "isGroup": True},
            "channelData": channel_data,
        }
        if added:
            activity["membersAdded"] = [{"id": m.id, "aadObjectId": m.aad_object_id} for m in added]
        if removed:
            activity["membersRemoved"] = [{"id": m.id, "aadObjectId": m.aad_object_id} for m in removed]
        return activity

    async def deliver(self, bot_url: str, activity: dict[str, Any], *, token: str | None = None,
                      sign: bool = True, authorization: str | None = None) -> tuple[int, Any]:
        """POST the activity to the bot as the Connector does, signed unless told otherwise."""
        headers = {"Content-Type": "application/json"}
        if authorization is not None:
            headers["Authorization"] = authorization
        elif sign:
            headers["Authorization"] = f"Bearer {token or self.token()}"
        async with aiohttp.ClientSession() as session, session.post(bot_url, json=activity,
                                                                    headers=headers) as response:
            body = await response.text()
            try:
                return response.status, json.loads(body) if body else None
            except ValueError:
                return response.status, body

    async def wait_for(self, condition: Callable[[], Any], timeout: float = 20.0) -> Any:
        """Poll until `condition()` is truthy (the bot answers in the background, after the 202)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            await asyncio.sleep(0.02)
        raise AssertionError("the condition was never met; the bot sent: "
                             + json.dumps([(s.method, s.conversation_id, s.activity.get("type"),
                                            s.activity.get("text")) for s in self.sent])[:2000])

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    async def _start_servers(self) -> None:
        import ssl

        connector = web.Application(middlewares=[self._bot_token_required])
        connector.add_routes([
            web.post("/v3/conversations/{conversation}/activities", self._send_to_conversation),
            web.post("/v3/conversations/{conversation}/activities/{activity}", self._reply_to_activity),
            web.put("/v3/conversations/{conversation}/activities/{activity}", self._update_activity),
            web.get("/v3/conversations/{conversation}/{paged:[pP]aged[mM]embers}", self._paged_members),
            web.get("/v3/conversations/{conversation}/members/{member}", self._member),
            web.get("/v3/conversations/{conversation}/members", self._members),
        ])
        self.port = await self.serve(connector)
        identity = web.Application()
        identity.add_routes([web.route("*", "/{path:.*}", self._identity)])
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert_file, key_file = self._dir / "tls.pem", self._dir / "tls.key"
        cert_file.write_bytes(self._tls_cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem(self._tls_key))
        context.load_cert_chain(cert_file, key_file)
        self.tls_port = await self.serve(identity, ssl_context=context)
        self._proxy = await asyncio.start_server(self._tunnel, "127.0.0.1", 0)
        self.proxy_port = self._proxy.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._proxy is not None:
            self._proxy.close()
        for writer in list(self._tunnels):  # open keep-alive tunnels end with the fake
            writer.close()
        await asyncio.sleep(0.05)

    # ---- the CONNECT proxy (RFC 9110 §9.3.6) --------------------------------------------------------------------

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        method, _, rest = head.decode("latin-1").partition(" ")
        target = rest.split(" ", 1)[0]
        host = target.rsplit(":", 1)[0].lower()
        if method != "CONNECT" or host not in TUNNELLED_HOSTS:
            self.refused_hosts.append(target if method == "CONNECT" else f"{method} {target}")
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.tls_port)
        self._tunnels.update((writer, upstream_writer))
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()
                self._tunnels.discard(sink)

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    # ---- identity: Bot Framework metadata and keys, Entra ID discovery and tokens --------------------------------

    def _entra_jwks(self) -> dict[str, Any]:
        numbers = self._entra_key.public_key().public_numbers()
        return {"keys": [{"kty": "RSA", "use": "sig", "kid": self.entra_kid, "x5t": self.entra_kid,
                          "n": _b64url_uint(numbers.n), "e": _b64url_uint(numbers.e)}]}

    def _jwks(self) -> dict[str, Any]:
        numbers = self._signing_key.public_key().public_numbers()
        x5c = base64.b64encode(self._signing_cert.public_bytes(serialization.Encoding.DER)).decode()
        return {"keys": [{"kty": "RSA", "use": "sig", "kid": self.kid, "x5t": self.kid, "n": _b64url_uint(numbers.n),
                          "e": _b64url_uint(numbers.e), "x5c": [x5c], "endorsements": ["msteams"]}]}

    async def _identity(self, request: web.Request) -> web.Response:
        host = (request.host or "").split(":")[0].lower()
        path = "/" + request.match_info["path"]
        self.identity_requests.append((request.method, host, path))
        if host == BOTFRAMEWORK_HOST and request.method == "GET":
            # "Authentication with the Bot Connector API", step 2: the OpenID metadata document ...
            if path == "/v1/.well-known/openidconfiguration":
                return web.json_response({
                    "issuer": BOTFRAMEWORK_ISSUER,
                    "authorization_endpoint": "https://invalid.botframework.com",
                    "jwks_uri": f"https://{BOTFRAMEWORK_HOST}/v1/.well-known/keys",
                    "id_token_signing_alg_values_supported": ["RS256"],
                    "token_endpoint_auth_methods_supported": ["private_key_jwt"],
                })
            # ... step 3: its signing keys (a JWKS; each key lists the channels that endorse it).
            if path == "/v1/.well-known/keys":
                return web.json_response(self._jwks())
        if host == IDENTITY_HOST:
            parts = path.strip("/").split("/")
            tenant = parts[0] if parts else ""
            # "OpenID Connect on the Microsoft identity platform": the tenant's discovery document (MSAL reads it
            # to find the token endpoint).
            if request.method == "GET" and parts[1:] == ["v2.0", ".well-known", "openid-configuration"]:
                base = f"https://{IDENTITY_HOST}/{tenant}"
                return web.json_response({
                    "issuer": f"{base}/v2.0", "token_endpoint": f"{base}/oauth2/v2.0/token",
                    "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                    "jwks_uri": f"{base}/discovery/v2.0/keys", "response_types_supported": ["code", "id_token"],
                    "subject_types_supported": ["pairwise"], "id_token_signing_alg_values_supported": ["RS256"],
                    "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt",
                                                              "client_secret_basic"],
                    "tenant_region_scope": "WW",
                })
            # ... and the signing keys its jwks_uri names.
            if request.method == "GET" and parts[1:] == ["discovery", "v2.0", "keys"]:
                return web.json_response(self._entra_jwks())
            # "Microsoft identity platform and the OAuth 2.0 client credentials flow": the bot's token (the Bot
            # Connector authentication page asks for scope https://api.botframework.com/.default), or the app's
            # Microsoft Graph token (scope https://graph.microsoft.com/.default: one resource's `.default` a request).
            if request.method == "POST" and parts[1:] == ["oauth2", "v2.0", "token"]:
                return self._token_endpoint(tenant, dict(parse_qsl((await request.read()).decode())))
        return web.json_response({"error": "not_found"}, status=404)

    def _token_endpoint(self, tenant: str, form: dict[str, str]) -> web.Response:
        self.token_requests.append({k: v for k, v in form.items() if k != "client_secret"})
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        if tenant not in (self.tenant_id, "botframework.com"):
            return web.json_response({"error": "invalid_request",
                                      "error_description": "AADSTS90002: Tenant not found."}, status=400)
        if form.get("client_id") != self.app_id or form.get("client_secret") != self.app_password:
            return web.json_response({"error": "invalid_client",
                                      "error_description": "AADSTS7000215: Invalid client secret provided."},
                                     status=401)
        scopes = form.get("scope", "").split()
        if (BOT_SCOPE in scopes) == (GRAPH_SCOPE in scopes):  # exactly one of the two resources
            return web.json_response({"error": "invalid_scope"}, status=400)
        token = secrets.token_urlsafe(32)
        if BOT_SCOPE in scopes:
            self.issued_tokens.add(token)
        else:
            self.graph_tokens[token] = tenant
        return web.json_response({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599,
                                  "access_token": token})

    # ---- the Bot Connector REST API ----------------------------------------------------------------------------

    @web.middleware
    async def _bot_token_required(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every Bot Connector call is recorded, and needs a bot token this fake issued (else 401); an unknown route
        is 404 whatever the token."""
        if request.match_info.http_exception is not None:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        self.connector_requests.append((request.method, request.path, dict(request.query)))
        if not (header.startswith("Bearer ") and header[7:] in self.issued_tokens):
            return self._error(401, "Unauthorized", "Authorization has been denied for this request.")
        return await handler(request)

    @staticmethod
    def _error(status: int, code: str, message: str) -> web.Response:
        # "Bot Connector API reference", ErrorResponse: {"error": {"code", "message"}}.
        return web.json_response({"error": {"code": code, "message": message}}, status=status)

    def _conversation(self, request: web.Request) -> tuple[Conversation | None, str, str | None]:
        named = request.match_info["conversation"]
        base = _base(named)
        return self.conversations.get(base), named, _thread_root(named)

    def _known_conversation(self, request: web.Request) -> tuple[Conversation, str, str | None]:
        """The conversation the path names, or (raised, so aiohttp answers it) 404 ConversationNotFound."""
        conversation, named, root = self._conversation(request)
        if conversation is None:
            raise web.HTTPNotFound(text=json.dumps({"error": {"code": "ConversationNotFound",
                                                              "message": "Conversation not found."}}),
                                   content_type="application/json")
        return conversation, named, root

    async def _send_to_conversation(self, request: web.Request) -> web.Response:
        # "Bot Connector API reference": Send to Conversation, POST /v3/conversations/{conversationId}/activities.
        return await self._post_activity(request, None)

    async def _reply_to_activity(self, request: web.Request) -> web.Response:
        # "Bot Connector API reference": Reply to Activity, POST /v3/conversations/{conversationId}/activities/
        # {activityId}. In a Teams channel the reply lands in the thread the conversation id names
        # (";messageid=<root>"); with a bare channel id it becomes a new top-level post, replyToId or not.
        return await self._post_activity(request, request.match_info["activity"])

    async def _post_activity(self, request: web.Request, reply_to: str | None) -> web.Response:
        conversation, named, root = self._known_conversation(request)
        activity = await request.json()
        kind = activity.get("type")
        if kind not in ("message", "typing"):
            return self._error(400, "BadArgument", f"Unsupported activity type {kind!r}.")
        if root is not None and not any(m.id == root and m.conversation_id == conversation.id
                                        for m in self.messages):
            return self._error(404, "NotFound", "The thread's root message does not exist.")
        stream = _stream_info(activity)
        method = "reply" if reply_to is not None else "send"
        visible_to = None
        if request.query.get("isTargetedActivity", "").lower() == "true":
            # "Send and receive targeted messages in group conversations" (developer preview): a message only its
            # recipient sees, in channels and group chats (not 1:1 chats), to a member of the conversation.
            recipient = (activity.get("recipient") or {}).get("id")
            if conversation.type == "personal" or stream is not None:
                return self._error(400, "BadArgument", "Targeted messages are for group conversations.")
            if not any(recipient in (m.id, m.aad_object_id) for m in conversation.members):
                return self._error(400, "BadArgument", "The recipient is not a member of the conversation.")
            visible_to = recipient
        if stream is not None:
            return self._stream(conversation, named, root, reply_to, method, activity, stream)
        activity_id = str(int(time.time() * 1000) * 1000 + next(self._ids))
        self.sent.append(Sent(method, named, reply_to, activity, activity_id))
        if kind == "message":
            self.messages.append(Message(activity_id, conversation.id, root if conversation.type == "channel"
                                         else None, activity.get("text") or "", True, activity,
                                         visible_to=visible_to))
        return web.json_response({"id": activity_id}, status=201)

    def _stream(self, conversation: Conversation, named: str, root: str | None, reply_to: str | None, method: str,
                activity: dict[str, Any], info: dict[str, Any]) -> web.Response:
        """ "Stream bot messages": informative and streaming updates are typing activities with a `streaminfo`
        entity (streamType, streamSequence increasing from 1; the first one's response id is the stream id, which
        every later one carries as streamId); the final message is a message with streamType "final". Only in 1:1
        chats; a stream the user stopped answers 403 ContentStreamNotAllowed."""
        if conversation.type != "personal":
            return self._error(405, "BadArgument", "Streaming is supported only in one-on-one chats.")
        if conversation.streams_stopped:
            return self._error(403, "ContentStreamNotAllowed", "Content stream was cancelled by user.")
        stream_type = info.get("streamType") or "streaming"
        stream_id = info.get("streamId")
        kind = activity.get("type")
        if stream_type == "final":
            if kind != "message" or stream_id not in self._streams or self._streams[stream_id]["ended"]:
                return self._error(400, "BadArgument", "A final message must close an open stream.")
            state = self._streams[stream_id]
            state["ended"] = True
            self.sent.append(Sent(method, named, reply_to, activity, stream_id))
            self.messages.append(Message(stream_id, conversation.id, None, activity.get("text") or "", True,
                                         activity))
            return web.json_response({"id": stream_id}, status=201)
        if kind != "typing" or stream_type not in ("informative", "streaming"):
            return self._error(400, "BadArgument", "Stream updates are typing activities.")
        sequence = info.get("streamSequence")
        if not isinstance(sequence, int) or sequence < 1:
            return self._error(400, "BadArgument", "streamSequence is required.")
        if stream_type == "informative" and len(activity.get("text") or "") > INFORMATIVE_LIMIT:
            return self._error(400, "BadArgument", "An informative update holds at most 1000 characters.")
        if stream_id is None:
            if sequence != 1:
                return self._error(400, "BadArgument", "A new stream starts at streamSequence 1.")
            stream_id = str(int(time.time() * 1000) * 1000 + next(self._ids))
            self._streams[stream_id] = {"conversation": conversation.id, "sequence": 1, "ended": False}
        else:
            state = self._streams.get(stream_id)
            if state is None or state["ended"] or state["conversation"] != conversation.id:
                return self._error(400, "BadArgument", "Unknown or ended stream.")
            if sequence <= state["sequence"]:
                return self._error(400, "BadArgument", "streamSequence must increase.")
            state["sequence"] = sequence
        self.sent.append(Sent(method, named, reply_to, activity, stream_id))
        return web.json_response({"id": stream_id}, status=201)

    async def _update_activity(self, request: web.Request) -> web.Response:
        # "Bot Connector API reference": Update Activity, PUT /v3/conversations/{conversationId}/activities/
        # {activityId} ("Update and delete messages sent from your bot": only the bot's own messages).
        conversation, named, _ = self._conversation(request)
        activity_id = request.match_info["activity"]
        target = next((m for m in self.messages if m.id == activity_id and m.from_bot and conversation is not None
                       and m.conversation_id == conversation.id), None)
        if target is None:
            return self._error(404, "ActivityNotFound", "The activity to update does not exist.")
        activity = await request.json()
        if activity.get("type") != "message":
            return self._error(400, "BadArgument", "Only a message can replace a message.")
        target.text = activity.get("text") or ""
        target.activity = activity
        target.updates += 1
        self.sent.append(Sent("update", named, activity_id, activity, activity_id))
        return web.json_response({"id": activity_id})

    async def _paged_members(self, request: web.Request) -> web.Response:
        # "Get Teams-specific context for your bot" (Fetch the roster) and the Bot Connector API reference's Get
        # Conversation Paged Members: GET /v3/conversations/{conversationId}/pagedmembers?pageSize=&
        # continuationToken= -> {"continuationToken", "members": [TeamsChannelAccount]}; 50 to 500 per page.
        conversation, _, _ = self._known_conversation(request)
        try:
            size = int(request.query.get("pageSize") or MIN_PAGE)
            start = int(request.query.get("continuationToken") or 0)
        except ValueError:
            return self._error(400, "BadArgument", "Invalid pageSize or continuationToken.")
        size = min(max(size, MIN_PAGE), MAX_PAGE)
        page = conversation.members[start:start + size]
        body: dict[str, Any] = {"members": [m.to_api() for m in page]}
        if start + size < len(conversation.members):
            body["continuationToken"] = str(start + size)
        return web.json_response(body)

    async def _members(self, request: web.Request) -> web.Response:
        # "Bot Connector API reference": Get Conversation Members (all at once; Teams recommends the paged form).
        conversation, _, _ = self._known_conversation(request)
        return web.json_response([m.to_api() for m in conversation.members])

    async def _member(self, request: web.Request) -> web.Response:
        # "Get Teams-specific context for your bot" (Get single member details): GET /v3/conversations/
        # {conversationId}/members/{userId}, the user id being the 29: id or the Microsoft Entra object id.
        conversation, _, _ = self._known_conversation(request)
        wanted = request.match_info["member"]
        for member in conversation.members:
            if wanted in (member.id, member.aad_object_id):
                return web.json_response(member.to_api())
        return self._error(404, "MemberNotFoundInConversation", "The user is not a member of the conversation.")


def _base(conversation_id: str) -> str:
    return conversation_id.split(";", 1)[0]


def _thread_root(conversation_id: str) -> str | None:
    for part in conversation_id.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.lower() == "messageid" and value:
            return value
    return None


def _stream_info(activity: dict[str, Any]) -> dict[str, Any] | None:
    for entity in activity.get("entities") or []:
        if isinstance(entity, dict) and entity.get("type") == "streaminfo":
            return entity
    return None
