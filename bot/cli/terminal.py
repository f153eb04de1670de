"""The terminal: rich rendering of answers and search results, progress bars, and the interactive chat."""

from __future__ import annotations

import asyncio
import getpass
import shlex
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from bot.chat.render import short_quote
from bot.chat.sanitize import quote_safe
from knowledge import Remedy
from knowledge.answer.generators.passages import breadcrumb
from knowledge.ingest.parsing import SUPPORTED_SUFFIXES

if TYPE_CHECKING:  # the knowledge core (SQLAlchemy and friends) is imported only by commands that use it
    from knowledge import Answer, Citation, IndexStatus, KnowledgeBase, SearchHit, SyncReport, SyncRun

console = Console()
err_console = Console(stderr=True)

# The command that carries out each remedy, for the terminal ({source}: the source's name, quoted for a shell).
CLI_REMEDIES: dict[Remedy, str] = {
    Remedy.ADD_SOURCE: "add one with `ragbot source add`",
    Remedy.REMOVE_SOURCE: "`ragbot source remove {source}`",
    Remedy.SHOW_STATUS: "`ragbot status` shows it",
}


def with_remedy(text: str, remedy: Remedy | None, source: str | None) -> str:
    """`text` followed by the command that fixes it, when it carries a remedy: "… (`ragbot status` shows it)"."""
    hint = CLI_REMEDIES.get(remedy) if remedy is not None else None
    if hint is None:
        return text
    return f"{text} ({hint.format(source=shlex.quote(source or 'NAME'))})"


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
        self.task: TaskID | None = None

    def __enter__(self) -> RichSyncProgress:
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
        f"{len(report.skipped) + len(report.over_limit) + len(report.empty)} skipped, {len(report.failed)} failed "
        f"({report.chunks_written} chunks written, {report.chunks_embedded} embedded, "
        f"{report.chunks_from_cache} from cache, {report.seconds:.1f}s)",
        soft_wrap=True,
    )
    for external_id, reason in report.failed:
        console.print(f"  [red]failed[/] {shown(external_id)}: {shown(reason)}", soft_wrap=True)
    if report.empty:
        names = ", ".join(report.empty[:5]) + (f" and {len(report.empty) - 5} more" if len(report.empty) > 5 else "")
        console.print(f"  [yellow]empty, left out[/] {shown(names)}", soft_wrap=True)
    for line in report.over_limit_lines():
        console.print(f"  [yellow]{shown(line)}[/]", soft_wrap=True)
    for warning in report.warnings:
        text = with_remedy(warning, getattr(warning, "remedy", None), getattr(warning, "source", None))
        console.print(f"  [yellow]warning[/] {shown(text)}", soft_wrap=True)
    if report.skipped:
        console.print(f"  {shown(not_documents_summary([i for i, _ in report.skipped]))}", soft_wrap=True)


def not_documents_summary(names: Sequence[str]) -> str:
    """One line for the files a sync left out because they are not documents (data such as an evaluation set
    next to the handbook, images, archives): how many, of which types, and what ragbot does read. Not a warning:
    nothing went wrong."""
    by_type: dict[str, list[str]] = defaultdict(list)
    for name in names:
        by_type[PurePosixPath(name).suffix.lower() or "no extension"].append(PurePosixPath(name).name)
    kinds = []
    for suffix, files in sorted(by_type.items(), key=lambda item: (-len(item[1]), item[0])):
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        kinds.append(f"{suffix} ({shown})")
    count = len(names)
    return (
        f"{count} {'file is' if count == 1 else 'files are'} not {'a document' if count == 1 else 'documents'} "
        f"and {'was' if count == 1 else 'were'} left out: {'; '.join(kinds)}. "
        f"ragbot indexes {', '.join(SUPPORTED_SUFFIXES)}."
    )


def plain_output() -> bool:
    """Piped to a file or narrower than a table: print plain lines that the terminal (or reader) wraps, instead of
    rich tables and panels whose cells would break titles mid-line."""
    return not console.is_terminal or console.width < 100


def print_table(table: Table) -> None:
    """A list command's table: boxed in a wide terminal; piped (or narrow), plain lines instead, a header line then
    one line per row with its cells separated by tabs, never cut (a cell's own line breaks become " · ")."""
    if not plain_output():
        console.print(table)
        return
    columns = table.columns
    rows = zip(*(list(column.cells) for column in columns), strict=True)
    for cells in [[column.header for column in columns], *rows]:
        plain = [(Text.from_markup(c) if isinstance(c, str) else c).plain if isinstance(c, str | Text) else str(c)
                 for c in cells]
        # Written as is: rich would expand the tabs into spaces. Cells were sanitised (shown) before markup.
        print("\t".join(" · ".join(p.split("\n")) for p in plain), file=console.file)


def render_hits(hits: Sequence[SearchHit]) -> None:
    if not hits:
        console.print("No results.")
        return
    if plain_output():
        for hit in hits:
            # Titles, paths and text come from documents: escaped, so [brackets] in them are shown, not parsed.
            where = shown(section_breadcrumb(hit.title, hit.heading))
            console.print(f"{hit.rank}. [bold]{where}[/] (score {hit.score:.3f})", soft_wrap=True, highlight=False)
            console.print(f"   {shown(hit.path or hit.external_id)}", soft_wrap=True, highlight=False)
            console.print(f"   {shown(' '.join(hit.text.split()))}", soft_wrap=True, highlight=False)
        return
    table = Table(show_lines=True)
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("document")
    table.add_column("text")
    for hit in hits:
        # Titles, paths and text come from documents: sanitised and escaped, so they are shown, never obeyed.
        where = f"[bold]{shown(hit.title)}[/]\n{shown(hit.path or hit.external_id)}" + (
            f"\n[dim]{shown(section_breadcrumb('', hit.heading))}[/]" if hit.heading else ""
        )
        snippet = shown(hit.text if len(hit.text) < 300 else hit.text[:299] + "…")
        table.add_row(str(hit.rank), f"{hit.score:.3f}", where, snippet)
    console.print(table)


def section_breadcrumb(title: str, heading: str) -> str:
    return breadcrumb(title, heading)


def render_answer(answer: Answer) -> None:
    # The answer is Markdown built from document text. In a terminal it is rendered (bold, lists, tables) by rich's
    # Markdown, which never parses rich markup (`[bold]` in a document shows as written) and, with hyperlinks off,
    # shows a link's target beside its text. Piped, it is printed literally as Markdown source (a Text is never
    # parsed), which reads well as it is and is what a script wants.
    if answer.outcome == "uncertain" and answer.mode != "extractive":
        console.print("[yellow]Closest passages: they may not answer the question.[/]")
    if console.is_terminal:
        from rich.markdown import Markdown  # here, not at the top: markdown-it is only needed for an answer

        console.print(Markdown(quote_safe(answer.text), hyperlinks=False))
    else:
        console.print(Text(quote_safe(answer.text)), soft_wrap=plain_output())
    if answer.citations:
        console.print()
        for citation in answer.citations:
            _print_reference(citation)
    if answer.abstained and answer.related:
        console.print()
        console.print("Related documents that may help:")
        for citation in answer.related:
            _print_reference(citation)
    if answer.note:
        console.print(f"[dim]({shown(answer.note)})[/]", soft_wrap=True)


def _print_reference(citation: Citation) -> None:
    location = citation.url or citation.path or citation.external_id
    where = citation.title + (f" › {citation.heading}" if citation.heading else "")
    console.print(f"  [bold][{citation.n}][/] {shown(where)} [dim]{shown(location)}[/]", soft_wrap=True, highlight=False)
    for quote in getattr(citation, "quotes", ()):  # the spans Claude cited (Anthropic Citations)
        console.print(Text(f"      “{short_quote(quote)}”", style="italic"), soft_wrap=True)


def render_searched_for(question: str, answer: Answer) -> None:
    """When a follow-up was rewritten into a standalone query, show (dimmed) what was searched for."""
    if answer.standalone_query and answer.standalone_query.strip() != question.strip():
        console.print(f"[dim]searched for: {shown(answer.standalone_query)}[/]", highlight=False)


def render_status(status: IndexStatus) -> None:
    console.print(f"Database: {shown(status.database)}", soft_wrap=True, highlight=False)
    model = status.embedding_model or "none yet"
    dimensions = f" ({status.embedding_dimension} dimensions)" if status.embedding_dimension else ""
    console.print(f"Embedding model: {shown(model)}{dimensions}", soft_wrap=True, highlight=False)
    console.print(
        f"{status.documents} documents, {status.chunks} chunks, {status.vocabulary} terms, "
        f"{status.avg_chunk_length:.1f} terms per chunk on average", soft_wrap=True,
    )
    if plain_output():
        for s in status.sources:
            synced = s.last_synced_at.strftime("%Y-%m-%d %H:%M") if s.last_synced_at else "never"
            console.print(
                f"{shown(s.name)} ({shown(s.kind)}): {s.documents} documents, {s.chunks} chunks, last synced {synced}, "
                f"last run {describe_run(s.last_run, s.running)}, {shown(s.location or '')}",
                soft_wrap=True, highlight=False,
            )
        running = [s.name for s in status.sources if s.running]
        if running:
            console.print(f"Syncing now: {shown(', '.join(running))}", soft_wrap=True)
        return
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


TERMINAL = "terminal"  # the platform terminal questions are recorded under (the admin page and `ragbot insights`)


def terminal_asker() -> str:
    """Who asks from the terminal: the operator's login name ("terminal:alice"), as recorded with the question."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container running as an anonymous uid)
        name = "operator"
    return f"{TERMINAL}:{name}"


async def record_terminal_question(kb: KnowledgeBase, conversation_id: str, question: str, answer: Answer) -> None:
    """Record a question asked in the terminal, like the chat bots' (platform "terminal", attributed to the
    operator), so the admin page and `ragbot insights` count what was tried before any chat platform was set up."""
    from bot.chat.feedback import remember_answer  # here, not at the top: keeps SQLAlchemy out of `ragbot --help`
    from bot.chat.state import BotState

    await remember_answer(BotState(kb.engine), platform=TERMINAL, conversation_id=conversation_id,
                          asker=terminal_asker(), question=question, answer=answer)


QUIT_WORDS = ("/quit", "/exit", "quit", "exit")
LEAVE_HINT = "Type exit or /quit (or press Ctrl-D or Ctrl-C) to leave; Ctrl-C while an answer runs cancels it."


def chat_session(
    open_kb: Callable[[], Coroutine[Any, Any, KnowledgeBase]], principals: Sequence[str], sources: Sequence[str] | None,
    before: Callable[[KnowledgeBase], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Ask questions in a loop, one conversation per session. Works with piped input too.

    The prompt is read in the main thread, outside the event loop, so Ctrl-C there ends the chat at once (a prompt
    read in a worker thread would keep waiting for Enter and swallow what was typed). Each answer runs as its own
    task; asyncio's runner turns Ctrl-C into cancelling that task, which brings the prompt back.
    """
    with asyncio.Runner() as runner:
        kb = runner.run(open_kb())
        try:
            if before is not None:
                runner.run(before(kb))
            _chat(runner, kb, principals, sources)
        finally:
            runner.run(kb.close())


def _chat(runner: asyncio.Runner, kb: KnowledgeBase, principals: Sequence[str], sources: Sequence[str] | None) -> None:
    from knowledge import QuestionTooLong  # here, not at the top: keeps `ragbot --help` fast

    conversation_id = f"terminal:{uuid.uuid4()}"
    mode = "Claude" if kb.answer_mode == "llm" else "offline excerpts (set ANTHROPIC_API_KEY for composed answers)"
    console.print(f"[bold]ragbot[/] — ask about your documents. Answers: {mode}.")
    console.print(LEAVE_HINT, style="dim", highlight=False)
    while True:
        try:
            question = input("\nyou> ")
        except (EOFError, KeyboardInterrupt):
            console.print()
            return
        question = question.strip()
        if not question:
            continue
        if question.lower() in QUIT_WORDS:
            return
        try:
            kb.check_question(question)
        except QuestionTooLong as exc:
            err_console.print(f"[red]Error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            continue
        try:
            with console.status("Searching…"):
                answer = runner.run(
                    kb.answer(question, principals, conversation_id, sources=sources, asker=terminal_asker())
                )
                runner.run(record_terminal_question(kb, conversation_id, question, answer))
        except KeyboardInterrupt:
            console.print("[dim](cancelled)[/]")
            continue
        console.print("[bold]ragbot>[/]")
        render_searched_for(question, answer)
        render_answer(answer)
