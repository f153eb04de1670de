"""The SQL behind the chat bots' own state: processed events, channel grants, the identity map, delivered answers
and feedback (tables from migration 0004).

Platform-neutral: keys are platform-qualified strings built by the adapters ("slack:T1:C2", "discord:42"), so the
Slack and Discord bots share these tables. `BotStateMethods` is mixed into `KnowledgeBase`, so adapters call
`kb.claim_event(...)` and never see SQL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from knowledge.access import InvalidPrincipal, check_principal

Rating = Literal["up", "down"]

@dataclass(frozen=True)
class ChannelGrant:
    channel_key: str
    principal: str
    granted_by: str | None
    granted_at: datetime


@dataclass(frozen=True)
class IdentityMapping:
    identity: str
    principal: str
    mapped_by: str | None
    mapped_at: datetime


@dataclass(frozen=True)
class DeliveredAnswer:
    id: int
    platform: str
    conversation_id: str
    asker: str
    turn_id: int | None
    question: str
    standalone_query: str
    chunk_ids: tuple[int, ...]
    mode: str
    abstained: bool


@dataclass(frozen=True)
class FeedbackRecord:
    id: int
    answer_id: int
    turn_id: int | None
    platform: str
    platform_user: str
    rating: Rating
    question: str
    standalone_query: str
    chunk_ids: tuple[int, ...]
    conversation_id: str
    created_at: datetime

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id, "answer_id": self.answer_id, "turn_id": self.turn_id, "platform": self.platform,
            "user": self.platform_user, "rating": self.rating, "question": self.question,
            "standalone_query": self.standalone_query, "chunk_ids": list(self.chunk_ids),
            "conversation_id": self.conversation_id, "created_at": self.created_at.isoformat(),
        }


class BotStateMethods:
    """KnowledgeBase methods over the bot tables (mixed into `knowledge.kb.KnowledgeBase`)."""

    engine: AsyncEngine

    # Exactly once.

    async def claim_event(self, key: str) -> bool:
        """Record a platform event before any work starts. True the first time the key is seen, False for a retry,
        a duplicate delivery, or a key another replica already claimed (the INSERT is atomic across processes)."""
        async with self.engine.begin() as conn:
            inserted = await conn.execute(
                text("INSERT INTO bot_events (key) VALUES (:k) ON CONFLICT (key) DO NOTHING RETURNING key"),
                {"k": key},
            )
            return inserted.first() is not None

    async def forget_events_older_than(self, days: int = 7) -> int:
        """Retries stop after minutes; keys older than this only take space."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                text("DELETE FROM bot_events WHERE claimed_at < now() - make_interval(days => :d)"), {"d": days}
            )
            return result.rowcount or 0

    # Channel grants.

    async def channel_principals(self, channel_key: str) -> list[str]:
        """What a shared channel's answers may draw on besides `everyone` documents."""
        return [grant.principal for grant in await self.channel_grants(channel_key)]

    async def channel_grants(self, channel_key: str) -> list[ChannelGrant]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT channel_key, principal, granted_by, granted_at FROM bot_channel_grants "
                    "WHERE channel_key = :c ORDER BY principal"
                ),
                {"c": channel_key},
            )
            return [ChannelGrant(r.channel_key, r.principal, r.granted_by, r.granted_at) for r in rows]

    async def grant_channel(self, channel_key: str, principal: str, granted_by: str | None = None) -> bool:
        """Let everyone in the channel see what `principal` may see. False if it was already granted."""
        principal = check_principal(principal)
        async with self.engine.begin() as conn:
            inserted = await conn.execute(
                text(
                    "INSERT INTO bot_channel_grants (channel_key, principal, granted_by) VALUES (:c, :p, :by) "
                    "ON CONFLICT DO NOTHING RETURNING principal"
                ),
                {"c": channel_key, "p": principal, "by": granted_by},
            )
            return inserted.first() is not None

    async def revoke_channel(self, channel_key: str, principal: str) -> bool:
        """False if there was no such grant."""
        async with self.engine.begin() as conn:
            deleted = await conn.execute(
                text("DELETE FROM bot_channel_grants WHERE channel_key = :c AND principal = :p RETURNING principal"),
                {"c": channel_key, "p": principal.strip()},
            )
            return deleted.first() is not None

    # Identity map.

    async def identity_principals(self, identity: str) -> list[str]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT principal FROM bot_identities WHERE identity = :i ORDER BY principal"), {"i": identity}
            )
            return list(rows.scalars())

    async def map_identity(self, identity: str, principal: str, mapped_by: str | None = None) -> bool:
        """`identity` ("discord:42", "slack:U1") asks as `principal` too. False if that mapping existed."""
        principal = check_principal(principal)
        if not re.match(r"^[a-z][a-z0-9_-]*:\S+$", identity.strip()):
            raise InvalidPrincipal(f"{identity!r} is not a platform identity: use slack:<user id> or discord:<user id>")
        async with self.engine.begin() as conn:
            inserted = await conn.execute(
                text(
                    "INSERT INTO bot_identities (identity, principal, mapped_by) VALUES (:i, :p, :by) "
                    "ON CONFLICT DO NOTHING RETURNING principal"
                ),
                {"i": identity.strip(), "p": principal, "by": mapped_by},
            )
            return inserted.first() is not None

    async def unmap_identity(self, identity: str, principal: str | None = None) -> int:
        """Remove one mapping, or all of an identity's mappings. Returns how many went."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                text(
                    "DELETE FROM bot_identities WHERE identity = :i "
                    "AND (CAST(:p AS text) IS NULL OR principal = :p)"
                ),
                {"i": identity.strip(), "p": principal.strip() if principal else None},
            )
            return result.rowcount or 0

    async def identity_mappings(self, identity: str | None = None) -> list[IdentityMapping]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT identity, principal, mapped_by, mapped_at FROM bot_identities "
                    "WHERE CAST(:i AS text) IS NULL OR identity = :i ORDER BY identity, principal"
                ),
                {"i": identity},
            )
            return [IdentityMapping(r.identity, r.principal, r.mapped_by, r.mapped_at) for r in rows]

    # Delivered answers and feedback.

    async def record_delivered_answer(
        self, *, platform: str, conversation_id: str, asker: str, turn_id: int | None, question: str,
        standalone_query: str, chunk_ids: Sequence[int], mode: str, abstained: bool,
    ) -> int:
        """Remember an answer a bot posted; its id goes into the feedback buttons."""
        async with self.engine.begin() as conn:
            return (
                await conn.execute(
                    text(
                        "INSERT INTO bot_answers (platform, conversation_id, asker, turn_id, question, "
                        "standalone_query, chunk_ids, mode, abstained) "
                        "VALUES (:platform, :conversation, :asker, :turn, :question, :standalone, "
                        "CAST(:chunks AS bigint[]), :mode, :abstained) RETURNING id"
                    ),
                    {"platform": platform, "conversation": conversation_id, "asker": asker, "turn": turn_id,
                     "question": question, "standalone": standalone_query, "chunks": list(chunk_ids),
                     "mode": mode, "abstained": abstained},
                )
            ).scalar_one()

    async def delivered_answer(self, answer_id: int) -> DeliveredAnswer | None:
        async with self.engine.connect() as conn:
            r = (
                await conn.execute(text("SELECT * FROM bot_answers WHERE id = :id"), {"id": answer_id})
            ).first()
        if r is None:
            return None
        return DeliveredAnswer(r.id, r.platform, r.conversation_id, r.asker, r.turn_id, r.question,
                               r.standalone_query, tuple(r.chunk_ids), r.mode, r.abstained)

    async def bot_answered_in(self, conversation_id: str) -> bool:
        """Has a bot answered in this conversation (a thread, a DM)? Thread replies there are follow-ups."""
        async with self.engine.connect() as conn:
            return bool(
                (
                    await conn.execute(
                        text("SELECT EXISTS (SELECT 1 FROM bot_answers WHERE conversation_id = :c)"),
                        {"c": conversation_id},
                    )
                ).scalar()
            )

    async def record_feedback(self, answer_id: int, platform_user: str, rating: Rating) -> FeedbackRecord | None:
        """Store (or change) one user's rating of one answer. None if the answer is unknown."""
        if rating not in ("up", "down"):
            raise ValueError(f"rating must be 'up' or 'down', not {rating!r}")
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        """
                        INSERT INTO bot_feedback (answer_id, platform_user, rating)
                        SELECT id, :user, :rating FROM bot_answers WHERE id = :answer
                        ON CONFLICT (answer_id, platform_user)
                            DO UPDATE SET rating = EXCLUDED.rating, created_at = now()
                        RETURNING id
                        """
                    ),
                    {"answer": answer_id, "user": platform_user, "rating": rating},
                )
            ).first()
        if row is None:
            return None
        found = await self.recent_feedback(feedback_id=row.id)
        return found[0] if found else None

    async def recent_feedback(self, limit: int = 50, *, feedback_id: int | None = None) -> list[FeedbackRecord]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    """
                    SELECT f.id, f.answer_id, a.turn_id, a.platform, f.platform_user, f.rating, a.question,
                           a.standalone_query, a.chunk_ids, a.conversation_id, f.created_at
                    FROM bot_feedback f JOIN bot_answers a ON a.id = f.answer_id
                    WHERE CAST(:fid AS bigint) IS NULL OR f.id = :fid
                    ORDER BY f.created_at DESC, f.id DESC LIMIT :limit
                    """
                ),
                {"fid": feedback_id, "limit": limit},
            )
            return [
                FeedbackRecord(r.id, r.answer_id, r.turn_id, r.platform, r.platform_user, r.rating, r.question,
                               r.standalone_query, tuple(r.chunk_ids), r.conversation_id, r.created_at)
                for r in rows
            ]
