"""Answers from Anthropic's Claude through the official async SDK (retries, timeouts and backoff are the SDK's).

With `on_text`, the reply is streamed (`messages.stream`, server-sent events) and each text delta is handed over
as it arrives, so a chat surface can show the answer while Claude writes it.

`generate_cited` uses Anthropic's Citations: the retrieved passages go in as `search_result` content blocks with
`citations: {"enabled": true}` (https://platform.claude.com/docs/en/build-with-claude/search-results), and every
cited claim comes back as a text block carrying `search_result_location` citations: which result, which of its
text blocks, and the exact `cited_text`. Streamed, they arrive as `citations_delta` events inside
`content_block_delta` (https://platform.claude.com/docs/en/build-with-claude/citations, "Streaming support").
A citation that does not point into the sources sent (index out of range, another source, text not in it) is
dropped, so an answer never shows a quote its sources do not hold.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from knowledge.errors import GenerationError
from knowledge.settings import KnowledgeSettings

if TYPE_CHECKING:
    from anthropic.types import MessageParam, SearchResultBlockParam, TextBlockParam

logger = logging.getLogger(__name__)

TextCallback = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class SearchSource:
    """One numbered source as a `search_result` block: its passages are the block's text blocks."""

    n: int
    source: str  # the document's URL or path (what the reader can open)
    title: str
    passages: tuple[str, ...]

    def block(self) -> SearchResultBlockParam:
        return {
            "type": "search_result", "source": self.source, "title": self.title or self.source,
            "content": [{"type": "text", "text": text} for text in self.passages],
            "citations": {"enabled": True},
        }


@dataclass(frozen=True)
class Span:
    """A passage Claude cited for a claim: the source's number and the exact text."""

    n: int
    text: str


@dataclass
class CitedReply:
    text: str  # the reply, with a [n] marker after each block that cites source n
    spans: list[Span] = field(default_factory=list)
    rejected: int = 0  # citations dropped because they pointed outside the sources


def _squash(text: str) -> str:
    return " ".join(text.split())


def valid_span(citation: Any, sources: Sequence[SearchSource]) -> Span | None:
    """The citation as a span of one of `sources`, or None when it points anywhere else."""
    if getattr(citation, "type", None) != "search_result_location":
        return None
    index = getattr(citation, "search_result_index", -1)
    if not isinstance(index, int) or not 0 <= index < len(sources):
        return None
    source = sources[index]
    start, end = getattr(citation, "start_block_index", -1), getattr(citation, "end_block_index", -1)
    if getattr(citation, "source", None) != source.source or not (0 <= start < end <= len(source.passages)):
        return None
    cited = _squash(getattr(citation, "cited_text", "") or "")
    if not cited or cited not in _squash(" ".join(source.passages[start:end])):
        return None
    return Span(source.n, cited)


class _CitedBlocks:
    """Assembles a reply block by block: text, then the markers of the sources that block cites."""

    def __init__(self, sources: Sequence[SearchSource]) -> None:
        self.sources = sources
        self.parts: list[str] = []
        self.spans: list[Span] = []
        self.rejected = 0
        self.block_numbers: list[int] = []

    def cite(self, citation: Any) -> None:
        span = valid_span(citation, self.sources)
        if span is None:
            self.rejected += 1
            logger.warning("dropped a citation that points outside the sources sent")
            return
        if span not in self.spans:
            self.spans.append(span)
        if span.n not in self.block_numbers:
            self.block_numbers.append(span.n)

    def end_block(self) -> str:
        """The markers to put after the block just finished ("" when it cites nothing)."""
        markers = "".join(f"[{n}]" for n in self.block_numbers)
        self.block_numbers = []
        return markers

    def reply(self) -> CitedReply:
        text = re.sub(r"[ \t]+\n", "\n", "".join(self.parts)).strip()
        return CitedReply(text, self.spans, self.rejected)


class AnthropicGenerator:
    mode = "llm"

    def __init__(self, settings: KnowledgeSettings) -> None:
        from anthropic import AsyncAnthropic  # lazy for start-up speed: the SDK, only with an API key

        if settings.anthropic_api_key is None:
            raise GenerationError("ANTHROPIC_API_KEY is not set")
        self.model = settings.anthropic_model
        self.max_tokens = settings.answer_max_tokens
        self.citations = settings.anthropic_citations  # answers through generate_cited (search_result blocks)
        self.client = AsyncAnthropic(
            api_key=settings.anthropic_api_key.get_secret_value(),
            base_url=settings.anthropic_base_url,
            timeout=settings.anthropic_timeout_seconds,
            max_retries=settings.anthropic_max_retries,
        )

    async def generate(
        self, system: str, user: str, *, model: str | None = None, max_tokens: int | None = None,
        on_text: TextCallback | None = None,
    ) -> str:
        """One user message in, the reply's text out. `model`/`max_tokens` override the answer settings (the
        follow-up rewrite and the summary use a smaller model and budget); `on_text` streams the reply."""
        model = model or self.model
        limit = max_tokens or self.max_tokens
        # The system prompt never changes, so it is marked for prompt caching.
        system_blocks: list[TextBlockParam] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
        messages: list[MessageParam] = [{"role": "user", "content": user}]
        replies: list[str] = []

        async def run() -> None:
            if on_text is None:
                message = await self.client.messages.create(
                    model=model, max_tokens=limit, system=system_blocks, messages=messages)
            else:
                async with self.client.messages.stream(
                        model=model, max_tokens=limit, system=system_blocks, messages=messages) as stream:
                    async for delta in stream.text_stream:
                        await on_text(delta)
                    message = await stream.get_final_message()
            replies.append("".join(block.text for block in message.content if block.type == "text").strip())

        await self._call(run, model)
        return replies[0]

    async def generate_cited(
        self, system: str, sources: Sequence[SearchSource], user: str, *, on_text: TextCallback | None = None,
    ) -> CitedReply:
        """The answer with Claude's own citations: `sources` as search_result blocks, then `user` (the conversation
        and the question) as a text block. With `on_text`, text deltas stream as they arrive, and each block's
        markers follow its text, so what was streamed equals the returned text."""
        system_blocks: list[TextBlockParam] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
        content: list[SearchResultBlockParam | TextBlockParam] = [*(s.block() for s in sources),
                                                                  {"type": "text", "text": user}]
        messages: list[MessageParam] = [{"role": "user", "content": content}]
        blocks = _CitedBlocks(sources)

        async def emit(text: str) -> None:
            if text:
                blocks.parts.append(text)
                if on_text is not None:
                    await on_text(text)

        async def run() -> None:
            if on_text is None:
                message = await self.client.messages.create(
                    model=self.model, max_tokens=self.max_tokens, system=system_blocks, messages=messages)
                for block in message.content:
                    if block.type != "text":
                        continue
                    await emit(block.text)
                    for citation in getattr(block, "citations", None) or []:
                        blocks.cite(citation)
                    await emit(blocks.end_block())
                return
            async with self.client.messages.stream(
                    model=self.model, max_tokens=self.max_tokens, system=system_blocks, messages=messages) as stream:
                async for event in stream:
                    if event.type == "text":
                        await emit(event.text)
                    elif event.type == "citation":
                        blocks.cite(event.citation)
                    elif event.type == "content_block_stop":
                        await emit(blocks.end_block())

        await self._call(run, self.model)
        return blocks.reply()

    async def _call(self, run: Callable[[], Awaitable[None]], model: str) -> None:
        """Run one request (`run`), turning the SDK's errors into GenerationError naming the setting to fix."""
        import anthropic  # lazy, as in __init__

        try:
            await run()
        except anthropic.AuthenticationError as exc:
            raise GenerationError("Anthropic rejected the API key: check ANTHROPIC_API_KEY") from exc
        except anthropic.NotFoundError as exc:
            setting = "ANTHROPIC_MODEL" if model == self.model else "ANTHROPIC_REWRITE_MODEL"
            raise GenerationError(f"Anthropic does not know model {model!r}: check {setting}") from exc
        except anthropic.APIStatusError as exc:
            raise GenerationError(f"Anthropic API error {exc.status_code} after retries: {_error_type(exc)}") from exc
        except anthropic.APIConnectionError as exc:
            raise GenerationError(
                "could not reach the Anthropic API (network or ANTHROPIC_BASE_URL); answering with excerpts"
            ) from exc

    async def close(self) -> None:
        await self.client.close()


def _error_type(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("type", "unknown"))
    return type(exc).__name__
