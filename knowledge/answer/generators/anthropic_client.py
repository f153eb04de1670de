"""Answers from Anthropic's Claude through the official async SDK (retries, timeouts and backoff are the SDK's).

With `on_text`, the reply is streamed (`messages.stream`, server-sent events) and each text delta is handed over
as it arrives, so a chat surface can show the answer while Claude writes it.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from knowledge.errors import GenerationError
from knowledge.settings import KnowledgeSettings

logger = logging.getLogger(__name__)

TextCallback = Callable[[str], Awaitable[None]]


class AnthropicGenerator:
    mode = "llm"

    def __init__(self, settings: KnowledgeSettings) -> None:
        from anthropic import AsyncAnthropic

        if settings.anthropic_api_key is None:
            raise GenerationError("ANTHROPIC_API_KEY is not set")
        self.model = settings.anthropic_model
        self.max_tokens = settings.answer_max_tokens
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
        import anthropic

        model = model or self.model
        request = dict(
            model=model,
            max_tokens=max_tokens or self.max_tokens,
            # The system prompt never changes, so it is marked for prompt caching.
            system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": user}],
        )
        try:
            if on_text is None:
                message = await self.client.messages.create(**request)  # type: ignore[arg-type]
            else:
                async with self.client.messages.stream(**request) as stream:  # type: ignore[arg-type]
                    async for delta in stream.text_stream:
                        await on_text(delta)
                    message = await stream.get_final_message()
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
        return "".join(block.text for block in message.content if getattr(block, "type", "") == "text").strip()

    async def close(self) -> None:
        await self.client.close()


def _error_type(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("type", "unknown"))
    return type(exc).__name__
