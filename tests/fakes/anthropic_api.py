"""A fake Anthropic Messages API: a real HTTP server on 127.0.0.1 speaking the real wire format.

The anthropic SDK (>= 1.0) sends its requests through httpx2, which respx cannot intercept, so tests point the SDK's
`base_url` at this server instead. It runs in a background thread, so it answers while an async test awaits.

    with FakeAnthropicAPI() as fake:
        fake.rate_limited()                 # next request: 429 rate_limit_error (retry-after-ms: 1)
        fake.overloaded()                   # then: 529 overloaded_error
        fake.reply_text("Paris [1].")       # then: 200 with this text
        fake.reply_stream(["Par", "is [1]."])  # then: this text in these deltas (if the request streams)
        fake.stream_breaks(["Par"], "overloaded_error")  # then: a stream that fails after these deltas
        fake.reply_cited([("Paris", [(0, 0)])])  # then: text blocks citing (search result, text block) of the
                                            # request's search_result blocks, streamed with citations_delta or not
        ...                                 # afterwards: `fake.default(request)` answers
        fake.requests[0].body["messages"]   # every request, parsed
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from fakes.server import HTTPServerThread

# Tiny waits so the SDK retries at once. (The SDK ignores `retry-after: 0` and backs off ~0.5 s instead.)
RETRY_NOW = {"retry-after-ms": "1", "retry-after": "0"}


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # parsed JSON, or None

    @property
    def api_key(self) -> str | None:
        """The key as sent: `x-api-key`, or `Authorization: Bearer` (what anthropic 2.x sends for `api_key=`)."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        return token if scheme.lower() == "bearer" and token else None

    @property
    def user_text(self) -> str:
        """The text of the last user message (string content or text blocks)."""
        content = self.body["messages"][-1]["content"]
        if isinstance(content, str):
            return content
        return "".join(block.get("text", "") for block in content)

    @property
    def system_text(self) -> str:
        system = self.body.get("system") or ""
        if isinstance(system, str):
            return system
        return "".join(block.get("text", "") for block in system)


@dataclass(frozen=True)
class ScriptedResponse:
    status: int
    body: Any
    headers: dict[str, str]


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


class FakeAnthropicAPI(HTTPServerThread):
    def __init__(self, default_text: str = "Default fake answer [1].") -> None:
        super().__init__()
        self.requests: list[RecordedRequest] = []
        self._queue: deque[ScriptedResponse] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        # Answers when nothing is scripted: request -> reply text.
        self.default: Callable[[RecordedRequest], str] = lambda request: default_text
        # Requests matching this predicate get an error instead (after the scripted queue is empty).
        self._failing: tuple[Callable[[RecordedRequest], bool], ScriptedResponse] | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler_for(self)

    # Scripting: each call queues the response to the next unanswered request.

    def script(self, status: int = 200, body: Any = None, headers: dict[str, str] | None = None) -> None:
        with self._lock:
            self._queue.append(ScriptedResponse(status, body, dict(headers or {})))

    def reply_text(self, text: str) -> None:
        self.script(200, {"text": text})  # filled in as a full message when served

    def reply_stream(self, deltas: list[str]) -> None:
        """A reply whose text arrives in exactly these deltas when the request asks to stream (else all at once)."""
        self.script(200, {"deltas": list(deltas)})

    def reply_cited(self, blocks: list[tuple[str, list[tuple[int, int] | dict[str, Any]]]]) -> None:
        """A reply of text blocks with Anthropic Citations. Each citation is (search result index, text block index)
        into the request's own search_result blocks (its `source`, `title` and `cited_text` copied from them, as
        the API does), or a ready `search_result_location` dict (to send one pointing elsewhere)."""
        self.script(200, {"cited": [(text, list(citations)) for text, citations in blocks]})

    def stream_breaks(self, deltas: list[str], error_type: str = "overloaded_error") -> None:
        """A streamed reply that sends these deltas and then an SSE `error` event instead of finishing."""
        self.script(200, {"deltas": list(deltas), "error": error_type})

    def fail_requests(self, predicate: Callable[[RecordedRequest], bool], status: int = 529,
                      error_type: str = "overloaded_error") -> None:
        """From now on, unscripted requests matching `predicate` get this error (e.g. only the summary calls)."""
        self._failing = (predicate, ScriptedResponse(status, error_body(error_type, "failing on purpose"), RETRY_NOW))

    def rate_limited(self, message: str = "slow down") -> None:
        self.script(429, error_body("rate_limit_error", message), RETRY_NOW)

    def overloaded(self, message: str = "Overloaded") -> None:
        self.script(529, error_body("overloaded_error", message), RETRY_NOW)

    def unauthorized(self, message: str = "invalid x-api-key") -> None:
        self.script(401, error_body("authentication_error", message))

    # Serving.

    def message(self, request: RecordedRequest, text: str) -> dict[str, Any]:
        model = request.body.get("model", "claude-fake") if isinstance(request.body, dict) else "claude-fake"
        return {
            "id": f"msg_fake{next(self._ids):04d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": len(json.dumps(request.body)) // 4, "output_tokens": max(1, len(text) // 4)},
        }

    def cited_content(self, request: RecordedRequest, blocks: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        """Text blocks with `citations` of type `search_result_location`, shaped as in the response example of
        https://platform.claude.com/docs/en/build-with-claude/search-results ("Citation fields": type, source, title,
        cited_text, search_result_index, start_block_index, end_block_index)."""
        results = [block for message in request.body["messages"] if isinstance(message["content"], list)
                   for block in message["content"] if block.get("type") == "search_result"]
        content = []
        for text, citations in blocks:
            located = []
            for citation in citations:
                if isinstance(citation, dict):
                    located.append(citation)
                    continue
                index, block = citation
                result = results[index]
                located.append({
                    "type": "search_result_location", "source": result["source"], "title": result["title"],
                    "cited_text": result["content"][block]["text"], "search_result_index": index,
                    "start_block_index": block, "end_block_index": block + 1,
                })
            content.append({"type": "text", "text": text, **({"citations": located} if located else {})})
        return content

    def cited_stream_events(self, request: RecordedRequest, content: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """The streamed form, as in https://platform.claude.com/docs/en/build-with-claude/citations ("Streaming
        support"): each text block opens with `content_block_start` (`{"type": "text", "text": ""}`), its citations
        come as `content_block_delta` events whose delta is `{"type": "citations_delta", "citation": {...}}`, then its
        text as `text_delta`s, then `content_block_stop`."""
        message = self.message(request, "")
        message["content"], message["stop_reason"] = [], None
        message["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 1}
        events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": message})]
        for index, block in enumerate(content):
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {"type": "text", "text": ""}}))
            for citation in block.get("citations", []):
                events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "citations_delta", "citation": citation}}))
            for delta in _split_into_deltas(block["text"]):
                events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "text_delta", "text": delta}}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        text = "".join(block["text"] for block in content)
        return events + [
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                               "usage": {"output_tokens": max(1, len(text) // 4)}}),
            ("message_stop", {"type": "message_stop"}),
        ]

    def stream_events(
        self, request: RecordedRequest, deltas: list[str], error_type: str | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """The Messages API's server-sent events for a text reply, in the real order and shapes."""
        message = self.message(request, "")
        message["content"] = []
        message["stop_reason"] = None
        message["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 1}
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": message}),
            ("content_block_start",
             {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ("ping", {"type": "ping"}),
        ]
        events += [
            ("content_block_delta",
             {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": delta}})
            for delta in deltas
        ]
        if error_type is not None:
            return events + [("error", error_body(error_type, "stream interrupted"))]
        text = "".join(deltas)
        return events + [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                               "usage": {"output_tokens": max(1, len(text) // 4)}}),
            ("message_stop", {"type": "message_stop"}),
        ]

    def respond(self, request: RecordedRequest) -> ScriptedResponse:
        with self._lock:
            self.requests.append(request)
            scripted = self._queue.popleft() if self._queue else None
        if request.method != "POST" or request.path.split("?")[0] != "/v1/messages":
            return ScriptedResponse(404, error_body("not_found_error", f"no route {request.path}"), {})
        streaming = isinstance(request.body, dict) and request.body.get("stream") is True
        if scripted is None and self._failing is not None and self._failing[0](request):
            return self._failing[1]
        if scripted is None:
            scripted = ScriptedResponse(200, {"text": self.default(request)}, {})
        if scripted.status != 200 or not isinstance(scripted.body, dict):
            return scripted
        if "cited" in scripted.body:
            content = self.cited_content(request, scripted.body["cited"])
            if streaming:
                return ScriptedResponse(200, _SSE(self.cited_stream_events(request, content)), scripted.headers)
            message = self.message(request, "")
            message["content"] = content
            return ScriptedResponse(200, message, scripted.headers)
        if set(scripted.body) == {"text"}:
            deltas = _split_into_deltas(scripted.body["text"])
        elif "deltas" in scripted.body:
            deltas = scripted.body["deltas"]
        else:
            return scripted
        if streaming:
            return ScriptedResponse(200, _SSE(self.stream_events(request, deltas, scripted.body.get("error"))),
                                    scripted.headers)
        return ScriptedResponse(200, self.message(request, "".join(deltas)), scripted.headers)


@dataclass(frozen=True)
class _SSE:
    """A body to send as `text/event-stream`: (event name, data) pairs."""

    events: list[tuple[str, dict[str, Any]]]

    def encode(self) -> bytes:
        return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in self.events)


def _split_into_deltas(text: str) -> list[str]:
    """Word-sized pieces (each keeps its leading space), like the text deltas of a real stream."""
    import re

    return re.findall(r"\s*\S+", text) or [text]


def _handler_for(fake: FakeAnthropicAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects

        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            request = RecordedRequest(
                self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
            )
            response = fake.respond(request)
            streamed = isinstance(response.body, _SSE)
            payload = response.body.encode() if streamed else json.dumps(response.body).encode()
            self.send_response(response.status)
            self.send_header("content-type", "text/event-stream" if streamed else "application/json")
            self.send_header("content-length", str(len(payload)))
            self.send_header("request-id", f"req_fake{len(fake.requests):04d}")
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        do_POST = do_GET = _handle

        def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
            pass

    return Handler
