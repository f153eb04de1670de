"""Which earlier messages of a thread count as the conversation, decided once for every platform (issue 42: each
adapter had its own rule, Slack keeping the last 30 messages and dropping other bots' posts, Discord the last 20 and
keeping them).

When the bot is mentioned in a thread it has not answered in yet, the thread's earlier messages (which it never
received) become the question's history. The adapter only fetches them, as a neutral list of `ThreadMessage`
(author id, whether a bot wrote it, the text without platform markup, a timestamp); `thread_history` applies the
policy:
- only messages written BEFORE the question count (the question itself, and anything posted after it, never);
- the bot's own messages are its earlier answers (`assistant` turns); people's messages are `user` turns; other
  bots' messages (notifications, integrations) are noise and are dropped; empty messages too;
- only the last `PRIOR_MESSAGES_LIMIT` messages, and none older than `HISTORY_MAX_AGE_SECONDS` before the question
  (a thread revived after months should not drag its old talk into the answer).
A thread the bot already answered in has the core's own memory instead (`ChatFlow.history`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from knowledge import ChatMessage

PRIOR_MESSAGES_LIMIT = 30  # the earlier messages of a thread read as history, newest kept
HISTORY_MAX_AGE_SECONDS = 30 * 24 * 3600.0  # older messages of a thread are not part of the conversation


@dataclass(frozen=True)
class ThreadMessage:
    """One earlier message of a thread as the adapter fetched it: who wrote it (the platform's user id), whether a
    bot did, its text with the platform's markup already removed (the bot's mention, escaping), and when (seconds
    since the epoch)."""

    author: str
    is_bot: bool
    text: str
    at: float
    id: str = ""  # the platform's message id, when it has one: the question is recognised by it as well


def thread_history(messages: Iterable[ThreadMessage], *, me: str | None, before: float,
                   question_id: str | None = None, limit: int = PRIOR_MESSAGES_LIMIT,
                   max_age: float = HISTORY_MAX_AGE_SECONDS) -> list[ChatMessage] | None:
    """The conversation so far, oldest first, from a thread's earlier messages (given oldest first; they are
    ordered by time, equal times keeping that order): see the module docstring. `me`: the bot's own author id;
    `before`: the question's timestamp; `question_id`: the question's message id. None when nothing counts."""
    kept: list[ThreadMessage] = []
    for message in messages:
        text = message.text.strip()
        if not text or message.at > before or before - message.at > max_age:
            continue
        if question_id is not None and message.id == question_id:
            continue
        if message.is_bot and message.author != me:
            continue  # another bot's post
        kept.append(message)
    kept.sort(key=lambda m: m.at)
    turns = [ChatMessage("assistant" if m.author == me else "user", m.text.strip()) for m in kept]
    return turns[-limit:] or None
