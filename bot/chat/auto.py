"""Help-channel auto-answers: which messages are questions, and which outcomes may be posted unasked.

A channel with `/kb channel auto on` gets answers to its top-level questions without a mention. Posting unasked
is only worth it when the bot has an answer: a decline ("I couldn't find this") or an uncertain answer posted to
someone who never asked the bot is noise, so those stay silent (they still count as gaps in `ragbot insights`).
"""

from __future__ import annotations

import re
from typing import Any

# Words a question starts with (English). A message ending in "?" is a question whatever its first word.
QUESTION_WORDS = frozenset(
    "how what where when why who whom whose which can could is are was were do does did should shall will would "
    "may might must has have any anyone anybody is there".split()
)
MIN_WORDS = 3  # "thanks?" or "lunch?" is chatter, not a question for the documents
_MENTION = re.compile(r"<[@#!][^>]*>")


def looks_like_question(text: str) -> bool:
    """A message worth answering unasked: at least MIN_WORDS words, and a question mark or a question word first.
    Mentions, channel links and emoji codes do not count as words."""
    cleaned = _MENTION.sub(" ", text or "")
    cleaned = re.sub(r":[a-z0-9_+-]+:", " ", cleaned)
    words = re.findall(r"[A-Za-z0-9][\w'’-]*", cleaned)
    if len(words) < MIN_WORDS:
        return False
    if "?" in cleaned:
        return True
    return words[0].lower() in QUESTION_WORDS


def is_answer(answer: Any) -> bool:
    """True when the answer layer answered (not declined, not merely uncertain). `outcome` (answer | uncertain |
    decline) is read when the answer layer provides it; until then `abstained` decides."""
    if getattr(answer, "abstained", False):
        return False
    outcome = getattr(answer, "outcome", None)
    return outcome in (None, "answer")


def outcome_of(answer: Any) -> str:
    """answer | uncertain | decline, for the gaps report."""
    outcome = getattr(answer, "outcome", None)
    if isinstance(outcome, str) and outcome:
        return outcome
    return "decline" if getattr(answer, "abstained", False) else "answer"
