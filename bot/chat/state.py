"""The SQL behind the chat bots' own state: processed events, channel grants, the identity map, delivered answers
and feedback (tables from migration 0004).

Platform-neutral: keys are platform-qualified strings built by the adapters ("slack:T1:C2", "discord:42"), so the
Slack and Discord bots share these tables. `BotState(engine)` is its own object over the knowledge base's engine
(`bot.context.BotContext.state`, `ChatFlow.state`), so adapters call `state.claim_event(...)` and never see SQL, and
`KnowledgeBase` knows nothing of the bot. The access resolver's one read of the identity map is
`knowledge.storage.identities` (knowledge needs it to resolve a chat identity; the bot writes the map).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import knowledge.storage.identities as identities
from knowledge import InvalidPrincipal, check_principal, identity_kinds

if TYPE_CHECKING:
    from knowledge import KnowledgeBase

Rating = Literal["up", "down"]
RATINGS: tuple[Rating, ...] = ("up", "down")

@dataclass(frozen=True)
class LeaseClaim:
    """A question this process now holds: freshly claimed, or taken over from a holder whose lease ran out
    (`resumed`), with the placeholder that holder posted, if any, to answer in."""

    key: str
    holder: str
    resumed: bool = False
    placeholder: str | None = None
    attempts: int = 1


@dataclass(frozen=True)
class PendingQuestion:
    """An undelivered claim a sweeper took over: everything needed to answer it without the original event."""

    claim: LeaseClaim
    platform: str
    question: str
    conversation_id: str
    asker: str
    target: dict[str, Any]


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
class AuditEntry:
    """One change of who may see what (or a refused attempt): the `audit_log` table (migration 0016)."""

    at: datetime
    actor: str  # a chat identity ("slack:U1"), or "cli"
    actor_role: str  # "operator" (the CLI, ADMIN_USER_IDS) or "platform-admin"
    action: str  # "users map", "users unmap", "channel-access add", "channel-access remove"
    subject: str  # the identity mapped, or the channel key
    principal: str | None
    outcome: str  # "done", "unchanged", "refused"
    detail: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"at": self.at.isoformat(), "actor": self.actor, "actor_role": self.actor_role, "action": self.action,
                "subject": self.subject, "principal": self.principal, "outcome": self.outcome, "detail": self.detail}


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


class BotState:
    """The bot tables, over the knowledge base's engine: `BotState(kb.engine)`. A process that answers questions
    passes `renewals=kb.lease_engine` too: the pool that keeps its answer leases alive (recorded, renewed, marked
    delivered), so that a heartbeat never queues behind the answers' own work for a connection of `engine` (see
    `KnowledgeBase.lease_engine`)."""

    def __init__(self, engine: AsyncEngine, renewals: AsyncEngine | None = None) -> None:
        self.engine = engine
        self.renewals = renewals if renewals is not None else engine

    @classmethod
    def answering(cls, kb: KnowledgeBase) -> BotState:
        """The state of a process that answers questions: `kb.engine`, leases kept alive on `kb.lease_engine`."""
        return cls(kb.engine, kb.lease_engine)

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

    # Leases: a claimed question is answered at least once within the lease bound, delivered at most once.

    async def claim_lease(self, keys: Sequence[str], holder: str, lease_seconds: float) -> LeaseClaim | None:
        """Claim a question for `holder` for `lease_seconds`. The last key is the lease (the question's own id);
        the others are aliases recorded as plain claims (an event id). Returns None for a duplicate: the lease is
        live, or its answer was delivered, or it is a claim from before leases (never taken over). A claim whose
        holder let the lease run out undelivered is taken over: atomically, so of two retries or replicas exactly
        one gets it (ON CONFLICT DO UPDATE locks the row and re-checks the WHERE on its latest version)."""
        if not keys:
            return None
        *aliases, lease_key = keys
        # One statement (the aliases in a CTE), so one transaction on the renewals' pool (autocommit): a claim is
        # on every question's path to its answer, and two statements in a transaction cost three more round trips.
        async with self.renewals.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        """
                        WITH aliases AS (
                            INSERT INTO bot_events (key) SELECT unnest(CAST(:aliases AS text[])) ON CONFLICT DO NOTHING
                        )
                        INSERT INTO bot_events AS e (key, holder, lease_until, attempts)
                        VALUES (:k, :h, now() + make_interval(secs => :s), 1)
                        ON CONFLICT (key) DO UPDATE
                            SET holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until,
                                attempts = e.attempts + 1
                            WHERE e.delivered_at IS NULL AND e.lease_until < now()
                        RETURNING (xmax = 0) AS fresh, placeholder, attempts
                        """
                    ),
                    {"aliases": list(aliases), "k": lease_key, "h": holder, "s": lease_seconds},
                )
            ).first()
        if row is None:
            return None
        return LeaseClaim(lease_key, holder, resumed=not row.fresh, placeholder=row.placeholder, attempts=row.attempts)

    async def record_lease_question(
        self, claim: LeaseClaim, *, platform: str, question: str, conversation_id: str, asker: str,
        target: Mapping[str, Any], lease_seconds: float,
    ) -> bool:
        """Store what was asked and where to answer, so a sweeper can answer without the original event, and renew
        the lease for `lease_seconds` from now: the work between the claim and this (the channel's mode, the
        audience) may have used up much of it, and the heartbeat's first renewal comes a round later. False if the
        claim is no longer this holder's. On the renewals' pool, as the renewals it stands for."""
        async with self.renewals.begin() as conn:
            return (
                await conn.execute(
                    text(
                        "UPDATE bot_events SET platform = :p, question = :q, conversation_id = :c, asker = :a, "
                        "target = CAST(:t AS jsonb), lease_until = now() + make_interval(secs => :s) "
                        "WHERE key = :k AND holder = :h AND delivered_at IS NULL RETURNING key"
                    ),
                    {"k": claim.key, "h": claim.holder, "p": platform, "q": question, "c": conversation_id,
                     "a": asker, "t": json.dumps(dict(target)), "s": lease_seconds},
                )
            ).first() is not None

    async def record_lease_placeholder(self, claim: LeaseClaim, placeholder: str) -> bool:
        """The placeholder message (Slack ts, Discord message id) the answer will replace: a takeover edits it."""
        async with self.engine.begin() as conn:
            return (
                await conn.execute(
                    text("UPDATE bot_events SET placeholder = :ref WHERE key = :k AND holder = :h "
                         "AND delivered_at IS NULL RETURNING key"),
                    {"k": claim.key, "h": claim.holder, "ref": placeholder},
                )
            ).first() is not None

    async def renew_lease(self, claim: LeaseClaim, lease_seconds: float) -> bool:
        """Extend a lease still held and undelivered. False: another holder took it over (or it was delivered)."""
        async with self.renewals.begin() as conn:
            return (
                await conn.execute(
                    text("UPDATE bot_events SET lease_until = now() + make_interval(secs => :s) "
                         "WHERE key = :k AND holder = :h AND delivered_at IS NULL RETURNING key"),
                    {"k": claim.key, "h": claim.holder, "s": lease_seconds},
                )
            ).first() is not None

    async def mark_lease_delivered(self, claim: LeaseClaim) -> bool:
        """The answer (or an apology) reached the platform: never answered again. The stored question and target
        are dropped (only undelivered questions need them). On the renewals' pool: an answer posted but not yet
        marked, waiting for a connection, could otherwise outlive its lease and be answered again."""
        async with self.renewals.begin() as conn:
            return (
                await conn.execute(
                    text("UPDATE bot_events SET delivered_at = now(), question = NULL, target = NULL "
                         "WHERE key = :k AND holder = :h AND delivered_at IS NULL RETURNING key"),
                    {"k": claim.key, "h": claim.holder},
                )
            ).first() is not None

    async def take_expired_lease(
        self, platform: str, holder: str, lease_seconds: float, *, max_attempts: int, max_age_seconds: float,
    ) -> PendingQuestion | None:
        """Take over the oldest undelivered question of `platform` whose lease ran out, claimed within
        `max_age_seconds` and tried fewer than `max_attempts` times. One atomic UPDATE (SKIP LOCKED, and the
        expiry re-checked): two sweepers never take the same question."""
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        """
                        UPDATE bot_events AS e
                        SET holder = :h, lease_until = now() + make_interval(secs => :s), attempts = e.attempts + 1
                        WHERE e.key = (
                            SELECT key FROM bot_events
                            WHERE platform = :p AND question IS NOT NULL AND delivered_at IS NULL
                              AND lease_until < now() AND attempts < :max_attempts
                              AND claimed_at > now() - make_interval(secs => :max_age)
                            ORDER BY claimed_at LIMIT 1 FOR UPDATE SKIP LOCKED
                        ) AND e.delivered_at IS NULL AND e.lease_until < now()
                        RETURNING e.key, e.platform, e.question, e.conversation_id, e.asker, e.target,
                                  e.placeholder, e.attempts
                        """
                    ),
                    {"p": platform, "h": holder, "s": lease_seconds, "max_attempts": max_attempts,
                     "max_age": max_age_seconds},
                )
            ).first()
        if row is None:
            return None
        target = row.target if isinstance(row.target, dict) else json.loads(row.target or "{}")
        return PendingQuestion(LeaseClaim(row.key, holder, True, row.placeholder, row.attempts), row.platform,
                               row.question, row.conversation_id, row.asker, target)

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
        """The one read of the map, shared with the knowledge base's access resolver."""
        return await identities.identity_principals(self.engine, identity)

    async def map_identity(self, identity: str, principal: str, mapped_by: str | None = None) -> bool:
        """`identity` ("discord:42", "slack:U1") asks as `principal` too. False if that mapping existed."""
        principal = check_principal(principal)
        if not re.match(r"^[a-z][a-z0-9_-]*:\S+$", identity.strip()):
            kinds = " or ".join(f"{kind}:<user id>" for kind in identity_kinds()) or "<platform>:<user id>"
            raise InvalidPrincipal(f"{identity!r} is not a platform identity: use {kinds}")
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

    # The audit log of access changes (issue 38).

    async def record_audit(self, *, actor: str, actor_role: str, action: str, subject: str, principal: str | None,
                           outcome: str, detail: str | None = None) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO audit_log (actor, actor_role, action, subject, principal, outcome, detail) "
                     "VALUES (:actor, :role, :action, :subject, :principal, :outcome, :detail)"),
                {"actor": actor, "role": actor_role, "action": action, "subject": subject, "principal": principal,
                 "outcome": outcome, "detail": detail},
            )

    async def audit_entries(self, limit: int = 100, since: datetime | None = None) -> list[AuditEntry]:
        """The newest entries first."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT at, actor, actor_role, action, subject, principal, outcome, detail FROM audit_log "
                     "WHERE CAST(:since AS timestamptz) IS NULL OR at >= :since ORDER BY id DESC LIMIT :n"),
                {"since": since, "n": limit},
            )
            return [AuditEntry(r.at, r.actor, r.actor_role, r.action, r.subject, r.principal, r.outcome, r.detail)
                    for r in rows]

    # Delivered answers and feedback.

    async def record_delivered_answer(
        self, *, platform: str, conversation_id: str, asker: str, turn_id: int | None, question: str,
        standalone_query: str, chunk_ids: Sequence[int], mode: str, abstained: bool,
        outcome: str | None = None, channel_key: str | None = None, private: bool = False, posted: bool = True,
    ) -> int:
        """Remember an answer a bot posted (or, `posted=False`, a help-channel auto-answer it kept to itself because
        it was not an answer); its id goes into the feedback buttons. `outcome` (answer | uncertain | decline),
        `channel_key` and `private` feed the gaps report (`bot.chat.insights`)."""
        async with self.engine.begin() as conn:
            return (
                await conn.execute(
                    text(
                        "INSERT INTO bot_answers (platform, conversation_id, asker, turn_id, question, "
                        "standalone_query, chunk_ids, mode, abstained, outcome, channel_key, private, posted) "
                        "VALUES (:platform, :conversation, :asker, :turn, :question, :standalone, "
                        "CAST(:chunks AS bigint[]), :mode, :abstained, :outcome, :channel, :private, :posted) "
                        "RETURNING id"
                    ),
                    {"platform": platform, "conversation": conversation_id, "asker": asker, "turn": turn_id,
                     "question": question, "standalone": standalone_query, "chunks": list(chunk_ids),
                     "mode": mode, "abstained": abstained,
                     "outcome": outcome or ("decline" if abstained else "answer"), "channel": channel_key,
                     "private": private, "posted": posted},
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
                        text("SELECT EXISTS (SELECT 1 FROM bot_answers WHERE conversation_id = :c AND posted)"),
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

    # Gaps, usage and retention (issue 34): read by bot.chat.insights and the admin page, pruned by
    # bot.chat.retention.

    async def gap_questions(self, since: datetime, limit: int = 2000) -> list[GapQuestion]:
        """Questions since `since` the bot declined, answered as uncertain, or got a 👎 on; newest first."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    """
                    SELECT a.id, a.platform, a.conversation_id, a.asker, a.question, a.standalone_query, a.chunk_ids,
                           coalesce(a.outcome, CASE WHEN a.abstained THEN 'decline' ELSE 'answer' END) AS outcome,
                           a.channel_key, a.private, a.posted, a.created_at,
                           (SELECT count(*) FROM bot_feedback f WHERE f.answer_id = a.id AND f.rating = 'down')
                               AS downvotes
                    FROM bot_answers a
                    WHERE a.created_at >= :since
                      AND (a.outcome IN ('decline', 'uncertain') OR (a.outcome IS NULL AND a.abstained)
                           OR EXISTS (SELECT 1 FROM bot_feedback f WHERE f.answer_id = a.id AND f.rating = 'down'))
                    ORDER BY a.created_at DESC, a.id DESC LIMIT :limit
                    """
                ),
                {"since": since, "limit": limit},
            )
            return [
                GapQuestion(r.id, r.platform, r.conversation_id, r.asker, r.question, r.standalone_query,
                            tuple(r.chunk_ids or ()), r.outcome, r.channel_key, bool(r.private), bool(r.posted),
                            r.created_at, int(r.downvotes))
                for r in rows
            ]

    async def daily_question_counts(self, since: datetime) -> list[DailyCounts]:
        """Per UTC day since `since`: questions asked of the bot, how many it answered (outcome answer, posted)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    """
                    SELECT (a.created_at AT TIME ZONE 'UTC')::date AS day, count(*) AS questions,
                           count(*) FILTER (WHERE coalesce(a.outcome, CASE WHEN a.abstained THEN 'decline'
                                                                         ELSE 'answer' END) = 'answer'
                                            AND a.posted) AS answered
                    FROM bot_answers a WHERE a.created_at >= :since GROUP BY 1 ORDER BY 1
                    """
                ),
                {"since": since},
            )
            return [DailyCounts(r.day, int(r.questions), int(r.answered)) for r in rows]

    async def feedback_counts(self, since: datetime) -> dict[str, int]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT rating, count(*) AS n FROM bot_feedback WHERE created_at >= :since GROUP BY rating"),
                {"since": since},
            )
            return {r.rating: int(r.n) for r in rows}

    async def cited_chunk_counts(self, since: datetime) -> dict[int, int]:
        """How often each chunk was cited by an answer the bots posted since `since` (the turn's cited chunks)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    """
                    SELECT c.chunk_id, count(*) AS n
                    FROM bot_answers a JOIN conversation_turns t ON t.id = a.turn_id,
                         unnest(t.cited_chunk_ids) AS c(chunk_id)
                    WHERE a.created_at >= :since AND a.posted GROUP BY c.chunk_id
                    """
                ),
                {"since": since},
            )
            return {int(r.chunk_id): int(r.n) for r in rows}

    async def forget_bot_state_older_than(self, days: int) -> dict[str, int]:
        """Retention: delete delivered answers (their feedback goes with them) and feedback older than `days`."""
        async with self.engine.begin() as conn:
            feedback = (await conn.execute(
                text("DELETE FROM bot_feedback WHERE created_at < now() - make_interval(days => :d)"), {"d": days}
            )).rowcount or 0
            answers = (await conn.execute(
                text("DELETE FROM bot_answers WHERE created_at < now() - make_interval(days => :d)"), {"d": days}
            )).rowcount or 0
        return {"answers": answers, "feedback": feedback}

    async def identities_for_principal(self, principal: str) -> list[str]:
        """Platform identities an admin mapped to `principal` (emails compare case-insensitively)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT DISTINCT identity FROM bot_identities WHERE lower(principal) = lower(:p) ORDER BY 1"),
                {"p": principal.strip()},
            )
            return list(rows.scalars())

    async def forget_bot_state_of(self, identities: Sequence[str]) -> dict[str, int]:
        """Delete what these platform identities asked (answers, with any feedback on them) and their feedback;
        cancel their undelivered questions (a sweeper or a retry never answers them, a live holder stops at its
        next heartbeat) and drop the question, target and asker of every claim they made; and forget them as the
        admin who changed a mapping, a grant or a channel setting (the change stays, unattributed)."""
        ids = list(identities)
        params = {"ids": ids}
        async with self.engine.begin() as conn:
            feedback = (await conn.execute(
                text("DELETE FROM bot_feedback WHERE platform_user = ANY(CAST(:ids AS text[]))"), params
            )).rowcount or 0
            answers = (await conn.execute(
                text("DELETE FROM bot_answers WHERE asker = ANY(CAST(:ids AS text[]))"), params
            )).rowcount or 0
            pending = (await conn.execute(
                text(
                    """
                    WITH theirs AS (
                        SELECT key, delivered_at IS NULL AND question IS NOT NULL AS pending FROM bot_events
                        WHERE asker = ANY(CAST(:ids AS text[])) FOR UPDATE
                    )
                    UPDATE bot_events e
                    SET delivered_at = coalesce(e.delivered_at, now()), question = NULL, target = NULL,
                        asker = NULL, conversation_id = NULL, placeholder = NULL
                    FROM theirs WHERE e.key = theirs.key RETURNING theirs.pending
                    """
                ),
                params,
            )).scalars().all()
            cancelled = sum(1 for was_pending in pending if was_pending)
            for table, column in (("bot_identities", "mapped_by"), ("bot_channel_grants", "granted_by"),
                                  ("bot_channel_settings", "updated_by")):
                await conn.execute(
                    text(f"UPDATE {table} SET {column} = NULL WHERE {column} = ANY(CAST(:ids AS text[]))"), params
                )
        return {"answers": answers, "feedback": feedback, "cancelled": cancelled}


@dataclass(frozen=True)
class GapQuestion:
    id: int
    platform: str
    conversation_id: str
    asker: str
    question: str
    standalone_query: str
    chunk_ids: tuple[int, ...]  # retrieved, best first: what the question came closest to
    outcome: str  # answer | uncertain | decline
    channel_key: str | None
    private: bool
    posted: bool
    created_at: datetime
    downvotes: int


@dataclass(frozen=True)
class DailyCounts:
    day: date
    questions: int
    answered: int
