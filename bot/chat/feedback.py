"""Answers remembered for feedback, and feedback clicks, for every platform.

An adapter calls `remember_answer` after posting an answer and puts the returned id into its feedback buttons; a
click calls `record_click`. The acknowledgement text is the same whatever was rated, so it can never reveal a
document to someone who clicks on an answer they could not have asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.chat.auto import outcome_of
from bot.chat.state import RATINGS, BotState, FeedbackRecord, Rating

if TYPE_CHECKING:
    from knowledge import Answer

THANKS = {
    "up": "Thanks for the feedback: glad it helped.",
    "down": "Thanks for the feedback: it will help improve answers.",
}


async def remember_answer(
    state: BotState, *, platform: str, conversation_id: str, asker: str, question: str, answer: Answer,
    channel_key: str | None = None, private: bool = False, posted: bool = True,
) -> int:
    """Store what a later feedback row (and the gaps report) needs; the id goes into the answer's feedback
    buttons. `posted=False`: a help-channel auto-answer kept back because it was not an answer."""
    return await state.record_delivered_answer(
        platform=platform, conversation_id=conversation_id, asker=asker,
        turn_id=getattr(answer, "id", None),
        question=question,
        standalone_query=getattr(answer, "standalone_query", None) or question,
        chunk_ids=[hit.chunk_id for hit in answer.chunks_used],
        mode=answer.mode, abstained=answer.abstained,
        outcome=outcome_of(answer), channel_key=channel_key, private=private, posted=posted,
    )


@dataclass(frozen=True)
class FeedbackAck:
    stored: FeedbackRecord | None
    text: str


def parse_rating(value: str) -> Rating | None:
    """Button values look like "up:<answer id>" / "down:<answer id>"; the rating part is all that matters here."""
    rating = value.split(":", 1)[0].strip().lower()
    return rating if rating in RATINGS else None


def button_value(rating: Rating, answer_id: int) -> str:
    return f"{rating}:{answer_id}"


def parse_button_value(value: str) -> tuple[Rating, int] | None:
    rating = parse_rating(value)
    _, _, number = value.partition(":")
    if rating is None or not number.strip().isdigit():
        return None
    return rating, int(number)


async def record_click(state: BotState, answer_id: int, platform_user: str, rating: Rating) -> FeedbackAck:
    stored = await state.record_feedback(answer_id, platform_user, rating)
    if stored is None:
        return FeedbackAck(None, "That answer is too old to rate, sorry.")
    return FeedbackAck(stored, THANKS[rating])
