"""The knowledge base: one object that owns the database engine, the embedding model and the pipeline stages.

Adapters and the CLI talk only to this class (and the dataclasses it returns); they never see SQL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import connection_lost, create_engine, database_url
from db.migrate import ensure_schema
from db.replicas import ReadRouter
from db.settings import DatabaseSettings, redact_url
from knowledge.access import AccessResolver, DocumentVerdict, Person, ResolvedPrincipals, verdict
from knowledge.answer.answering import Answer, Answerer, AnswerSettings, make_generator
from knowledge.answer.memory import ChatMessage, ConversationMemory, MemorySettings
from knowledge.embedding.encoder import Embedder, get_embedder
from knowledge.errors import QuestionTooLong, UnknownSource
from knowledge.ingest.groups import DirectoryReport, refresh_directory
from knowledge.ingest.pipeline import Indexer, SyncProgress, SyncReport
from knowledge.ingest.runs import SyncRunner
from knowledge.search.retrieval import Mode, Retriever, SearchFilters, SearchResults, SearchTuning
from knowledge.settings import KnowledgeSettings
from knowledge.sources.base import Source, SourceInfo
from knowledge.sources.folder import FolderSource
from knowledge.storage import conversations, identities, usage
from knowledge.storage import directory as directory_store
from knowledge.storage import documents as store
from knowledge.storage.documents import SourceStatus
from knowledge.storage.search import index_markers
from knowledge.storage.sources import SyncRun

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexStatus:
    database: str
    embedding_model: str | None
    embedding_dimension: int | None
    sources: list[SourceStatus]
    documents: int
    chunks: int
    vocabulary: int
    avg_chunk_length: float

    def to_dict(self) -> dict[str, object]:
        return {
            "database": self.database,
            "embedding_model": self.embedding_model,
            "embedding_dimension": self.embedding_dimension,
            "documents": self.documents,
            "chunks": self.chunks,
            "vocabulary": self.vocabulary,
            "avg_chunk_length": round(self.avg_chunk_length, 2),
            "sources": [
                {"name": s.name, "kind": s.kind, "location": s.location, "documents": s.documents,
                 "chunks": s.chunks, "last_synced_at": s.last_synced_at.isoformat() if s.last_synced_at else None,
                 "running": s.running, "last_run": s.last_run.to_dict() if s.last_run else None}
                for s in self.sources
            ],
        }


class RetryingRetriever(Retriever):
    """The retriever, run once more when its connection was lost mid-search (a standby stopped or failed over, a
    pooler restarted): the question is answered from the next server (the primary when no standby is left) instead
    of being lost. Other errors, and a cancelled statement, are raised as they are."""

    def __init__(self, *args: Any, replicas: ReadRouter | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replicas = replicas

    async def search(self, query: str, filters: SearchFilters, **options: Any) -> SearchResults:
        try:
            return await super().search(query, filters, **options)
        except DBAPIError as error:
            if not connection_lost(error):
                raise
            logger.warning("a search lost its database connection (%s); running it again", type(error.orig).__name__)
            if self.replicas is not None:
                await self.replicas.check_now()  # a standby that went away is skipped from now on
            return await super().search(query, filters, **options)


def memory_settings(settings: KnowledgeSettings, with_claude: bool) -> MemorySettings:
    return MemorySettings(
        token_budget=settings.memory_token_budget,
        recent_turns=settings.memory_recent_turns,
        rewrite_model=settings.anthropic_rewrite_model if with_claude else None,
        rewrite_max_tokens=settings.rewrite_max_tokens,
        summary_max_tokens=settings.summary_max_tokens,
    )


class KnowledgeBase:
    """Composes the stages. The chat bots' own state (events, channel grants, the identity map, feedback) is
    `bot.chat.state.BotState` over `engine`; knowledge only reads the identity map (knowledge.storage.identities)."""

    def __init__(self, engine: AsyncEngine, settings: KnowledgeSettings, embedder: Embedder, url: str, *,
                 search_tuning: SearchTuning | None = None, db_settings: DatabaseSettings | None = None) -> None:
        db_settings = db_settings or DatabaseSettings()
        self.engine = engine
        # Reads that may see a copy a few seconds old (searches, who is in which group, status counts, run history,
        # the insights' document lookups) go through `reads`: a standby of DATABASE_REPLICA_URLS within
        # REPLICA_MAX_LAG_SECONDS when there is one (db.replicas), else the primary. Writes, and reads that must see
        # their own write (conversation turns, claims, leases), use `engine`, the primary. Either way the read pool
        # never holds a transaction (see db.engine.create_engine).
        self.replicas: ReadRouter | None = None
        if db_settings.replica_urls:
            self.replicas = ReadRouter(url, [database_url(db_settings, replica) for replica in db_settings.replica_urls],
                                       db_settings.replica_max_lag_seconds,
                                       transaction_pooler=db_settings.transaction_pooler)
            self.search_engine = self.replicas.engine
        else:
            self.search_engine = create_engine(url, autocommit=True, transaction_pooler=db_settings.transaction_pooler)
        self.reads = self.search_engine
        self.settings = settings
        self.embedder = embedder
        self.url = url
        self.indexer = Indexer(engine, embedder, settings)
        # The search statements' knobs (knowledge.storage.search.SearchTuning): the measured defaults unless given.
        self.retriever = RetryingRetriever(self.search_engine, embedder, settings, search_tuning,
                                           replicas=self.replicas)
        self.generator = make_generator(settings)
        self.memory = ConversationMemory(engine, memory_settings(settings, self.generator is not None),
                                         embedder.count_tokens_many, self.generator, settings.text_search_config)
        self.answerer = Answerer(self.retriever, self.memory, self.generator, embedder.count_tokens_many,
                                 AnswerSettings.from_settings(settings), embedder)
        self.syncs = SyncRunner(engine, self.indexer)
        # Who a person is, in principals (knowledge.access): the one resolver every surface uses.
        self.access = AccessResolver(self.search_engine, ttl_seconds=settings.group_membership_ttl_seconds,
                                     cache_seconds=settings.access_cache_seconds,
                                     identity_lookup=partial(identities.identity_principals, engine))
        self._embedding_space_ready = False
        self._transaction_pooler = db_settings.transaction_pooler

    @cached_property
    def lease_engine(self) -> AsyncEngine:
        """A small pool of its own (on the primary) for renewing leases while work runs: the chat bots' answer
        leases (`bot.chat.lease`). Why: a renewal that queues for a connection of `engine`'s pool behind the very
        work it covers (answers, syncs, a busy pool under load) can wait longer than the lease, which then runs out
        under a live holder: a sweeper takes the question over and the LLM is paid twice. Made on first use (most
        commands renew nothing), closed with the knowledge base. In autocommit: each of its statements is a
        transaction of its own (no BEGIN and COMMIT round trips)."""
        return create_engine(self.url, autocommit=True, transaction_pooler=self._transaction_pooler, pool_size=2,
                             max_overflow=2)

    @classmethod
    async def open(
        cls, settings: KnowledgeSettings | None = None, db_settings: DatabaseSettings | None = None, *,
        search_tuning: SearchTuning | None = None,
    ) -> KnowledgeBase:
        """Connect (starting the embedded Postgres if DATABASE_URL is unset), migrate, and check the model."""
        settings = settings or KnowledgeSettings()
        db_settings = db_settings or DatabaseSettings()
        url = database_url(db_settings)
        engine = create_engine(url, transaction_pooler=db_settings.transaction_pooler)
        await ensure_schema(engine)  # Alembic runs only when the stored revision is behind
        embedder = get_embedder(
            settings.embedding_model, settings.embedding_batch_size, settings.embedding_device,
            settings.query_encoder, (db_settings or DatabaseSettings()).home / "models",
        )
        kb = cls(engine, settings, embedder, url, search_tuning=search_tuning, db_settings=db_settings)
        if kb.replicas is not None:
            kb.replicas.start()
        # The model is not loaded here (that takes seconds): the stored model name says whether the vectors match,
        # and re-embedding after a model change waits for the first command that embeds anything.
        kb._embedding_space_ready = await kb.indexer.embedding_space_matches()
        return kb

    async def ensure_embedding_space(self) -> None:
        """Before anything embeds or compares vectors: make the stored vectors match the configured model."""
        if not self._embedding_space_ready:
            await self.indexer.ensure_embedding_space()
            self._embedding_space_ready = True

    async def close(self) -> None:
        await self.indexer.parser.aclose()
        if self.generator is not None:
            await self.generator.close()
        if self.replicas is not None:
            await self.replicas.close()
        else:
            await self.search_engine.dispose()
        if "lease_engine" in vars(self):  # made on first use
            await self.lease_engine.dispose()
        await self.engine.dispose()

    @property
    def answer_mode(self) -> str:
        """"llm" when answers are composed by Claude, "extractive" when they are quoted offline."""
        return self.answerer.mode

    async def answer(
        self, question: str, principals: Sequence[str], conversation_id: str, *,
        sources: Sequence[str] | None = None,
        asker: str | None = None,
        prior_messages: Sequence[ChatMessage] | None = None,
        on_text: Callable[[str], Awaitable[None]] | None = None,
    ) -> Answer:
        """The one entry point the bots use: who asks (their principals, and `asker`, stored with the turn, e.g.
        "slack:U123"), in which conversation, and what.

        - `conversation_id` names the thread; follow-ups are understood from its stored turns, and only its own.
        - `prior_messages`: thread messages the bot never saw, used as history only while the conversation has
          no stored turns yet (the bot was mentioned mid-thread).
        - `on_text`: called with each text delta while Claude writes the answer. The deltas concatenated are the
          answer's text; `Answer.text` keeps the citation numbers that were streamed (no renumbering) and
          `Answer.citations` lists only the sources cited. Offline (excerpt) answers never call it; if the stream
          breaks off, the returned Answer (excerpts, with a note) replaces what was shown.
        """
        self.check_question(question)
        return await self.answerer.answer(
            question, principals, conversation_id, sources=sources, asker=asker, prior_messages=prior_messages,
            on_text=on_text,
        )

    def check_question(self, question: str) -> None:
        """Raise QuestionTooLong for a question over MAX_QUESTION_CHARS: the chat flow and the terminal check first,
        before they post a placeholder or read a thread (`answer` checks again)."""
        limit = self.settings.max_question_chars
        if len(question.strip()) > limit:
            raise QuestionTooLong(len(question.strip()), limit)

    async def __aenter__(self) -> KnowledgeBase:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def sync(self, source: Source, progress: SyncProgress | None = None) -> SyncReport:
        """A one-off sync of a source object (`ragbot ingest PATH`): recorded and locked like any run."""
        await self.ensure_embedding_space()
        return await self.syncs.sync_adhoc(source, progress)

    async def sync_source(
        self, name: str, *, trigger: str = "cli", full: bool = False, progress: SyncProgress | None = None,
        prune: bool | None = None, unless_ran_within: float | None = None,
    ) -> SyncReport:
        """THE sync job: the scheduler (trigger "schedule"), `ragbot sync` ("cli") and `/kb reindex` ("chat").

        Syncs the stored source `name` from its checkpoint (everything with `full=True`, which also prunes);
        prunes when `prune` is True, or, when None, if its prune interval has passed. Records the run. Raises
        `knowledge.errors.UnknownSource`, `SourceBusy` (another process is syncing it), `SourceAuthError` /
        `SourceUnavailable` / `SourceConfigError` (the run is recorded as failed; the index is untouched)."""
        await self.ensure_embedding_space()
        return await self.syncs.sync_stored(name, trigger=trigger, full=full, progress=progress, prune=prune,
                                            unless_ran_within=unless_ran_within)

    async def open_split_syncs(self) -> list[str]:
        """Sources whose first sync is split into parts and not published yet: an idle sync worker helps there."""
        return await self.syncs.open_split_syncs()

    async def prepare_query_encoder(self) -> str | None:
        """Build the fast question encoder's cached file if QUERY_ENCODER wants one and it is missing. Needs torch:
        called after an ingest or sync (which loaded it) and when `ragbot run` starts, never for a question."""
        if "model" not in self.embedder.__dict__ or not self.embedder.query_encoder_missing():
            return None  # nothing to build, or torch is not loaded (nothing was embedded) and would cost seconds
        return await asyncio.to_thread(self.embedder.prepare_query_encoder)

    async def prepare_language_check(self) -> None:
        """Load what the first question's language check needs (jieba's dictionary, for the index's Chinese
        markers) now, in a thread, instead of making that question wait for it (`ragbot run` calls this at start)."""
        await asyncio.to_thread(index_markers)

    def query_encoder_missing(self) -> bool:
        """True when prepare_query_encoder would build something now (torch loaded, the ONNX file missing)."""
        return "model" in self.embedder.__dict__ and self.embedder.query_encoder_missing()

    async def list_sources(self) -> list[SourceInfo]:
        """Stored sources with their schedule, document count, last run and whether a run is live."""
        return await self.syncs.list_sources()

    async def add_source(
        self, name: str, kind: str, config: dict[str, Any], *, schedule_seconds: int | None = None,
        prune_seconds: int | None = None, check: bool = True,
    ) -> SourceInfo:
        """Store a source after checking its connection (credentials, space, path). Secrets stay in the
        environment: `config` holds only the names of the variables."""
        return await self.syncs.add(name, kind, config, schedule_seconds=schedule_seconds,
                                    prune_seconds=prune_seconds, check=check)

    async def sync_runs(self, name: str | None = None, limit: int = 20) -> list[SyncRun]:
        """Recorded runs, newest first (of one source, or of all): read from a standby when there is one."""
        return await self.syncs.runs(name, limit, engine=self.reads)

    async def search(
        self, query: str, filters: SearchFilters, *, k: int = 10, mode: Mode = "hybrid",
        max_per_document: int | None = None, candidates: int | None = None,
    ) -> SearchResults:
        if mode != "lexical":
            await self.ensure_embedding_space()
        return await self.retriever.search(
            query, filters, k=k, mode=mode, max_per_document=max_per_document, candidates=candidates
        )

    async def folder_source(self, path: Path, name: str | None = None) -> FolderSource:
        """How to index `path`: a folder or file inside an already indexed folder source joins that source (ids
        stay relative to its root, and only the part listed can be deleted); anything else is a new source."""
        resolved = path.resolve()
        async with self.engine.connect() as conn:
            roots = await store.folder_source_roots(conn)
        containing = [
            (source_name, Path(location)) for source_name, location in roots
            if (name is None or name == source_name)
            and (resolved == Path(location) or Path(location) in resolved.parents)
        ]
        if containing:
            source_name, root = max(containing, key=lambda pair: len(pair[1].parts))  # the most specific root
            return FolderSource(resolved, source_name, root=root)
        return FolderSource(resolved, name)

    async def remove_source(self, name: str) -> int:
        """Forget a source, its documents and its runs. Raises UnknownSource, or SourceBusy while it syncs."""
        async with self.engine.connect() as conn:
            source_id = await store.source_id_by_name(conn, name)
        if source_id is None:
            raise UnknownSource([name], await self.source_names())
        async with self.syncs.source_lock(source_id, name):
            async with self.engine.begin() as conn:
                removed = await store.delete_source(conn, name)
        if removed is None:
            return 0
        documents, chunks = removed
        await self.indexer.after_large_delete(chunks)
        await store.reweight_bm25(self.engine)
        return documents

    async def source_names(self) -> list[str]:
        async with self.engine.connect() as conn:
            return await store.source_names(conn)

    async def check_sources(self, names: Sequence[str] | None) -> None:
        """Raise UnknownSource if any of `names` is not an indexed source."""
        if not names:
            return
        known = await self.source_names()
        unknown = [name for name in names if name not in known]
        if unknown:
            raise UnknownSource(unknown, known)

    async def status(self) -> IndexStatus:
        infos = {info.name: info for info in await self.list_sources()}
        async with self.reads.connect() as conn:
            sources = [
                replace(s, last_run=infos[s.name].last_run, running=infos[s.name].running) if s.name in infos else s
                for s in await store.source_counts(conn)
            ]
            counts = await store.index_counts(conn)
        return IndexStatus(
            database=redact_url(self.url),
            embedding_model=counts.embedding_model,
            embedding_dimension=int(counts.embedding_dimension) if counts.embedding_dimension else None,
            sources=sources,
            documents=counts.documents,
            chunks=counts.chunks,
            vocabulary=counts.vocabulary,
            avg_chunk_length=counts.total_length / counts.chunks if counts.chunks else 0.0,
        )

    # --- who sees what (knowledge.access, knowledge.ingest.groups) ---

    async def principals_for(self, person: str | Person | Sequence[str]) -> ResolvedPrincipals:
        """A person's principals (given, admin-mapped, every synced group containing them, `everyone`), each with
        where it came from. `person`: "user:alice@acme.com", a platform identity "slack:U1", or several."""
        return await self.access.principals_for(person)

    async def refresh_groups(self, name: str) -> DirectoryReport:
        """Fetch the source's group membership now (the scheduler does it every `groups_every_seconds`). Raises
        UnknownSource, SourceConfigError (no directory), SourceAuthError / SourceUnavailable (the last good
        membership is kept, for at most GROUP_MEMBERSHIP_TTL_SECONDS)."""
        try:
            return await refresh_directory(self.engine, name)
        finally:
            self.access.invalidate()

    async def group_directories(self) -> list[directory_store.DirectoryState]:
        """Every source's directory: last good refresh, last attempt and error, counts."""
        async with self.engine.connect() as conn:
            return await directory_store.list_states(conn)

    async def explain_access(
        self, person: str | Person | Sequence[str], document: str | None = None, *,
        visible_to: Sequence[str] | None = None,
    ) -> tuple[ResolvedPrincipals, list[DocumentVerdict]]:
        """A person's principals with their origins and, for the documents `document` names (an id, URL,
        `SOURCE:ID` or title, taken literally), whether they may see each and which of its principals matched.
        `visible_to`: only documents these principals may see are looked at (a chat admin's own access; the CLI,
        an operator, passes None)."""
        resolved = await self.access.principals_for(person)
        if document is None:
            return resolved, []
        async with self.engine.connect() as conn:
            found = await directory_store.find_documents(conn, document, visible_to=visible_to)
        return resolved, [verdict(resolved, d) for d in found]
    # Usage and retention (issue 34): what the gaps report and the retention job need from the knowledge side.

    async def documents_of_chunks(self, chunk_ids: Sequence[int]) -> dict[int, usage.DocumentRef]:
        """chunk id → its document (title, source, url, path, last update), for chunks that still exist."""
        async with self.reads.connect() as conn:
            return await usage.documents_of_chunks(conn, chunk_ids)

    async def documents_not_in(self, document_ids: Sequence[int], limit: int = 50) -> tuple[int, list[usage.DocumentRef]]:
        """How many indexed documents are not among `document_ids` (e.g. never cited), and the first `limit`."""
        async with self.reads.connect() as conn:
            return await usage.documents_not_in(conn, document_ids, limit)

    async def forget_turns_older_than(self, days: int) -> int:
        """Retention of conversation memory: turns older than `days`, and the summaries that folded them."""
        async with self.engine.begin() as conn:
            return await conversations.delete_turns_older_than(conn, days)

    async def forget_turn(self, turn_id: int) -> None:
        """One stored turn whose answer was never delivered (its question was taken over or cancelled)."""
        async with self.engine.begin() as conn:
            await conversations.delete_turn(conn, turn_id)

    async def forget_turns_of(self, askers: Sequence[str], principals: Sequence[str] = ()) -> tuple[int, int]:
        """A person's conversation turns (by platform identity), the summaries of conversations they were in, and
        their principals in the audience recorded on other turns."""
        async with self.engine.begin() as conn:
            return await conversations.delete_turns_of(conn, askers, principals)
