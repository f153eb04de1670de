"""question + asker's principals + conversation → answer with numbered citations.

The pipeline: the conversation's history (memory) → a standalone search query for a follow-up → hybrid search
filtered by the asker's principals → abstain if the best match is weak → pack the best chunks, grouped by document,
into numbered sources within the prompt's token budget → generate (Claude, streamed when asked, with the history in
view; or offline excerpts) → keep only citations the answer really uses → store the turn.

Citations: without streaming, they are renumbered 1..n in order of first use. When the text was streamed to the
asker as it was written, the numbers they saw are kept (no renumbering) and only the sources cited are listed.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard

from knowledge.answer.evidence import (
    Calibration,
    Evidence,
    Outcome,
    absent_specific,
    coverage,
    decide,
    missing_rare,
)
from knowledge.answer.generators import extractive
from knowledge.answer.generators.anthropic_client import (
    AnthropicGenerator,
    CitedReply,
    SearchSource,
    Span,
)
from knowledge.answer.generators.passages import section_path
from knowledge.answer.memory import (
    ChatMessage,
    ConversationMemory,
    CountTokens,
    History,
    LanguageGap,
    format_conversation,
)
from knowledge.answer.prompts import (
    CITED_SYSTEM_PROMPT,
    NO_ANSWER,
    SYSTEM_PROMPT,
    PromptSource,
    build_question_text,
    build_user_message,
    cited_numbers,
    renumber_citations,
)
from knowledge.embedding.encoder import Embedder
from knowledge.errors import EmptyQuestion, GenerationError, QuestionTooLong
from knowledge.search.retrieval import Retriever, SearchFilters, SearchHit
from knowledge.settings import KnowledgeSettings
from knowledge.storage import conversations as memory_store

logger = logging.getLogger(__name__)

ABSTAIN_MESSAGE = (
    "I couldn't find this in the documents you have access to, so I won't guess. "
    "Try rephrasing, or ask the team that owns the topic."
)
SNIPPET_CHARS = 240


TextCallback = Callable[[str], Awaitable[None]]


class Generator(Protocol):
    """A language model behind one call. `model`/`max_tokens` override its defaults (the follow-up rewrite and
    the summary use a small model and budget); with `on_text` the reply is streamed, delta by delta."""

    mode: str

    async def generate(
        self, system: str, user: str, *, model: str | None = None, max_tokens: int | None = None,
        on_text: TextCallback | None = None,
    ) -> str: ...

    async def close(self) -> None: ...


class CitingGenerator(Generator, Protocol):
    """A generator that can also answer with the model's own citations (AnthropicGenerator with
    ANTHROPIC_CITATIONS): the sources go in as search results, the reply comes back with cited spans."""

    citations: bool

    async def generate_cited(
        self, system: str, sources: Sequence[SearchSource], user: str, *, on_text: TextCallback | None = None,
    ) -> CitedReply: ...


def cites(generator: Generator) -> TypeGuard[CitingGenerator]:
    """Whether answers go through `generate_cited` (the generator says so with `citations`)."""
    return bool(getattr(generator, "citations", False))


@dataclass(frozen=True)
class AnswerSettings:
    context_chunks: int = 8  # at most this many retrieved chunks in the prompt
    context_token_budget: int = 3000  # retrieved text in the prompt, in tokens
    prompt_token_budget: int = 6000  # the whole prompt: system + conversation + sources + question
    # where answer / uncertain / decline split: the decision fitted by `make calibrate` (knowledge.answer.evidence)
    calibration: Calibration = field(default_factory=Calibration.load)
    text_search_config: str = "english"
    max_question_chars: int = 4000  # longer questions are refused (QuestionTooLong) before any work

    @classmethod
    def from_settings(cls, settings: KnowledgeSettings) -> AnswerSettings:
        return cls(settings.context_chunks, settings.context_token_budget, settings.prompt_token_budget,
                   Calibration.load(settings.answer_calibration), settings.text_search_config,
                   max_question_chars=settings.max_question_chars)


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
    quotes: tuple[str, ...] = ()  # the exact passages Claude cited from this source (Anthropic Citations)

    def to_dict(self) -> dict[str, object]:
        return {"n": self.n, "title": self.title, "url": self.url, "path": self.path,
                "external_id": self.external_id, "source": self.source, "heading": self.heading,
                "snippet": self.snippet, "quotes": list(self.quotes)}


@dataclass
class Answer:
    text: str
    mode: str  # "llm" or "extractive"
    abstained: bool
    citations: list[Citation]
    chunks_used: list[SearchHit]
    timings: dict[str, float] = field(default_factory=dict)
    note: str | None = None  # e.g. why the LLM was not used this time
    id: int | None = None  # the stored turn's id: feedback refers to it
    standalone_query: str = ""  # what was searched: the question, or its rewrite when it was a follow-up
    related: list[Citation] = field(default_factory=list)  # when abstaining: the nearest documents, numbered 1..n
    # "answer", "uncertain" (the closest passages, labelled as such, cited) or "decline" (`abstained`)
    outcome: Outcome = "answer"
    evidence: Evidence | None = None  # what the outcome was decided on

    def __post_init__(self) -> None:
        if self.abstained:
            self.outcome = "decline"
        elif self.outcome == "decline":
            self.abstained = True

    def to_dict(self) -> dict[str, object]:
        fields = ("n", "title", "url", "path", "external_id", "heading", "quotes")
        result: dict[str, object] = {
            "id": self.id,
            "answer": self.text,
            "standalone_query": self.standalone_query,
            "mode": self.mode,
            "outcome": self.outcome,
            "abstained": self.abstained,
            "citations": [_plain_dict(c, fields) for c in self.citations],
        }
        if self.abstained:
            result["related"] = [_plain_dict(c, fields) for c in self.related]
        if self.evidence is not None:
            result["evidence"] = self.evidence.to_dict()
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

    def citation(self, n: int, quotes: Sequence[str] = ()) -> Citation:
        best = self.first
        snippet = best.text if len(best.text) <= SNIPPET_CHARS else best.text[: SNIPPET_CHARS - 1].rstrip() + "…"
        heading = section_path(best.title, best.heading)
        return Citation(n, best.title, best.url, best.path, best.external_id, best.source, heading, snippet,
                        tuple(quotes))

    def search_source(self) -> SearchSource:
        """This source as a search_result block's fields: one text block per chunk, in document order."""
        ordered = sorted(self.hits, key=lambda h: h.ordinal)
        best = self.first
        return SearchSource(self.n, best.url or best.path or best.external_id, best.title,
                            tuple(f"{h.heading}\n{h.text}" if h.heading else h.text for h in ordered))


def group_into_sources(hits: Sequence[SearchHit], count_tokens: CountTokens, budget: int) -> list[_SourceGroup]:
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
    """Answers one question: memory → retrieval → generation → memory. Gets exactly what it uses."""

    def __init__(
        self, retriever: Retriever, memory: ConversationMemory, generator: Generator | None,
        count_tokens: CountTokens, settings: AnswerSettings, embedder: Embedder,
    ) -> None:
        self.retriever = retriever
        self.memory = memory
        self.generator = generator
        self.count_tokens = count_tokens
        self.settings = settings
        self.embedder = embedder  # offline excerpts pick sentences by similarity

    @property
    def mode(self) -> str:
        return self.generator.mode if self.generator else "extractive"

    async def answer(
        self, question: str, principals: Sequence[str], conversation_id: str, *, sources: Sequence[str] | None = None,
        asker: str | None = None, prior_messages: Sequence[ChatMessage] | None = None,
        on_text: TextCallback | None = None,
    ) -> Answer:
        question = question.strip()
        if not question:
            raise EmptyQuestion()
        if len(question) > self.settings.max_question_chars:
            raise QuestionTooLong(len(question), self.settings.max_question_chars)
        settings = self.settings
        timings: dict[str, float] = {}
        started = time.perf_counter()
        # Only turns whose prompts held nothing this audience may not see now (a narrower asker, a revoked grant).
        history = await self.memory.history(conversation_id, prior_messages, audience=principals)
        rewrite = await self.memory.standalone_query(question, history)
        query = rewrite.query
        # A question in a language the documents are not in: with Claude, its translation is searched too; the
        # reply says which languages the knowledge base holds (offline, at most `uncertain`: see below).
        gap = await self.memory.language_gap(question)
        readings = rewrite.searches()
        translated = await self.memory.translation(question, gap) if gap is not None else None
        if translated is not None:
            readings = (*readings, translated)
        timings["memory_ms"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        filters = SearchFilters(tuple(principals), tuple(sources) if sources else None)
        results = await self.retriever.search_readings(readings, filters, k=settings.context_chunks)
        timings["retrieval_ms"] = (time.perf_counter() - started) * 1000
        if not results.hits or results.best_similarity is None:
            answer = Answer(_noted(ABSTAIN_MESSAGE, gap), self.mode, True, [], results.hits, timings, rewrite.note)
            return await self._remember(conversation_id, question, query, principals, asker, answer, [], history)

        conversation, groups = self._fit_prompt(question, history, results.hits)
        in_context = [hit for group in groups for hit in group.hits]
        started = time.perf_counter()
        evidence, scored = await self._evidence(query, results.best_similarity, results.hits, groups)
        outcome = decide(evidence, settings.calibration)
        if gap is not None and translated is None and outcome == "answer":
            outcome = "uncertain"  # offline, a passage in another language is the closest one, never a sure answer
        timings["evidence_ms"] = (time.perf_counter() - started) * 1000
        if outcome == "decline" or not groups:
            answer = Answer(_noted(ABSTAIN_MESSAGE, gap), self.mode, True, [], results.hits, timings, rewrite.note,
                            # related documents only when the nearest one shares a term with the question
                            related=related_documents(groups) if evidence.coverage > 0 else [], evidence=evidence)
            return await self._remember(conversation_id, question, query, principals, asker, answer, [], history)
        started = time.perf_counter()
        note = None
        if self.generator is not None:
            gate = _StreamGate(on_text) if on_text is not None else None
            try:
                answer, cited = await self._generate(question, conversation, groups, in_context, gate)
            except GenerationError as exc:
                logger.warning("LLM unavailable, answering with excerpts: %s", exc)
                note = str(exc) if gate is None or not gate.sent else f"the answer stopped while being written ({exc})"
                answer, cited = await self._extract(query, groups, in_context, outcome, scored, evidence.not_found)
        else:
            answer, cited = await self._extract(query, groups, in_context, outcome, scored, evidence.not_found)
        answer.evidence = evidence
        answer.text = _noted(answer.text, gap)
        timings["generation_ms"] = (time.perf_counter() - started) * 1000
        answer.timings = timings
        answer.note = note or rewrite.note
        return await self._remember(conversation_id, question, query, principals, asker, answer, cited, history,
                                    [hit.chunk_id for hit in in_context])

    def _fit_prompt(
        self, question: str, history: History, hits: Sequence[SearchHit]
    ) -> tuple[str, list[_SourceGroup]]:
        """The conversation block and the sources such that system + conversation + sources + question stay
        within the prompt budget (and the sources within the context budget). The conversation may take at most
        half of the budget (its oldest messages go first, then the summary); the sources fill the rest by estimate,
        then the weakest chunks are dropped while the real prompt is still too long."""
        budget = self.settings.prompt_token_budget
        messages, summary = list(history.messages), history.summary

        def fixed_tokens(conversation: str) -> int:
            return sum(self.count_tokens([SYSTEM_PROMPT, conversation, question])) + 16

        conversation = format_conversation(History(summary, messages)) if summary or messages else ""
        while conversation and fixed_tokens(conversation) > budget // 2:
            if messages:
                messages.pop(0)
            else:
                summary = ""
            conversation = format_conversation(History(summary, messages)) if summary or messages else ""
        room = max(0, min(self.settings.context_token_budget, budget - fixed_tokens(conversation)))
        groups = group_into_sources(hits, self.count_tokens, room) if room else []
        kept = [hit for group in groups for hit in group.hits]
        while kept and self.prompt_tokens(question, conversation, groups) > budget:
            kept = sorted(kept, key=lambda h: h.rank)[:-1]
            groups = group_into_sources(kept, self.count_tokens, room)
        return conversation, groups

    def prompt_tokens(self, question: str, conversation: str, groups: Sequence[_SourceGroup]) -> int:
        user = build_user_message(question, [g.prompt_source() for g in groups], conversation)
        return sum(self.count_tokens([SYSTEM_PROMPT, user]))

    async def _generate(
        self, question: str, conversation: str, groups: list[_SourceGroup], hits: list[SearchHit],
        gate: _StreamGate | None,
    ) -> tuple[Answer, list[int]]:
        assert self.generator is not None
        spans: list[Span] = []
        if cites(self.generator):
            cited_reply = await self.generator.generate_cited(
                CITED_SYSTEM_PROMPT, [g.search_source() for g in groups], build_question_text(question, conversation),
                on_text=gate,
            )
            reply, spans = cited_reply.text, cited_reply.spans
        else:
            user = build_user_message(question, [g.prompt_source() for g in groups], conversation)
            reply = await self.generator.generate(SYSTEM_PROMPT, user, on_text=gate)
        if gate is not None:
            await gate.finish(reply)
        if _is_no_answer(reply):
            return Answer(ABSTAIN_MESSAGE, self.generator.mode, True, [], hits, related=related_documents(groups)), []
        by_number = {g.n: g for g in groups}
        if gate is not None:
            # Streamed: the asker has seen these numbers; keep them and list only the sources cited.
            text_out = gate.text
            used = sorted(n for n in cited_numbers(text_out) if n in by_number)
            citations = [by_number[n].citation(n, _quotes(spans, n)) for n in used]
        else:
            used = [n for n in cited_numbers(reply) if n in by_number]
            mapping = {old: new for new, old in enumerate(used, start=1)}
            text_out = renumber_citations(reply, mapping)
            citations = [by_number[old].citation(new, _quotes(spans, old)) for old, new in mapping.items()]
        cited = [hit.chunk_id for n in used for hit in by_number[n].hits]
        return Answer(text_out, self.generator.mode, False, citations, hits), cited

    async def evidence_for(
        self, question: str, principals: Sequence[str], sources: Sequence[str] | None = None,
    ) -> tuple[Evidence | None, list[SearchHit]]:
        """The evidence a question without history is decided on, and the hits it came from (None when nothing
        was found): what `make calibrate` fits the decision on, computed exactly as `answer` computes it."""
        filters = SearchFilters(tuple(principals), tuple(sources) if sources else None)
        results = await self.retriever.search(question, filters, k=self.settings.context_chunks)
        if not results.hits or results.best_similarity is None:
            return None, results.hits
        _, groups = self._fit_prompt(question, History("", []), results.hits)
        evidence, _ = await self._evidence(question, results.best_similarity, results.hits, groups)
        return evidence, results.hits

    async def _evidence(
        self, query: str, best_similarity: float, hits: Sequence[SearchHit], groups: Sequence[_SourceGroup],
    ) -> tuple[Evidence, list[extractive.ScoredUnit] | None]:
        """What the outcome is decided on (knowledge.answer.evidence). Offline, the passage-level support is the
        best quotable unit's similarity (the units are scored once, for the quote too); with Claude, which judges
        the passages itself, the best chunk's similarity stands in for it (no extra embedding), and the best
        chunk's section stands in for the best unit's."""
        if not groups:
            return Evidence(best_similarity, best_similarity, 0.0, 0.0, 0, 0.0, 1.0), None
        top = groups[0].first.document_id
        best_by_document: dict[int, float] = {}
        for hit in hits:
            best_by_document[hit.document_id] = max(best_by_document.get(hit.document_id, hit.score), hit.score)
        others = [score for document, score in best_by_document.items() if document != top]
        margin = best_by_document.get(top, 0.0) - (max(others) if others else 0.0)
        dense_best = max(hits, key=lambda h: -1.0 if h.dense_score is None else h.dense_score)
        lexical_best = max(hits, key=lambda h: -1.0 if h.lexical_score is None else h.lexical_score)
        agreement = int(dense_best.document_id == top) + int(lexical_best.lexical_score is not None
                                                             and lexical_best.document_id == top)
        scored = None
        support = best_similarity
        if self.generator is None:
            scored = await asyncio.to_thread(extractive.score_units, query, _passages(groups), self.embedder)
            support = scored[0].similarity if scored else 0.0
        by_number = {g.n: g for g in groups}
        answering = by_number.get(scored[0].source_n, groups[0]) if scored else groups[0]
        heading = scored[0].passage.heading if scored else answering.first.heading
        unit_text = scored[0].unit.scoring_text() if scored else answering.first.text
        passages = [
            _document_text(groups[0]),  # the top document
            " ".join([answering.first.title, heading] + [h.text for h in answering.hits if h.heading == heading]),
            _document_text(answering),  # the document the answer quotes first
            unit_text,  # the unit it quotes first
        ]
        specific = extractive.specific_words(query)
        async with self.retriever.engine.connect() as conn:
            stats, named = await memory_store.evidence_term_statistics(
                conn, extractive.content_text(query), " ".join(specific), passages, self.settings.text_search_config)
        not_found = tuple(_surface(lexeme, specific) for lexeme in absent_specific(named, 2))
        return Evidence(best_similarity, support, coverage(stats), margin, agreement, coverage(stats, 1),
                        missing_rare(stats, 1), not_found, coverage(stats, 3), missing_rare(stats, 3),
                        extractive.negation_mismatch(query, unit_text), extractive.answer_type(query, unit_text)), scored

    async def _extract(
        self, query: str, groups: list[_SourceGroup], hits: list[SearchHit], outcome: Outcome = "answer",
        scored: list[extractive.ScoredUnit] | None = None, not_found: Sequence[str] = (),
    ) -> tuple[Answer, list[int]]:
        """Offline: quote the passage that best answers the standalone query (a follow-up's own words are too thin);
        for an `uncertain` outcome, the closest passages, labelled as possibly not answering."""
        offline = await asyncio.to_thread(
            extractive.compose, query, _passages(groups), self.embedder, scored=scored, hedge=outcome == "uncertain",
            not_found=not_found,
        )
        if offline is None:  # retrieved, but nothing quotable in it
            return Answer(ABSTAIN_MESSAGE, "extractive", True, [], hits, related=related_documents(groups)), []
        by_number = {g.n: g for g in groups}
        citations = [by_number[old].citation(new) for new, old in enumerate(offline.sources, start=1)]
        cited = [hit.chunk_id for n in offline.sources for hit in by_number[n].hits]
        return Answer(offline.text, "extractive", False, citations, hits, outcome=outcome), cited

    async def _remember(
        self, conversation_id: str, question: str, query: str, principals: Sequence[str], asker: str | None,
        answer: Answer, cited_chunk_ids: Sequence[int], history: History, context_chunk_ids: Sequence[int] = (),
    ) -> Answer:
        """Keep the turn (follow-up rewriting and summaries build on it); the answer carries its id and query.
        `context_chunk_ids`: every chunk the prompt held, cited or not (a model may restate what it did not cite):
        a later asker who may not see all of them never gets this turn in their prompts."""
        answer.standalone_query = query
        answer.id = await self.memory.remember(
            conversation_id, question=question, standalone_query=query, answer=answer.text, principals=principals,
            asker=asker, cited_chunk_ids=cited_chunk_ids, history=history, context_chunk_ids=context_chunk_ids,
        )
        return answer


def _noted(text: str, gap: LanguageGap | None) -> str:
    """The reply, with a line saying which languages the knowledge base holds when the question is in another."""
    return text if gap is None else f"{gap.note()}\n\n{text}"


def _plain_dict(citation: Citation, fields: Sequence[str]) -> dict[str, object]:
    return {f: list(v) if isinstance(v := getattr(citation, f), tuple) else v for f in fields}


def _quotes(spans: Sequence[Span], n: int) -> list[str]:
    return [span.text for span in spans if span.n == n]


def _passages(groups: Sequence[_SourceGroup]) -> list[extractive.Passage]:
    """The chunks of the first three sources, as the offline answer reads them."""
    return [extractive.Passage(g.n, h.title, h.heading, h.ordinal, h.text) for g in groups[:3] for h in g.hits]


def _document_text(group: _SourceGroup) -> str:
    """A source's title with its retrieved chunks and their headings: what "the document holds" is checked on."""
    return " ".join([group.first.title] + [f"{h.heading} {h.text}" for h in group.hits])


def _surface(lexeme: str, words: Sequence[str]) -> str:
    """The question's own spelling of a stemmed term ("offic" → "offices"), for saying what was not found."""
    return next((w for w in words if w.casefold().startswith(lexeme)), lexeme)


def _is_no_answer(reply: str) -> bool:
    return not reply or reply.strip().strip(".").upper() == NO_ANSWER or reply.strip().startswith(NO_ANSWER)


class _StreamGate:
    """Passes Claude's text deltas on to the asker, except a reply that is (so far) the NO_ANSWER marker: that is
    held back, so nobody ever sees "NO_ANSWER" flash by. Leading whitespace is dropped. `text` is what was sent."""

    def __init__(self, on_text: TextCallback) -> None:
        self.on_text = on_text
        self.pending = ""
        self.sent: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.sent).strip()

    async def __call__(self, delta: str) -> None:
        if self.sent:
            await self._send(delta)
            return
        self.pending += delta
        head = self.pending.lstrip().upper()
        if not head or NO_ANSWER.startswith(head) or head.startswith(NO_ANSWER):
            return  # could still be (or is) the no-answer marker
        await self._send(self.pending.lstrip())

    async def finish(self, reply: str) -> None:
        """The stream ended. A short reply that was held back only because it began like the marker goes out now."""
        if not self.sent and not _is_no_answer(reply) and self.pending.strip():
            await self._send(self.pending.lstrip())

    async def _send(self, delta: str) -> None:
        if delta:
            self.sent.append(delta)
            await self.on_text(delta)


def related_documents(groups: Sequence[_SourceGroup], limit: int = 3) -> list[Citation]:
    """The nearest documents, offered when the answer abstains although something was retrieved."""
    return [group.citation(n) for n, group in enumerate(groups[:limit], start=1)]


def make_generator(settings: KnowledgeSettings) -> Generator | None:
    """Claude when ANTHROPIC_API_KEY is set; otherwise None, meaning offline extractive answers."""
    if settings.anthropic_api_key is None or not settings.anthropic_api_key.get_secret_value():
        return None
    return AnthropicGenerator(settings)
