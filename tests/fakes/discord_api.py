"""A fake Discord HTTP API: a real aiohttp server on 127.0.0.1 speaking the routes discord.py 2.7 calls.

discord.py builds every URL from the class attribute `discord.http.Route.BASE` at the moment a Route is created, so
pointing that at `fake.base_url` (what `DISCORD_API_URL` does in the bot) sends the bot's REST calls, the
interaction callbacks and the follow-up webhooks here. The fake records every call and keeps just enough state to
answer like Discord: messages per channel (so edits and history work), threads created from messages, and the
application commands that were synced.

    async with FakeDiscordAPI() as fake:
        fake.rate_limit_next("POST", "/channels/", retry_after=0.05)   # next matching call: 429 (Via + JSON body)
        ...
        fake.calls_to("POST", "/interactions/")                          # what the bot sent
        fake.messages[channel_id]                                       # what a user would see, after edits

Discord's documented shapes (https://discord.com/developers/docs): a 429 carries `Via` and a JSON body
`{"message", "retry_after", "global"}`; without `Via` discord.py assumes a Cloudflare ban and raises instead of
retrying, and it parses a body as JSON only when `Content-Type` is exactly `application/json`. Interaction callbacks answer `{"interaction": {...}, "resource": {...}}` because discord.py asks for
`with_response=1`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import WSMsgType, web

from fakes.server import serve_app

BOT_USER_ID = 900000000000000001
APPLICATION_ID = 900000000000000002
BOT_USERNAME = "ragbot"


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def user_payload(user_id: int, username: str, *, bot: bool = False) -> dict[str, Any]:
    return {"id": str(user_id), "username": username, "discriminator": "0", "global_name": username,
            "avatar": None, "bot": bot, "public_flags": 0}


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # without the /api/v10 prefix
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    body: Any  # parsed JSON, or None
    at: float = field(default_factory=time.perf_counter)  # when it arrived


@dataclass
class _Scripted429:
    method: str
    path_contains: str
    retry_after: float
    is_global: bool
    via: bool = True


@dataclass
class FakeDiscordAPI:
    """One fake Discord: a bot user, its application, channels with messages, and every call recorded."""

    api_prefix: str = "/api/v10"
    calls: list[Call] = field(default_factory=list)
    messages: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # channel id -> messages, oldest first
    threads: dict[int, dict[str, Any]] = field(default_factory=dict)  # thread id -> channel payload
    commands: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # "global" | guild id -> synced commands
    bot_user: dict[str, Any] = field(default_factory=lambda: user_payload(BOT_USER_ID, BOT_USERNAME, bot=True))
    token: str = "fake-bot-token"  # the bot token the REST routes accept (webhook routes carry their own token)

    def __post_init__(self) -> None:
        self._ids = itertools.count(1_300_000_000_000_000_000)
        self._scripted: list[_Scripted429] = []
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._channel_guild: dict[int, int | None] = {}
        self._interaction_messages: dict[str, list[int]] = {}  # interaction token -> follow-up message ids
        self._interaction_channel: dict[str, int] = {}  # interaction token -> the channel it came from
        # The gateway (websocket): what the bot identified with, and the events sent after READY.
        self.identify: dict[str, Any] | None = None
        self.identified = asyncio.Event()
        self.guild_creates: list[dict[str, Any]] = []  # GUILD_CREATE payloads sent right after READY
        self._gateway_socket: web.WebSocketResponse | None = None
        self._sequence = 0
        # As if the Message Content intent were not switched on in the Developer Portal: close code 4014.
        self.refuse_privileged_intents = False
        self.guild_members: dict[int, list[dict[str, Any]]] = {}  # guild id -> guild member objects
        # As if the Server Members intent were off in the Developer Portal: GET /guilds/{id}/members answers 403.
        self.refuse_member_list = False

    # ---- set-up -------------------------------------------------------------------------------------------------

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def gateway_url(self) -> str:
        """What discord.py's `DiscordWebSocket.DEFAULT_GATEWAY` should be (`DISCORD_GATEWAY_URL`)."""
        return f"ws://127.0.0.1:{self._port}/gateway"

    @property
    def base_url(self) -> str:
        """What discord.py's `Route.BASE` should be (`DISCORD_API_URL`)."""
        return f"http://127.0.0.1:{self._port}{self.api_prefix}"

    def add_channel(self, channel_id: int, guild_id: int | None) -> None:
        self._channel_guild[channel_id] = guild_id
        self.messages.setdefault(channel_id, [])

    def add_member(self, guild_id: int, user_id: int, roles: list[int] | None = None, *, bot: bool = False) -> None:
        """A guild member (https://discord.com/developers/docs/resources/guild#guild-member-object): {"user",
        "nick", "avatar", "roles": [role ids], "joined_at", "deaf", "mute", "flags", "pending"}."""
        members = self.guild_members.setdefault(guild_id, [])
        members[:] = [m for m in members if int(m["user"]["id"]) != user_id]
        members.append({"user": user_payload(user_id, f"user{user_id}", bot=bot), "nick": None, "avatar": None,
                        "roles": [str(r) for r in roles or []], "joined_at": now_iso(), "deaf": False,
                        "mute": False, "flags": 0, "pending": False})

    def remove_member(self, guild_id: int, user_id: int) -> None:
        self.guild_members[guild_id] = [m for m in self.guild_members.get(guild_id, [])
                                        if int(m["user"]["id"]) != user_id]

    def bind_interaction(self, token: str, channel_id: int) -> None:
        """Where an interaction's responses appear (Discord knows this from the interaction itself)."""
        self._interaction_channel[token] = channel_id

    def rate_limit_next(self, method: str, path_contains: str, *, retry_after: float = 0.05,
                        is_global: bool = False, via: bool = True) -> None:
        """The next call matching method and path part gets a 429 (with `Via` unless via=False)."""
        self._scripted.append(_Scripted429(method.upper(), path_contains, retry_after, is_global, via))

    # ---- what the bot did ---------------------------------------------------------------------------------------

    def calls_to(self, method: str, path_contains: str) -> list[Call]:
        return [c for c in self.calls if c.method == method.upper() and path_contains in c.path]

    def message(self, channel_id: int, message_id: int) -> dict[str, Any]:
        return next(m for m in self.messages[channel_id] if int(m["id"]) == message_id)

    def bot_messages(self, channel_id: int) -> list[dict[str, Any]]:
        return [m for m in self.messages.get(channel_id, []) if m["author"]["id"] == self.bot_user["id"]]

    def interaction_messages(self, token: str) -> list[dict[str, Any]]:
        """Follow-ups (and the edited original) of one interaction, as they look now."""
        found = []
        for message_id in self._interaction_messages.get(token, []):
            for channel_messages in self.messages.values():
                found.extend(m for m in channel_messages if int(m["id"]) == message_id)
        return found

    def record_user_message(self, payload: dict[str, Any]) -> None:
        """A message a user posted (what the harness feeds as MESSAGE_CREATE), so history reads see it."""
        self.messages.setdefault(int(payload["channel_id"]), []).append(payload)

    # ---- serving ------------------------------------------------------------------------------------------------

    async def start(self) -> FakeDiscordAPI:
        app = web.Application()
        app.router.add_get("/gateway", self._gateway)
        app.router.add_route("*", self.api_prefix + "/{tail:.*}", self._handle)
        self._runner, self._port = await serve_app(app)  # on the test's own loop
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- the gateway ------------------------------------------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        """HELLO, heartbeat ACKs, and READY (+ the GUILD_CREATEs) after IDENTIFY, as text frames (discord.py asks
        for zlib-stream but reads uncompressed text frames as they are)."""
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._gateway_socket = ws
        await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": 41250}, "s": None, "t": None}))
        async for frame in ws:
            if frame.type != WSMsgType.TEXT:
                break
            message = json.loads(frame.data)
            if message["op"] == 1:  # heartbeat
                await ws.send_str(json.dumps({"op": 11, "d": None, "s": None, "t": None}))
            elif message["op"] == 2:  # identify
                self.identify = message["d"]
                if self.refuse_privileged_intents and self.identify["intents"] & ((1 << 1) | (1 << 8) | (1 << 15)):
                    await ws.close(code=4014, message=b"Disallowed intent(s).")
                    break
                await self.dispatch("READY", {
                    "v": 10, "user": self.bot_user, "session_id": "fake-session", "shard": [0, 1],
                    "resume_gateway_url": self.gateway_url, "guilds": [
                        {"id": g["id"], "unavailable": True} for g in self.guild_creates
                    ],
                    "application": {"id": str(APPLICATION_ID), "flags": 0},
                })
                for guild in self.guild_creates:
                    await self.dispatch("GUILD_CREATE", guild)
                self.identified.set()
        self._gateway_socket = None
        return ws

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send one gateway event to the connected bot."""
        assert self._gateway_socket is not None, "the bot is not connected to the gateway"
        self._sequence += 1
        await self._gateway_socket.send_str(json.dumps({"op": 0, "t": event, "s": self._sequence, "d": data}))

    async def __aenter__(self) -> FakeDiscordAPI:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body: Any = None
        if raw and request.content_type == "application/json":
            body = json.loads(raw)
        elif raw and request.content_type.startswith("multipart/"):
            body = _payload_json_from_multipart(raw, request.content_type, request.headers.get("Content-Type", ""))
        path = "/" + request.match_info["tail"]
        call = Call(request.method, path, dict(request.query), {k.lower(): v for k, v in request.headers.items()}, body)
        self.calls.append(call)

        for scripted in self._scripted:
            if scripted.method == call.method and scripted.path_contains in path:
                self._scripted.remove(scripted)
                # Discord "Rate Limits": 429 with `Retry-After` (seconds), `X-RateLimit-Scope`, `X-RateLimit-Global`
                # when global, and the JSON body {"message", "retry_after", "global"}; Cloudflare adds `Via`.
                headers = {"Via": "1.1 google"} if scripted.via else {}
                headers["X-RateLimit-Scope"] = "global" if scripted.is_global else "user"
                headers["Retry-After"] = str(scripted.retry_after)
                if scripted.is_global:
                    headers["X-RateLimit-Global"] = "true"
                return _json(
                    {"message": "You are being rate limited.", "retry_after": scripted.retry_after,
                     "global": scripted.is_global},
                    status=429, headers=headers,
                )

        if not path.startswith("/webhooks/") and not path.startswith("/interactions/"):
            if request.headers.get("Authorization", "") != "Bot " + self.token:
                return _json({"message": "401: Unauthorized", "code": 0}, status=401)
        try:
            status, payload = self._route(call)
        except KeyError as exc:
            return _json({"message": f"Unknown {exc}", "code": 10003}, status=404)
        if status == 204:
            return web.Response(status=204)
        return _json(payload, status=status)

    def _route(self, call: Call) -> tuple[int, Any]:
        m, p, body = call.method, call.path, call.body or {}
        if (m, p) == ("GET", "/users/@me"):
            return 200, self.bot_user
        if (m, p) == ("GET", "/oauth2/applications/@me"):
            return 200, self._application()
        if match := re.fullmatch(r"/applications/(\d+)/commands", p):
            if m == "PUT":
                self.commands["global"] = self._registered(call.body or [], None)
            return 200, self.commands.get("global", [])
        if match := re.fullmatch(r"/applications/(\d+)/guilds/(\d+)/commands", p):
            if m == "PUT":
                self.commands[match.group(2)] = self._registered(call.body or [], match.group(2))
            return 200, self.commands.get(match.group(2), [])
        if match := re.fullmatch(r"/interactions/(\d+)/([^/]+)/callback", p):
            return 200, self._interaction_callback(int(match.group(1)), match.group(2), body)
        if match := re.fullmatch(r"/webhooks/(\d+)/([^/]+)", p):
            if m == "POST":
                return 200, self._followup(match.group(2), body)
        if match := re.fullmatch(r"/webhooks/(\d+)/([^/]+)/messages/([^/]+)", p):
            return 200, self._edit_followup(match.group(2), match.group(3), body, m)
        if match := re.fullmatch(r"/channels/(\d+)/messages", p):
            channel_id = int(match.group(1))
            if m == "POST":
                return 200, self._store_new(channel_id, body, author=self.bot_user)
            if m == "GET":  # history: newest first, optionally only messages before an id
                limit = int(call.query.get("limit", 50))
                before = int(call.query.get("before", 0)) or None
                older = [x for x in self.messages.get(channel_id, []) if before is None or int(x["id"]) < before]
                return 200, list(reversed(older))[:limit]
        if match := re.fullmatch(r"/channels/(\d+)/messages/(\d+)", p):
            channel_id, message_id = int(match.group(1)), int(match.group(2))
            if m == "PATCH":
                return 200, self._apply_edit(self.message(channel_id, message_id), body)
            if m == "GET":
                return 200, self.message(channel_id, message_id)
        if match := re.fullmatch(r"/channels/(\d+)/messages/(\d+)/threads", p):
            return 201, self._thread_from_message(int(match.group(1)), int(match.group(2)), body)
        if match := re.fullmatch(r"/guilds/(\d+)/members", p):
            # List Guild Members (https://discord.com/developers/docs/resources/guild#list-guild-members): members
            # sorted by user id, `limit` 1-1000 (default 1), `after` = the highest user id of the previous page.
            # Without the Server Members intent: 403 {"message": "Missing Access", "code": 50001}.
            if self.refuse_member_list:
                return 403, {"message": "Missing Access", "code": 50001}
            limit = max(1, min(int(call.query.get("limit", 1)), 1000))
            after = int(call.query.get("after", 0))
            members = sorted(self.guild_members.get(int(match.group(1)), []), key=lambda x: int(x["user"]["id"]))
            return 200, [x for x in members if int(x["user"]["id"]) > after][:limit]
        if m == "POST" and p == "/users/@me/channels":
            channel_id = self.next_id()
            self.add_channel(channel_id, None)
            return 200, {"id": str(channel_id), "type": 1, "last_message_id": None,
                         "recipients": [user_payload(int(body["recipient_id"]), "someone")]}
        return 404, {"message": f"fake Discord has no route {m} {p}", "code": 0}

    # ---- behaviours ---------------------------------------------------------------------------------------------

    def _application(self) -> dict[str, Any]:
        return {"id": str(APPLICATION_ID), "name": BOT_USERNAME, "description": "", "icon": None,
                "bot_public": False, "bot_require_code_grant": False, "owner": user_payload(1, "owner"),
                "verify_key": "0" * 64, "flags": 0, "summary": "", "team": None, "interactions_endpoint_url": None}

    def _registered(self, commands: list[dict[str, Any]], guild_id: str | None) -> list[dict[str, Any]]:
        out = []
        for command in commands:
            registered = {**command, "id": str(self.next_id()), "application_id": str(APPLICATION_ID),
                          "version": str(self.next_id())}
            if guild_id:
                registered["guild_id"] = guild_id
            out.append(registered)
        return out

    def _interaction_callback(self, interaction_id: int, token: str, body: dict[str, Any]) -> dict[str, Any]:
        kind = body.get("type")
        flags = (body.get("data") or {}).get("flags") or 0
        self._interaction_messages.setdefault(token, [])
        interaction = {"id": str(interaction_id), "type": 2, "response_message_loading": kind == 5,
                       "response_message_ephemeral": bool(flags & 64)}
        resource: dict[str, Any] = {"type": kind}
        if kind == 4:  # CHANNEL_MESSAGE_WITH_SOURCE
            message = self._store_new(self._interaction_channel.get(token, 0), body.get("data") or {},
                                      author=self.bot_user, webhook=True)
            self._interaction_messages[token].append(int(message["id"]))
            interaction["response_message_id"] = message["id"]
            resource["message"] = message
        return {"interaction": interaction, "resource": resource}

    def _followup(self, token: str, body: dict[str, Any]) -> dict[str, Any]:
        message = self._store_new(self._interaction_channel.get(token, 0), body, author=self.bot_user, webhook=True)
        self._interaction_messages.setdefault(token, []).append(int(message["id"]))
        return message

    def _edit_followup(self, token: str, message_ref: str, body: dict[str, Any], method: str) -> dict[str, Any]:
        ids = self._interaction_messages.get(token) or []
        if message_ref == "@original":
            if not ids:  # the deferred "thinking" placeholder becomes a real message on its first edit
                message = self._store_new(self._interaction_channel.get(token, 0), {}, author=self.bot_user,
                                          webhook=True)
                ids.append(int(message["id"]))
                self._interaction_messages[token] = ids
            message_id = ids[0]
        else:
            message_id = int(message_ref)
            if message_id not in ids:
                raise KeyError(f"message {message_id}")
        message = next(m for msgs in self.messages.values() for m in msgs if int(m["id"]) == message_id)
        if method == "PATCH":
            return self._apply_edit(message, body)
        return message

    def _store_new(self, channel_id: int, body: dict[str, Any], *, author: dict[str, Any],
                   webhook: bool = False) -> dict[str, Any]:
        message_id = self.next_id()
        message = {
            "id": str(message_id), "channel_id": str(channel_id), "author": author,
            "content": body.get("content") or "", "timestamp": now_iso(), "edited_timestamp": None,
            "tts": bool(body.get("tts")), "mention_everyone": False, "mentions": [], "mention_roles": [],
            "attachments": [], "embeds": body.get("embeds") or [], "pinned": False, "type": 0,
            "flags": body.get("flags") or 0, "components": body.get("components") or [],
            "allowed_mentions": body.get("allowed_mentions"),  # kept so tests can see what the bot asked for
            "edits": 0,
        }
        if webhook:
            message["webhook_id"] = str(APPLICATION_ID)
            message["application_id"] = str(APPLICATION_ID)
        guild_id = self._channel_guild.get(channel_id)
        if guild_id is not None:
            message["guild_id"] = str(guild_id)
        self.messages.setdefault(channel_id, []).append(message)
        return message

    def _apply_edit(self, message: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        for key in ("content", "embeds", "components", "flags", "allowed_mentions"):
            if key in body:
                message[key] = body[key] if body[key] is not None else ([] if key != "content" else "")
        message["edited_timestamp"] = now_iso()
        message["edits"] += 1
        return message

    def user_thread(self, guild_id: int, parent_id: int, owner_id: int, name: str = "discussion") -> int:
        """A thread a user started (the bot is not in the conversation yet); returns its id."""
        thread_id = self.next_id()
        self.threads[thread_id] = {**self._thread_payload(thread_id, guild_id, parent_id, name), "owner_id": str(owner_id)}
        self.add_channel(thread_id, guild_id)
        return thread_id

    def _thread_payload(self, thread_id: int, guild_id: int | None, parent_id: int, name: str,
                        auto_archive: int = 1440) -> dict[str, Any]:
        return {
            "id": str(thread_id), "type": 11, "guild_id": str(guild_id), "parent_id": str(parent_id), "name": name,
            "owner_id": self.bot_user["id"], "last_message_id": None, "rate_limit_per_user": 0,
            "message_count": 0, "member_count": 1, "flags": 0,
            "thread_metadata": {"archived": False, "auto_archive_duration": auto_archive,
                                "archive_timestamp": now_iso(), "locked": False},
            "newly_created": True,
        }

    def _thread_from_message(self, channel_id: int, message_id: int, body: dict[str, Any]) -> dict[str, Any]:
        self.message(channel_id, message_id)  # 404 when unknown, as Discord does
        guild_id = self._channel_guild.get(channel_id)
        # A thread started from a message has that message's id.
        thread = self._thread_payload(message_id, guild_id, channel_id, body.get("name", ""),
                                      body.get("auto_archive_duration", 1440))
        self.threads[message_id] = thread
        self.add_channel(message_id, guild_id)
        return thread


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """Exactly `Content-Type: application/json`: discord.py parses JSON only when the header is exactly that
    (aiohttp's json_response adds `; charset=utf-8`, which discord.py would hand back as a string)."""
    return web.Response(body=json.dumps(payload).encode(), status=status,
                        headers={"Content-Type": "application/json", **(headers or {})})


def _payload_json_from_multipart(raw: bytes, content_type: str, header: str) -> Any:
    """discord.py sends files as multipart with the JSON in a `payload_json` part; the bot never sends files,
    but a fake must not choke on one."""
    boundary = header.split("boundary=", 1)[-1].strip('"')
    for part in raw.split(b"--" + boundary.encode()):
        if b'name="payload_json"' in part:
            return json.loads(part.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n", 1)[0])
    return None
