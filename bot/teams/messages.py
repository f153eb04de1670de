"""Which Teams message carries which answer (table `teams_answer_messages`, migration 0022_teams).

Teams' 👍/👎 buttons report only the rated message's id, so the answer id a feedback row needs is stored here when
the answer is posted and read back when a click arrives. Kept with the Teams adapter: no other platform needs it
(Slack and Discord put the answer id into their buttons' values).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


class AnswerMessages:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def remember(self, conversation_id: str, message_id: str, answer_id: int) -> None:
        """The message `message_id` (in the conversation `conversation_id`, without a thread part) shows answer
        `answer_id`; a message replaced by another answer (a Share, a resume) points at the newest."""
        async with self.engine.begin() as conn:
            await conn.execute(
                text("""INSERT INTO teams_answer_messages (conversation_id, message_id, answer_id)
                        VALUES (:c, :m, :a)
                        ON CONFLICT (conversation_id, message_id) DO UPDATE SET answer_id = EXCLUDED.answer_id"""),
                {"c": conversation_id, "m": message_id, "a": answer_id},
            )

    async def answer_of(self, conversation_id: str, message_id: str) -> int | None:
        """The answer a message shows; None for a message that is not an answer (or one deleted by retention)."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(
                text("SELECT answer_id FROM teams_answer_messages WHERE conversation_id = :c AND message_id = :m"),
                {"c": conversation_id, "m": message_id},
            )).first()
        return int(row.answer_id) if row is not None else None
