"""A fake Slack Web API (and Socket Mode server): a real HTTP server on 127.0.0.1 speaking Slack's wire format.

slack_sdk's AsyncWebClient is pointed at it with `base_url=fake.api_url` (SLACK_API_URL). It runs in a thread of its
own with its own event loop, so it answers while a test's loop awaits. It records every call and keeps the
messages that were posted, updated and streamed, so tests can assert what a Slack user would see.

    with FakeSlackAPI() as fake:
        fake.add_user("U1", email="ann@example.com", is_admin=True)
        fake.rate_limit("chat.postMessage")        # the next call of that method: 429 with Retry-After
        fake.refuse("chat.startStream", "not_allowed")
        fake.calls_to("chat.update")               # recorded calls, args parsed (form or JSON)
        fake.thread("C1", "1700.1")                # the visible messages of a thread, in order
        fake.add_channel("C9", private=True, members=["U1", "U2"])  # conversations.info / conversations.members
        fake.ephemeral_for("U1")                   # what chat.postEphemeral showed U1 alone
        await fake.socket_send(envelope)           # Socket Mode: push an envelope to the connected app

Shapes from Slack's documentation (api.slack.com): every method answers `{"ok": true, ...}` or `{"ok": false,
"error"}` with HTTP 200 ("Web API basics"); a rate limit is HTTP 429 with a `Retry-After` header and
`{"ok": false, "error": "ratelimited"}` ("Rate limits"); cursor paging ("Pagination") gives at most `limit` items
and, while more follow, `response_metadata.next_cursor` (an empty string on the last page) — served here by
conversations.replies (`has_more` too; messages oldest first, the parent first), users.list and
conversations.members, each capped at `page_size` items whatever `limit` asks. Methods accept GET with a query
string (slack_sdk sends users.info that way) and POST with a form or JSON body.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import WSMsgType, web

from fakes.server import AiohttpServer

BOT_USER_ID = "UBOT"
BOT_ID = "BBOT"
TEAM_ID = "T1"


@dataclass
class Call:
    method: str
    args: dict[str, Any]
    token: str | None


@dataclass
class Message:
    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)
    thread_ts: str | None = None
    user: str | None = None
    bot_id: str | None = None
    streamed: list[str] = field(default_factory=list)  # markdown chunks appended while streaming
    stream_state: str | None = None  # "streaming", "stopped"
    updates: int = 0

    @property
    def visible_text(self) -> str:
        """What a reader sees: the text, or the streamed markdown, plus every text inside the blocks."""
        parts = ["".join(self.streamed) if self.streamed else self.text]
        parts += list(_block_texts(self.blocks))
        return "\n".join(p for p in parts if p)

    def to_api(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": "message", "ts": self.ts, "text": self.text}
        if self.thread_ts:
            data["thread_ts"] = self.thread_ts
        if self.user:
            data["user"] = self.user
        if self.bot_id:
            data["bot_id"] = self.bot_id
        if self.blocks:
            data["blocks"] = self.blocks
        return data


def _block_texts(blocks: Any) -> Any:
    if isinstance(blocks, dict):
        for key, value in blocks.items():
            if key == "text" and isinstance(value, str):
                yield value
            elif key != "value":
                yield from _block_texts(value)
    elif isinstance(blocks, list):
        for item in blocks:
            yield from _block_texts(item)


def _parse_json_field(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class FakeSlackAPI(AiohttpServer):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []
        self.users: dict[str, dict[str, Any]] = {}
        self.enterprise_id: str | None = None  # an Enterprise Grid install: auth.test names the organisation
        self.messages: list[Message] = []
        self.responses: list[dict[str, Any]] = []  # POSTs to response_url (slash command follow-ups)
        self.socket_acks: list[dict[str, Any]] = []
        self._rate_limits: dict[str, list[int]] = defaultdict(list)
        self._refusals: dict[str, list[str]] = defaultdict(list)
        self._ts = itertools.count(1)
        self._lock = threading.Lock()
        self._sockets: list[web.WebSocketResponse] = []
        self.connections_opened = 0
        self.page_size = 1000  # the most items any paged method returns in one page
        self.members: dict[str, list[str]] = {}  # channel -> member user ids (conversations.members)
        self.channels: dict[str, dict[str, Any]] = {}  # channel id -> conversations.info's channel object
        self.ephemeral: list[Message] = []  # chat.postEphemeral: seen by `user` only (Message.user)

    # Set-up and scripting.

    def add_user(self, user_id: str, *, email: str | None = None, is_admin: bool = False, is_owner: bool = False,
                 is_bot: bool = False, name: str | None = None, team_id: str = TEAM_ID, is_restricted: bool = False,
                 is_ultra_restricted: bool = False, is_stranger: bool = False,
                 enterprise_id: str | None = None) -> None:
        """A user object as users.info returns it (https://api.slack.com/types/user): `team_id` (another team's
        id for a Slack Connect user), `is_restricted` (multi-channel guest), `is_ultra_restricted` (single-channel
        guest); `is_stranger` is present only on users of another organisation ("User object", is_stranger)."""
        self.users[user_id] = {
            "id": user_id, "team_id": team_id, "name": name or user_id.lower(), "is_bot": is_bot,
            "is_admin": is_admin, "is_owner": is_owner, "is_primary_owner": False, "deleted": False,
            "is_restricted": is_restricted, "is_ultra_restricted": is_ultra_restricted, "is_app_user": False,
            "profile": {"email": email} if email else {},
        }
        if is_stranger:
            self.users[user_id]["is_stranger"] = True
        if enterprise_id:  # a user of an Enterprise Grid organisation ("enterprise_user" in the user object)
            self.users[user_id]["enterprise_user"] = {"id": user_id, "enterprise_id": enterprise_id,
                                                      "enterprise_name": "Acme Org", "is_admin": False,
                                                      "is_owner": False, "teams": [team_id]}

    def add_channel(self, channel_id: str, *, private: bool, members: list[str], name: str | None = None,
                    mpim: bool = False, ext_shared: bool = False) -> None:
        """A channel conversations.info describes and conversations.members lists (the bot is a member too).
        conversations.info (https://api.slack.com/methods/conversations.info): {"ok", "channel": {"id", "name",
        "is_channel", "is_group", "is_im", "is_mpim", "is_private", "is_archived", "created", "creator", ...}}; a
        private channel created after March 2021 has a C id and is_channel true, is_private true."""
        self.channels[channel_id] = {
            "id": channel_id, "name": name or channel_id.lower(), "is_channel": not mpim, "is_group": False,
            "is_im": False, "is_mpim": mpim, "is_private": private or mpim, "created": 1700000000,
            "is_archived": False, "is_general": False, "is_shared": ext_shared, "is_org_shared": False,
            "is_ext_shared": ext_shared,  # shared with another organisation (Slack Connect)
            "is_member": True, "creator": members[0] if members else "U0", "unlinked": 0,
            "name_normalized": name or channel_id.lower(), "topic": {"value": "", "creator": "", "last_set": 0},
            "purpose": {"value": "", "creator": "", "last_set": 0},
        }
        self.members[channel_id] = [BOT_USER_ID, *members]

    def ephemeral_for(self, user: str, channel: str | None = None) -> list[Message]:
        """The ephemeral messages `user` was shown (in `channel`), oldest first."""
        with self._lock:
            return [m for m in self.ephemeral if m.user == user and (channel is None or m.channel == channel)]

    def rate_limit(self, method: str, retry_after: int = 0, times: int = 1) -> None:
        """The next `times` calls of `method` get HTTP 429 with this Retry-After."""
        with self._lock:
            self._rate_limits[method] += [retry_after] * times

    def refuse(self, method: str, error: str) -> None:
        """The next call of `method` answers {"ok": false, "error": error}."""
        with self._lock:
            self._refusals[method].append(error)

    def add_message(self, channel: str, text: str, *, user: str | None = None, thread_ts: str | None = None,
                    bot: bool = False) -> str:
        """A message that already exists (e.g. earlier in a thread, for conversations.replies)."""
        ts = self._next_ts()
        self.messages.append(Message(channel, ts, text, [], thread_ts, BOT_USER_ID if bot else user,
                                     BOT_ID if bot else None))
        return ts

    # Reading what happened.

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/"

    @property
    def response_url(self) -> str:
        return f"{self.url}/respond/{next(self._ts)}"

    def calls_to(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    def thread(self, channel: str, thread_ts: str | None) -> list[Message]:
        """Messages the bot posted in a thread (thread_ts None: top level of the channel), oldest first."""
        with self._lock:
            return [m for m in self.messages if m.channel == channel and m.thread_ts == thread_ts
                    and m.bot_id == BOT_ID]

    def bot_messages(self) -> list[Message]:
        with self._lock:
            return [m for m in self.messages if m.bot_id == BOT_ID]

    # Server.

    def _next_ts(self) -> str:
        return f"{int(time.time())}.{next(self._ts):06d}"

    async def _start_servers(self) -> None:
        app = web.Application()
        app.add_routes([
            web.post("/api/{method}", self._api),
            web.get("/api/{method}", self._api),
            web.get("/socket", self._socket),
            web.post("/respond/{id}", self._respond),
        ])
        self.port = await self.serve(app)

    async def _close(self) -> None:
        for ws in list(self._sockets):
            await ws.close()

    # Socket Mode.

    async def socket_send(self, envelope: dict[str, Any], timeout: float = 10) -> None:
        """Push an envelope to the connected app (from a test's loop) and wait for its ack."""
        envelope_id = envelope["envelope_id"]

        async def push() -> None:
            deadline = time.monotonic() + timeout
            while not self._sockets and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await self._sockets[-1].send_str(json.dumps(envelope))

        await asyncio.wrap_future(self.run_in_loop(push()))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(a.get("envelope_id") == envelope_id for a in self.socket_acks):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"no ack for envelope {envelope_id}")

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1,
                                      "connection_info": {"app_id": "A1"}, "debug_info": {"host": "fake"}}))
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                try:
                    self.socket_acks.append(json.loads(message.data))
                except ValueError:
                    pass
        self._sockets.remove(ws)
        return ws

    async def _respond(self, request: web.Request) -> web.Response:
        self.responses.append(await request.json())
        return web.Response(text="ok")

    # The Web API.

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        raw = await request.read()
        content_type = request.headers.get("Content-Type", "")
        if "json" in content_type:
            args = json.loads(raw or b"{}")
        else:
            args = {k: _parse_json_field(v) for k, v in parse_qsl(raw.decode(), keep_blank_values=True)}
        args.update({k: v for k, v in request.query.items() if k not in args})
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() or args.get("token")
        with self._lock:
            self.calls.append(Call(method, args, token))
            retry_after = self._rate_limits[method].pop(0) if self._rate_limits[method] else None
            refusal = self._refusals[method].pop(0) if self._refusals[method] else None
        if retry_after is not None:
            return web.json_response({"ok": False, "error": "ratelimited"}, status=429,
                                     headers={"Retry-After": str(retry_after)})
        if not token:
            return web.json_response({"ok": False, "error": "not_authed"})
        if refusal is not None:
            return web.json_response({"ok": False, "error": refusal})
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"})
        return web.json_response(handler(args))

    def _m_auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        # auth.test (https://api.slack.com/methods/auth.test): `enterprise_id` only on an Enterprise Grid workspace.
        response = {"ok": True, "url": "https://acme.slack.com/", "team": "Acme", "user": "ragbot", "team_id": TEAM_ID,
                    "user_id": BOT_USER_ID, "bot_id": BOT_ID, "is_enterprise_install": False}
        if self.enterprise_id:
            response["enterprise_id"] = self.enterprise_id
        return response

    def _m_users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        user = self.users.get(args.get("user", ""))
        return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}

    def _m_apps_connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        self.connections_opened += 1
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket"}

    def _m_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        if not args.get("channel"):
            return {"ok": False, "error": "channel_not_found"}
        message = Message(args["channel"], self._next_ts(), args.get("text") or "", args.get("blocks") or [],
                          args.get("thread_ts") or None, BOT_USER_ID, BOT_ID)
        with self._lock:
            self.messages.append(message)
        return {"ok": True, "channel": message.channel, "ts": message.ts, "message": message.to_api()}

    def _find(self, channel: str, ts: str) -> Message | None:
        for message in self.messages:
            if message.channel == channel and message.ts == ts:
                return message
        return None

    def _m_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            message = self._find(args.get("channel", ""), args.get("ts", ""))
            if message is None:
                return {"ok": False, "error": "message_not_found"}
            message.text = args.get("text") or ""
            message.blocks = args.get("blocks") or []
            message.streamed = []
            message.updates += 1
        return {"ok": True, "channel": message.channel, "ts": message.ts, "text": message.text}

    def _m_chat_postEphemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        # chat.postEphemeral (https://api.slack.com/methods/chat.postEphemeral): {"ok": true, "message_ts"}; the
        # message is shown to `user` only, in `channel` (in the thread `thread_ts`), and cannot be updated later.
        if not args.get("channel") or not args.get("user"):
            return {"ok": False, "error": "channel_not_found" if not args.get("channel") else "user_not_in_channel"}
        ts = self._next_ts()
        with self._lock:
            self.ephemeral.append(Message(args["channel"], ts, args.get("text") or "", args.get("blocks") or [],
                                          args.get("thread_ts") or None, args["user"], BOT_ID))
        return {"ok": True, "message_ts": ts}

    def _m_chat_startStream(self, args: dict[str, Any]) -> dict[str, Any]:
        if not args.get("thread_ts"):
            return {"ok": False, "error": "invalid_arguments"}
        message = Message(args["channel"], self._next_ts(), "", [], args["thread_ts"], BOT_USER_ID, BOT_ID,
                          stream_state="streaming")
        message.streamed += _chunk_texts(args)
        with self._lock:
            self.messages.append(message)
        return {"ok": True, "channel": message.channel, "ts": message.ts}

    def _m_chat_appendStream(self, args: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            message = self._find(args.get("channel", ""), args.get("ts", ""))
            if message is None or message.stream_state != "streaming":
                return {"ok": False, "error": "message_not_in_streaming_state"}
            message.streamed += _chunk_texts(args)
        return {"ok": True, "channel": message.channel, "ts": message.ts}

    def _m_chat_stopStream(self, args: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            message = self._find(args.get("channel", ""), args.get("ts", ""))
            if message is None or message.stream_state != "streaming":
                return {"ok": False, "error": "message_not_in_streaming_state"}
            message.streamed += _chunk_texts(args)
            message.blocks = args.get("blocks") or []
            message.stream_state = "stopped"
        return {"ok": True, "channel": message.channel, "ts": message.ts,
                "message": {"text": "".join(message.streamed), "blocks": message.blocks}}

    def _page(self, items: list[Any], args: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Cursor paging ("Pagination"): `limit` (capped at page_size) items from the opaque `cursor`; the next
        cursor in `response_metadata.next_cursor`, "" on the last page."""
        limit = min(int(args.get("limit") or 100) or 100, self.page_size)
        cursor = str(args.get("cursor") or "")
        start = int(cursor.removeprefix("dXNlcjpV").split("_", 1)[-1]) if cursor else 0
        following = f"dXNlcjpV_{start + limit}" if start + limit < len(items) else ""
        return items[start : start + limit], {"next_cursor": following}

    def _m_conversations_replies(self, args: dict[str, Any]) -> dict[str, Any]:
        # conversations.replies: {"messages": [parent, replies oldest first], "has_more", "ok",
        # "response_metadata": {"next_cursor"}}.
        # `latest` / `inclusive` bound the messages by ts (https://api.slack.com/methods/conversations.replies).
        channel, ts = args.get("channel", ""), args.get("ts", "")
        latest = _ts_key(str(args["latest"])) if args.get("latest") else None
        inclusive = str(args.get("inclusive", "")).lower() in ("1", "true")
        with self._lock:
            found = [m.to_api() for m in self.messages
                     if m.channel == channel and (m.ts == ts or m.thread_ts == ts)
                     and (latest is None or _ts_key(m.ts) < latest or (inclusive and _ts_key(m.ts) == latest))]
        if not found:
            return {"ok": False, "error": "thread_not_found"}
        page, metadata = self._page(found, args)
        return {"ok": True, "messages": page, "has_more": bool(metadata["next_cursor"]),
                "response_metadata": metadata}

    def _m_users_list(self, args: dict[str, Any]) -> dict[str, Any]:
        # users.list: {"ok", "members": [user], "cache_ts", "response_metadata": {"next_cursor"}}.
        page, metadata = self._page(list(self.users.values()), args)
        return {"ok": True, "members": page, "cache_ts": int(time.time()), "response_metadata": metadata}

    def _m_conversations_info(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self.channels.get(args.get("channel", ""))
        return {"ok": True, "channel": channel} if channel else {"ok": False, "error": "channel_not_found"}

    def _m_conversations_members(self, args: dict[str, Any]) -> dict[str, Any]:
        # conversations.members: {"ok", "members": ["U…"], "response_metadata": {"next_cursor"}}.
        channel = args.get("channel", "")
        if channel not in self.members:
            return {"ok": False, "error": "channel_not_found"}
        page, metadata = self._page(self.members[channel], args)
        return {"ok": True, "members": page, "response_metadata": metadata}

    def _m_assistant_threads_setStatus(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    def _m_assistant_threads_setSuggestedPrompts(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    def _m_assistant_threads_setTitle(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}


def _ts_key(ts: str) -> tuple[int, int]:
    seconds, _, micro = ts.partition(".")
    return int(seconds or 0), int(micro or 0)


def _chunk_texts(args: dict[str, Any]) -> list[str]:
    texts = []
    if args.get("markdown_text"):
        texts.append(args["markdown_text"])
    for chunk in args.get("chunks") or []:
        if isinstance(chunk, dict) and chunk.get("type") == "markdown_text":
            texts.append(chunk.get("text", ""))
    return texts
