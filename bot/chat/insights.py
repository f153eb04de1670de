"""What the bot misses and what it cites: `ragbot insights`, `/kb gaps` and the admin page's sections.

Gaps are the questions the bot declined, answered as uncertain, or got a 👎 on, grouped by topic
(`knowledge.insights.clustering` over the questions' embeddings from the project's own encoder; each topic named by
its most central question), each with its count, when it was last asked, where, and the documents it came closest
to. Beside them: the most-cited documents, documents never cited in the period, and cited documents not updated in
a year.

Who sees which questions (`Viewer`): question text goes to admins only (every caller of this module checks that).
An operator (the CLI, the admin page: they hold the database or ADMIN_TOKEN) sees every question; a chat admin sees
the questions asked in their own workspace or server, and of those asked in a channel only the ones from channels
they could read themselves (a private channel they are not a member of stays hidden; a channel whose members cannot
be listed too: fail closed). A private conversation's (DM, assistant thread) question is shown without its asker,
unless the asker is the viewer. Discord DMs belong to no server: a Discord admin sees only their own.
"""

from __future__ import annotations

import asyncio
import csv
import io
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from knowledge import EVERYONE, parse_interval
from knowledge.insights.clustering import DEFAULT_THRESHOLD, MAX_QUESTIONS, cluster_questions

if TYPE_CHECKING:
    from bot.chat.state import BotState, DailyCounts, GapQuestion
    from knowledge import DocumentRef, KnowledgeBase

STALE_AFTER = timedelta(days=365)
PRIVATE = "private conversation"


@dataclass(frozen=True)
class Viewer:
    """Who reads the report. `identity` None: an operator (CLI, admin page). `scope`: a chat admin sees questions
    whose conversation id starts with it ("slack:T1:", "discord:<guild>:")."""

    identity: str | None = None
    scope: str | None = None
    principals: tuple[str, ...] | None = None  # documents named must be visible to these; None: any document
    # Whether the viewer may read a channel (by key), as its members may: the platform's membership, through the
    # adapter. None for a chat admin: channel questions stay hidden (fail closed).
    reads_channel: Callable[[str], Awaitable[bool]] | None = None

    def may_read(self, doc: DocumentRef) -> bool:
        return self.principals is None or bool(set(doc.access) & (set(self.principals) | {EVERYONE}))

    def may_see(self, q: GapQuestion) -> bool:
        if self.identity is None or q.asker == self.identity:
            return True
        return self.scope is not None and q.conversation_id.startswith(self.scope)

    async def readable(self, questions: Sequence[GapQuestion]) -> list[GapQuestion]:
        """The questions asked in channels the viewer could read (each channel checked once). Their own questions,
        private conversations' (shown without asker) and an operator's view are not filtered."""
        if self.identity is None:
            return list(questions)
        verdicts: dict[str, bool] = {}
        kept = []
        for q in questions:
            if q.asker == self.identity or q.private or q.channel_key is None:
                kept.append(q)
                continue
            if q.channel_key not in verdicts:
                verdicts[q.channel_key] = self.reads_channel is not None and await self.reads_channel(q.channel_key)
            if verdicts[q.channel_key]:
                kept.append(q)
        return kept

    def asker_shown(self, q: GapQuestion) -> str | None:
        if not q.private or q.asker == self.identity:
            return q.asker
        return None


@dataclass(frozen=True)
class AskedQuestion:
    text: str
    asked_at: datetime
    where: str  # a channel key, or "private conversation"
    asker: str | None  # None: hidden (someone else's private conversation)
    outcome: str
    downvotes: int
    posted: bool

    def to_dict(self) -> dict[str, object]:
        return {"question": self.text, "asked_at": self.asked_at.isoformat(), "where": self.where,
                "asker": self.asker, "outcome": self.outcome, "downvotes": self.downvotes, "posted": self.posted}


@dataclass(frozen=True)
class GapTopic:
    name: str  # the most central question
    count: int
    last_asked: datetime
    channels: tuple[str, ...]
    outcomes: dict[str, int]
    downvotes: int
    closest_documents: tuple[DocumentRef, ...]
    questions: tuple[AskedQuestion, ...]

    def to_dict(self) -> dict[str, object]:
        return {"topic": self.name, "count": self.count, "last_asked": self.last_asked.isoformat(),
                "channels": list(self.channels), "outcomes": self.outcomes, "downvotes": self.downvotes,
                "closest_documents": [d.to_dict() for d in self.closest_documents],
                "questions": [q.to_dict() for q in self.questions]}


@dataclass
class InsightsReport:
    since: datetime
    until: datetime
    topics: list[GapTopic]
    most_cited: list[tuple[DocumentRef, int]]
    never_cited_total: int
    never_cited: list[DocumentRef]
    stale_cited: list[tuple[DocumentRef, int]]
    daily: list[DailyCounts] = field(default_factory=list)
    feedback: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "since": self.since.isoformat(), "until": self.until.isoformat(),
            "gaps": [t.to_dict() for t in self.topics],
            "most_cited": [{**d.to_dict(), "citations": n} for d, n in self.most_cited],
            "never_cited": {"total": self.never_cited_total, "documents": [d.to_dict() for d in self.never_cited]},
            "stale_cited": [{**d.to_dict(), "citations": n} for d, n in self.stale_cited],
            "daily": [{"day": d.day.isoformat(), "questions": d.questions, "answered": d.answered} for d in self.daily],
            "feedback": self.feedback,
        }

    def to_csv(self) -> str:
        """One row per gap topic (the questions themselves are in --json)."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["topic", "count", "last_asked", "channels", "declined", "uncertain", "downvotes",
                         "closest_documents"])
        for t in self.topics:
            writer.writerow([_csv_safe(t.name), t.count, t.last_asked.isoformat(), " ".join(t.channels),
                             t.outcomes.get("decline", 0), t.outcomes.get("uncertain", 0), t.downvotes,
                             " | ".join(_csv_safe(d.title) for d in t.closest_documents)])
        return out.getvalue()


def _csv_safe(value: str) -> str:
    """A cell a spreadsheet would run as a formula (=, +, -, @) is prefixed with a quote."""
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def parse_since(value: str) -> timedelta:
    """"30d", "12h", "2w" → a time span (the CLI's --since)."""
    return timedelta(seconds=parse_interval(value))


async def build_report(kb: KnowledgeBase, state: BotState, since: timedelta = timedelta(days=30), viewer: Viewer = Viewer(), *,
                       threshold: float = DEFAULT_THRESHOLD, top: int = 10, now: datetime | None = None) -> InsightsReport:
    """Gather and group (the questions and feedback from the bot's tables, the documents from the knowledge base).
    Embedding and clustering run off the event loop."""
    until = now or datetime.now(UTC)
    start = until - since
    candidates = [q for q in await state.gap_questions(start, limit=MAX_QUESTIONS * 4) if viewer.may_see(q)]
    gaps = (await viewer.readable(candidates))[:MAX_QUESTIONS]
    cited = await state.cited_chunk_counts(start)
    closest_chunks = [q.chunk_ids[0] for q in gaps if q.chunk_ids]
    documents = {chunk: doc for chunk, doc in
                 (await kb.documents_of_chunks(sorted(set(closest_chunks) | set(cited)))).items()
                 if viewer.may_read(doc)}
    topics = await _topics(kb, gaps, documents, viewer, threshold)

    per_document: Counter[int] = Counter()
    refs: dict[int, DocumentRef] = {}
    for chunk_id, n in cited.items():
        doc = documents.get(chunk_id)
        if doc is not None:
            per_document[doc.id] += n
            refs[doc.id] = doc
    most_cited = [(refs[d], n) for d, n in per_document.most_common(top)]
    stale = [(refs[d], n) for d, n in per_document.most_common()
             if (updated := refs[d].updated_at) is not None and updated < until - STALE_AFTER][:top]
    never_total, never = await kb.documents_not_in(sorted(per_document), limit=top * 5)
    never = [doc for doc in never if viewer.may_read(doc)]
    return InsightsReport(start, until, topics, most_cited, never_total, never, stale,
                          await state.daily_question_counts(start), await state.feedback_counts(start))


async def _topics(kb: KnowledgeBase, gaps: Sequence[GapQuestion], documents: dict[int, DocumentRef],
                  viewer: Viewer, threshold: float) -> list[GapTopic]:
    if not gaps:
        return []
    await kb.ensure_embedding_space()
    vectors = await kb.embedder.embed_async([q.standalone_query or q.question for q in gaps])
    clusters = await asyncio.to_thread(cluster_questions, vectors, threshold)
    topics = []
    for cluster in clusters:
        members = [gaps[i] for i in cluster.members]
        closest: Counter[int] = Counter()
        refs = {}
        for q in members:
            doc = documents.get(q.chunk_ids[0]) if q.chunk_ids else None
            if doc is not None:
                closest[doc.id] += 1
                refs[doc.id] = doc
        channels = tuple(sorted({PRIVATE if q.private else (q.channel_key or q.platform) for q in members}))
        topics.append(GapTopic(
            name=gaps[cluster.central].question,
            count=len(members),
            last_asked=max(q.created_at for q in members),
            channels=channels,
            outcomes=dict(Counter(q.outcome for q in members)),
            downvotes=sum(q.downvotes for q in members),
            closest_documents=tuple(refs[d] for d, _ in closest.most_common(3)),
            questions=tuple(
                AskedQuestion(q.question, q.created_at, PRIVATE if q.private else (q.channel_key or q.platform),
                              viewer.asker_shown(q), q.outcome, q.downvotes, q.posted)
                for q in sorted(members, key=lambda m: m.created_at, reverse=True)
            ),
        ))
    topics.sort(key=lambda t: (-t.count, -t.last_asked.timestamp()))
    return topics


def gaps_text(report: InsightsReport, limit: int = 8) -> str:
    """`/kb gaps`: the biggest gap topics, in the light Markdown every adapter converts (shown to an admin only)."""
    days = max(1, round((report.until - report.since).total_seconds() / 86400))
    if not report.topics:
        return f"No gaps in the last {days} days: nothing declined, uncertain or rated 👎."
    lines = [f"**Gaps, last {days} days** (declined, uncertain or 👎; grouped by topic)"]
    for topic in report.topics[:limit]:
        where = ", ".join(f"`{c}`" for c in topic.channels[:3])
        docs = "; ".join(d.title for d in topic.closest_documents[:2]) or "nothing close"
        lines.append(f"- {topic.count}× “{_one_line(topic.name)}” (last {topic.last_asked:%Y-%m-%d}, {where}; "
                     f"closest: {docs})")
    if len(report.topics) > limit:
        lines.append(f"…and {len(report.topics) - limit} more topics: `ragbot insights` lists them all.")
    if report.most_cited:
        lines.append("**Most cited**: " + "; ".join(f"{d.title} ({n})" for d, n in report.most_cited[:3]))
    lines.append(f"**Never cited in the period**: {report.never_cited_total} documents.")
    return "\n".join(lines)


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(text.split()).replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"
