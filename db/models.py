"""SQLAlchemy models. The schema itself is created and changed only by the Alembic migrations in `alembic/`.

Chunks carry a copy of their document's access list, source and date so that both the vector index scan and the
BM25 scan can filter on plain columns, without a join that would stop Postgres using the index order.
"""

from __future__ import annotations

from datetime import datetime

from pgvector.sqlalchemy import SPARSEVEC, Vector
from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Lexeme ids index the BM25 sparse vectors; every vector has this many dimensions (pgvector's maximum).
BM25_SPARSE_DIM = 1_000_000_000


class Base(DeclarativeBase):
    pass


class Source(Base):
    __tablename__ = "sources"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    kind: Mapped[str] = mapped_column(Text)  # "folder", "beir", later "confluence", "gdrive"
    location: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_synced_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Migration 0003: what the source's factory rebuilds it from (never secrets), where the next sync starts, and
    # its schedules (None: on demand).
    config: Mapped[dict] = mapped_column(JSONB, server_default="{}")
    checkpoint: Mapped[str | None] = mapped_column(Text)
    schedule_seconds: Mapped[int | None] = mapped_column(Integer)
    prune_seconds: Mapped[int | None] = mapped_column(Integer)
    last_pruned_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SyncRun(Base):
    """One sync run (migration 0003): trigger (schedule, cli, chat), outcome and counts."""

    __tablename__ = "sync_runs"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    source_id: Mapped[int] = mapped_column(ForeignKey("sources.id", ondelete="CASCADE"))
    trigger: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text, server_default="running")  # running, ok, failed, interrupted
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    full_sync: Mapped[bool] = mapped_column(default=False)
    pruned: Mapped[bool] = mapped_column(default=False)
    added: Mapped[int] = mapped_column(Integer, default=0)
    updated: Mapped[int] = mapped_column(Integer, default=0)
    metadata_updated: Mapped[int] = mapped_column(Integer, default=0)
    deleted: Mapped[int] = mapped_column(Integer, default=0)
    unchanged: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict | None] = mapped_column(JSONB)


class Document(Base):
    __tablename__ = "documents"
    __table_args__ = (UniqueConstraint("source_id", "external_id"),)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    source_id: Mapped[int] = mapped_column(ForeignKey("sources.id", ondelete="CASCADE"))
    external_id: Mapped[str] = mapped_column(Text)
    title: Mapped[str] = mapped_column(Text)
    url: Mapped[str | None] = mapped_column(Text)
    path: Mapped[str | None] = mapped_column(Text)  # breadcrumb: folder path, space > parent page, ...
    author: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    content_hash: Mapped[str] = mapped_column(String(64))
    access: Mapped[list[str]] = mapped_column(ARRAY(Text))
    indexed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    version: Mapped[str | None] = mapped_column(Text)  # migration 0003: "<pipeline recipe>|<source version>"


class Chunk(Base):
    """Partitioned by source (migration 0019): one partition per source, so the key includes `source_id`."""

    __tablename__ = "chunks"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    heading: Mapped[str] = mapped_column(Text)  # "Section > Subsection"
    token_count: Mapped[int] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(String(64))  # hash of the text that was embedded
    embedding = mapped_column(Vector())  # dimension follows the configured model (see kb_meta)
    tsv = mapped_column(TSVECTOR)
    lexical_len: Mapped[int] = mapped_column(Integer)  # BM25 document length: lexeme occurrences in tsv
    bm25 = mapped_column(SPARSEVEC(BM25_SPARSE_DIM))  # document-side BM25 weights (store.write_documents)
    # the lexemes the chunk repeats, by tier of term frequency (migration 0010; NULL: written before it)
    tf_tiers = mapped_column(TSVECTOR, nullable=True)
    bm25_avgdl = mapped_column(Float)  # the avgdl those weights were computed with (NULL: before migration 0006)
    access: Mapped[list[str]] = mapped_column(ARRAY(Text))
    source_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # the partition key
    doc_updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class EmbeddingCacheEntry(Base):
    __tablename__ = "embedding_cache"
    model: Mapped[str] = mapped_column(Text, primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    embedding = mapped_column(Vector())


class Lexeme(Base):
    """The BM25 vocabulary: one row per stemmed term, with its document frequency over all chunks."""

    __tablename__ = "lexemes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    lexeme: Mapped[str] = mapped_column(Text, unique=True)
    df: Mapped[int] = mapped_column(Integer)


class CorpusStats(Base):
    """A single row of BM25 corpus statistics, kept current by triggers on `chunks`."""

    __tablename__ = "corpus_stats"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    n_chunks: Mapped[int] = mapped_column(BigInteger)
    total_len: Mapped[int] = mapped_column(BigInteger)
    weights_avgdl: Mapped[float] = mapped_column(Float)  # the avgdl the stored chunk weights were computed with
    k1: Mapped[float] = mapped_column(Float)
    b: Mapped[float] = mapped_column(Float)


class KbMeta(Base):
    """Small key/value facts about the index, such as which embedding model filled it."""

    __tablename__ = "kb_meta"
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class ConversationTurn(Base):
    __tablename__ = "conversation_turns"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[str] = mapped_column(Text)  # indexed with id (migration 0002)
    question: Mapped[str] = mapped_column(Text)
    standalone_query: Mapped[str | None] = mapped_column(Text)  # what was searched; NULL in turns from before 0002
    answer: Mapped[str] = mapped_column(Text)
    principals: Mapped[list[str]] = mapped_column(ARRAY(Text))
    asker: Mapped[str | None] = mapped_column(Text)  # e.g. "slack:U123"
    cited_chunk_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), server_default="{}")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ConversationSummary(Base):
    """Older turns of a conversation folded into one rolling summary (turns with id <= through_turn_id)."""

    __tablename__ = "conversation_summaries"
    conversation_id: Mapped[str] = mapped_column(Text, primary_key=True)
    summary: Mapped[str] = mapped_column(Text)
    through_turn_id: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
