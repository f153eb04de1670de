"""The terminal: rich rendering of answers and search results, progress bars, and the interactive chat."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Sequence

from rich.console import Console
from rich.markup import escape
from rich.markdown import Markdown
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:  # the knowledge core (SQLAlchemy and friends) is imported only by commands that use it
    from knowledge.answering import Answer
    from knowledge.indexing import SyncReport
    from knowledge.kb import IndexStatus, KnowledgeBase
    from knowledge.retrieval import SearchHit

console = Console()
err_console = Console(stderr=True)


class RichSyncProgress:
    """A progress bar on stderr for a sync (keeps stdout clean for --json)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.progress = Progress(
            TextColumn("[bold]{task.fields[label]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=err_console, transient=True,
        )
        self.task = None

    def __enter__(self) -> "RichSyncProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, total: int) -> None:
        self.task = self.progress.add_task("", total=total, label=self.label)

    def advance(self, label: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, advance=1, description=label[-50:])


def render_sync_report(report: SyncReport) -> None:
    console.print(
        f"[bold]{escape(report.source)}[/]: {len(report.added)} added, {len(report.updated)} updated, "
        f"{report.unchanged} unchanged, {len(report.metadata_updated)} metadata-only, {len(report.deleted)} deleted, "
        f"{len(report.skipped)} skipped, {len(report.failed)} failed "
        f"({report.chunks_written} chunks written, {report.chunks_embedded} embedded, "
        f"{report.chunks_from_cache} from cache, {report.seconds:.1f}s)"
    )
    for external_id, reason in report.skipped:
        console.print(f"  [yellow]skipped[/] {escape(external_id)}: {escape(reason)}")
    for external_id, reason in report.failed:
        console.print(f"  [red]failed[/] {escape(external_id)}: {escape(reason)}")
    for warning in report.warnings:
        console.print(f"  [yellow]warning[/] {escape(warning)}")


def render_hits(hits: Sequence[SearchHit]) -> None:
    if not hits:
        console.print("No results.")
        return
    table = Table(show_lines=True)
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("document")
    table.add_column("text")
    for hit in hits:
        # Titles, paths and text come from documents: escaped, so [brackets] in them are shown, not parsed as markup.
        where = f"[bold]{escape(hit.title)}[/]\n{escape(hit.path or hit.external_id)}" + (
            f"\n[dim]{escape(hit.heading)}[/]" if hit.heading else ""
        )
        snippet = escape(hit.text if len(hit.text) < 300 else hit.text[:299] + "…")
        table.add_row(str(hit.rank), f"{hit.score:.3f}", where, snippet)
    console.print(table)


def render_answer(answer: Answer) -> None:
    console.print(Markdown(answer.text))
    if answer.citations:
        console.print()
        for citation in answer.citations:
            location = citation.url or citation.path or citation.external_id
            heading = f" › {citation.heading}" if citation.heading else ""
            console.print(f"  [bold][{citation.n}][/] {escape(citation.title + heading)} [dim]{escape(location)}[/]")
    if answer.note:
        console.print(f"[dim]({escape(answer.note)})[/]")


def render_status(status: IndexStatus) -> None:
    console.print(f"Database: {status.database}")
    console.print(f"Embedding model: {status.embedding_model} ({status.embedding_dimension} dimensions)")
    console.print(
        f"{status.documents} documents, {status.chunks} chunks, {status.vocabulary} terms, "
        f"{status.avg_chunk_length:.1f} terms per chunk on average"
    )
    table = Table("source", "kind", "documents", "chunks", "last synced", "location")
    for s in status.sources:
        table.add_row(escape(s.name), s.kind, str(s.documents), str(s.chunks),
                      s.last_synced_at.strftime("%Y-%m-%d %H:%M") if s.last_synced_at else "never", escape(s.location or ""))
    console.print(table)


async def chat_loop(kb: KnowledgeBase, principals: Sequence[str], sources: Sequence[str] | None) -> None:
    """Ask questions in a loop, one conversation per session. Works with piped input too."""
    conversation_id = f"terminal:{uuid.uuid4()}"
    mode = "Claude" if kb.answerer.generator else "offline excerpts (set ANTHROPIC_API_KEY for composed answers)"
    console.print(f"[bold]ragbot[/] — ask about your documents. Answers: {mode}. Type /quit to leave.")
    while True:
        try:
            question = await asyncio.to_thread(input, "\nyou> ")
        except (EOFError, KeyboardInterrupt):
            console.print()
            return
        question = question.strip()
        if not question:
            continue
        if question in ("/quit", "/exit", "quit", "exit"):
            return
        with console.status("Searching…"):
            answer = await kb.answer(question, principals, conversation_id, sources=sources)
        console.print("[bold]ragbot>[/]")
        render_answer(answer)
