"""The terminal: rich rendering of answers and search results, progress bars, and the interactive chat."""

from __future__ import annotations

import asyncio
import uuid
from typing import Sequence

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from knowledge.answering import Answer
from knowledge.indexing import SyncReport
from knowledge.kb import IndexStatus, KnowledgeBase
from knowledge.retrieval import SearchHit
from knowledge.sanitize import quote_safe
from knowledge.sources.base import SyncRun

console = Console()
err_console = Console(stderr=True)


def shown(value: object) -> str:
    """Document-derived text for a rich markup string: sanitised (no escape sequences, no mentions or image
    markup), then markup-escaped so `[brackets]` in it are shown, never parsed."""
    return escape(quote_safe(str(value)))


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

    def start(self, total: int | None) -> None:
        self.task = self.progress.add_task("", total=total, label=self.label)

    def grow(self, count: int) -> None:
        """More items arrived (a source paging through its changes)."""
        if self.task is not None:
            current = self.progress.tasks[self.task].total or 0
            self.progress.update(self.task, total=current + count)

    def advance(self, label: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, advance=1, description=shown(label[-50:]))


def render_sync_report(report: SyncReport) -> None:
    console.print(
        f"[bold]{shown(report.source)}[/]: {len(report.added)} added, {len(report.updated)} updated, "
        f"{report.unchanged} unchanged, {len(report.metadata_updated)} metadata-only, {len(report.deleted)} deleted, "
        f"{len(report.skipped)} skipped, {len(report.failed)} failed "
        f"({report.chunks_written} chunks written, {report.chunks_embedded} embedded, "
        f"{report.chunks_from_cache} from cache, {report.seconds:.1f}s)"
    )
    for external_id, reason in report.skipped:
        console.print(f"  [yellow]skipped[/] {shown(external_id)}: {shown(reason)}")
    for external_id, reason in report.failed:
        console.print(f"  [red]failed[/] {shown(external_id)}: {shown(reason)}")
    for warning in report.warnings:
        console.print(f"  [yellow]warning[/] {shown(warning)}")


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
        # Titles, paths and text come from documents: sanitised and escaped, so they are shown, never obeyed.
        where = f"[bold]{shown(hit.title)}[/]\n{shown(hit.path or hit.external_id)}" + (
            f"\n[dim]{shown(hit.heading)}[/]" if hit.heading else ""
        )
        snippet = shown(hit.text if len(hit.text) < 300 else hit.text[:299] + "…")
        table.add_row(str(hit.rank), f"{hit.score:.3f}", where, snippet)
    console.print(table)


def render_answer(answer: Answer) -> None:
    # The answer is built from document text: printed literally (a Text is never parsed as markup or Markdown),
    # so `<!channel> …`, `[bold]` or `![image](url)` in a document show as written.
    console.print(Text(quote_safe(answer.text)))
    if answer.citations:
        console.print()
        for citation in answer.citations:
            location = citation.url or citation.path or citation.external_id
            heading = f" › {citation.heading}" if citation.heading else ""
            console.print(f"  [bold][{citation.n}][/] {shown(citation.title + heading)} [dim]{shown(location)}[/]")
    if answer.note:
        console.print(f"[dim]({shown(answer.note)})[/]")


def render_searched_for(question: str, answer: Answer) -> None:
    """When a follow-up was rewritten into a standalone query, show (dimmed) what was searched for."""
    if answer.standalone_query and answer.standalone_query.strip() != question.strip():
        console.print(f"[dim]searched for: {shown(answer.standalone_query)}[/]", highlight=False)


def render_status(status: IndexStatus) -> None:
    console.print(f"Database: {shown(status.database)}")
    console.print(f"Embedding model: {shown(status.embedding_model)} ({status.embedding_dimension} dimensions)")
    console.print(
        f"{status.documents} documents, {status.chunks} chunks, {status.vocabulary} terms, "
        f"{status.avg_chunk_length:.1f} terms per chunk on average"
    )
    table = Table("source", "kind", "documents", "chunks", "last synced", "last run", "location")
    for s in status.sources:
        table.add_row(shown(s.name), shown(s.kind), str(s.documents), str(s.chunks),
                      s.last_synced_at.strftime("%Y-%m-%d %H:%M") if s.last_synced_at else "never",
                      describe_run(s.last_run, s.running), shown(s.location or ""))
    console.print(table)
    running = [s.name for s in status.sources if s.running]
    if running:
        console.print(f"Syncing now: {shown(', '.join(running))}")


def describe_run(run: SyncRun | None, running: bool = False) -> str:
    """A sync run in a few words: "ok 2026-11-22 10:00 (cli): 3 added, 1 failed", "running since ..."."""
    if running:
        since = f" (run started {run.started_at:%Y-%m-%d %H:%M})" if run is not None and run.status == "running" else ""
        return f"[bold yellow]running[/]{since}"
    if run is None:
        return "never"
    colour = {"ok": "green", "failed": "red", "interrupted": "yellow"}.get(run.status, "white")
    counts = ", ".join(f"{n} {label}" for n, label in (
        (run.added, "added"), (run.updated, "updated"), (run.deleted, "deleted"), (run.failed, "failed")) if n)
    text = f"[{colour}]{run.status}[/] {run.started_at:%Y-%m-%d %H:%M} ({shown(run.trigger)})"
    if counts:
        text += f": {counts}"
    if run.error:
        text += f"\n[dim]{shown(run.error[:160])}[/]"
    return text


async def chat_loop(kb: KnowledgeBase, principals: Sequence[str], sources: Sequence[str] | None) -> None:
    """Ask questions in a loop, one conversation per session. Works with piped input too."""
    conversation_id = f"terminal:{uuid.uuid4()}"
    mode = "Claude" if kb.answer_mode == "llm" else "offline excerpts (set ANTHROPIC_API_KEY for composed answers)"
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
            answer = await kb.answer(question, principals, conversation_id, sources=sources, asker="terminal")
        console.print("[bold]ragbot>[/]")
        render_searched_for(question, answer)
        render_answer(answer)
