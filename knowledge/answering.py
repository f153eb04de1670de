"""question + asker's principals + conversation id → answer with numbered citations.

The pipeline: hybrid search filtered by the asker's principals → abstain if the best match is weak → pack the
best chunks, grouped by document, into numbered sources within a token budget → generate (Claude, or offline
excerpts) → keep only citations the answer really uses, renumbered 1..n in order of first use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from knowledge import store
from knowledge.generators.anthropic_client import AnthropicGenerator, GenerationError
from knowledge.generators import extractive
from knowledge.generators.passages import section_path
from knowledge.prompts import NO_ANSWER, SYSTEM_PROMPT, PromptSource, build_user_message, cited_numbers, renumber_citations
from knowledge.retrieval import SearchFilters, SearchHit

logger = logging.getLogger(__name__)

ABSTAIN_MESSAGE = (
    "I couldn't find this in the documents you have access to, so I won't guess. "
    "Try rephrasing, or ask the team that owns the topic."
)
SNIPPET_CHARS = 240


class Generator(Protocol):
    mode: str

    async def generate(self, system: str, user: str) -> str: ...


@dataclass(frozen=True)
class Citation:
    n: int
    title: str
    url: str | None
    path: str | None
    external_id: str
    source: str
    heading: str
    snippet: str

    def to_dict(self) -> dict[str, object]:
        return {"n": self.n, "title": self.title, "url": self.url, "path": self.path,
                "external_id": self.external_id, "source": self.source, "heading": self.heading,
                "snippet": self.snippet}


@dataclass
class Answer:
    text: str
    mode: str  # "llm" or "extractive"
    abstained: bool
    citations: list[Citation]
    chunks_used: list[SearchHit]
    timings: dict[str, float] = field(default_factory=dict)
    note: str | None = None  # e.g. why the LLM was not used this time
    related: list[Citation] = field(default_factory=list)  # when abstaining: the nearest documents, numbered 1..n

    def to_dict(self) -> dict[str, object]:
        fields = ("n", "title", "url", "path", "external_id", "heading")
        result: dict[str, object] = {
            "answer": self.text,
            "mode": self.mode,
            "abstained": self.abstained,
            "citations": [{f: getattr(c, f) for f in fields} for c in self.citations],
        }
        if self.abstained:
            result["related"] = [{f: getattr(c, f) for f in fields} for c in self.related]
        return result


@dataclass
class _SourceGroup:
    """One numbered source: a document and the chunks of it that made it into the context."""

    n: int
    hits: list[SearchHit]

    @property
    def first(self) -> SearchHit:
        return self.hits[0]

    def prompt_source(self) -> PromptSource:
        ordered = sorted(self.hits, key=lambda h: h.ordinal)
        body = "\n[...]\n".join(f"{h.heading}\n{h.text}" if h.heading else h.text for h in ordered)
        return PromptSource(self.n, self.first.title, self.first.path, body)

    def citation(self, n: int) -> Citation:
        best = self.first
        snippet = best.text if len(best.text) <= SNIPPET_CHARS else best.text[: SNIPPET_CHARS - 1].rstrip() + "…"
        heading = section_path(best.title, best.heading)
        return Citation(n, best.title, best.url, best.path, best.external_id, best.source, heading, snippet)


def group_into_sources(hits: Sequence[SearchHit], count_tokens, budget: int) -> list[_SourceGroup]:  # type: ignore[no-untyped-def]
    """Number documents in order of their best hit and fill the token budget with chunks, best first."""
    groups: dict[int, _SourceGroup] = {}
    used = 0
    for hit in hits:
        tokens = count_tokens([hit.text])[0] + 8
        if used + tokens > budget and groups:
            continue
        used += tokens
        if hit.document_id not in groups:
            groups[hit.document_id] = _SourceGroup(len(groups) + 1, [])
        groups[hit.document_id].hits.append(hit)
    return list(groups.values())


class Answerer:
    def __init__(self, kb, generator: Generator | None) -> None:  # type: ignore[no-untyped-def]
        self.kb = kb
        self.generator = generator

    async def answer(
        self, question: str, principals: Sequence[str], conversation_id: str, *, sources: Sequence[str] | None = None
    ) -> Answer:
        question = question.strip()
        if not question:
            raise ValueError("the question is empty")
        settings = self.kb.settings
        timings: dict[str, float] = {}
        started = time.perf_counter()
        filters = SearchFilters(tuple(principals), tuple(sources) if sources else None)
        results = await self.kb.search(question, filters, k=settings.context_chunks)
        timings["retrieval_ms"] = (time.perf_counter() - started) * 1000
        mode = self.generator.mode if self.generator else "extractive"
        best = results.best_similarity
        if not results.hits or best is None or best < settings.abstain_below_similarity:
            answer = Answer(ABSTAIN_MESSAGE, mode, True, [], results.hits, timings)
            await self._remember(conversation_id, question, principals, answer)
            return answer

        groups = group_into_sources(results.hits, self.kb.embedder.count_tokens_many, settings.context_token_budget)
        in_context = [hit for group in groups for hit in group.hits]
        started = time.perf_counter()
        note = None
        if self.generator is not None:
            try:
                answer = await self._generate(question, groups, in_context)
            except GenerationError as exc:
                logger.warning("LLM unavailable, answering with excerpts: %s", exc)
                note = str(exc)
                answer = await self._extract(question, groups, in_context)
        else:
            answer = await self._extract(question, groups, in_context)
        timings["generation_ms"] = (time.perf_counter() - started) * 1000
        answer.timings = timings
        answer.note = note
        await self._remember(conversation_id, question, principals, answer)
        return answer

    async def _generate(self, question: str, groups: list[_SourceGroup], hits: list[SearchHit]) -> Answer:
        assert self.generator is not None
        user = build_user_message(question, [g.prompt_source() for g in groups])
        reply = await self.generator.generate(SYSTEM_PROMPT, user)
        if not reply or reply.strip().strip(".").upper() == NO_ANSWER or reply.strip().startswith(NO_ANSWER):
            return Answer(ABSTAIN_MESSAGE, self.generator.mode, True, [], hits, related=related_documents(groups))
        by_number = {g.n: g for g in groups}
        used = [n for n in cited_numbers(reply) if n in by_number]
        mapping = {old: new for new, old in enumerate(used, start=1)}
        text_out = renumber_citations(reply, mapping)
        citations = [by_number[old].citation(new) for old, new in mapping.items()]
        return Answer(text_out, self.generator.mode, False, citations, hits)

    async def _extract(self, question: str, groups: list[_SourceGroup], hits: list[SearchHit]) -> Answer:
        passages = [
            extractive.Passage(g.n, h.title, h.heading, h.ordinal, h.text) for g in groups[:3] for h in g.hits
        ]
        offline = await asyncio.to_thread(extractive.compose, question, passages, self.kb.embedder)
        if offline is None:  # retrieved, but nothing in it addresses the question
            return Answer(ABSTAIN_MESSAGE, "extractive", True, [], hits, related=related_documents(groups))
        by_number = {g.n: g for g in groups}
        citations = [by_number[old].citation(new) for new, old in enumerate(offline.sources, start=1)]
        return Answer(offline.text, "extractive", False, citations, hits)

    async def _remember(self, conversation_id: str, question: str, principals: Sequence[str], answer: Answer) -> None:
        """Keep the turn: follow-up rewriting and thread summaries build on this history."""
        async with self.kb.engine.begin() as conn:
            await store.record_turn(conn, conversation_id, question, answer.text, principals)


def related_documents(groups: Sequence[_SourceGroup], limit: int = 3) -> list[Citation]:
    """The nearest documents, offered when the answer abstains although something was retrieved."""
    return [group.citation(n) for n, group in enumerate(groups[:limit], start=1)]


def make_generator(settings) -> Generator | None:  # type: ignore[no-untyped-def]
    """Claude when ANTHROPIC_API_KEY is set; otherwise None, meaning offline extractive answers."""
    if settings.anthropic_api_key is None or not settings.anthropic_api_key.get_secret_value():
        return None
    return AnthropicGenerator(settings)
