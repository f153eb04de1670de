"""`ragbot`: the command line. Every command is a thin shell over `knowledge.kb.KnowledgeBase`."""

from __future__ import annotations

import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich.markup import escape
from typer import _click as click
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from bot.cli.access import as_principals, checked_as, register_access_commands
from bot.cli.admin import register as register_admin_commands
from bot.cli.channel import register as register_channel_commands
from bot.cli.common import fail, prepare_query_encoder, print_json, run_async, run_sync, with_kb
from bot.cli.sources import register_source_commands, remove
from bot.cli.terminal import (
    RichSyncProgress,
    chat_session,
    console,
    err_console,
    record_terminal_question,
    render_answer,
    render_hits,
    render_searched_for,
    render_status,
    render_sync_report,
    shown,
    terminal_asker,
)
from bot.logs import configure_logging, secret_values
from bot.settings import BotSettings, dotenv_warnings
from db.embedded import stop_embedded
from db.settings import DatabaseSettings
from knowledge import KnowledgeSettings


class _PlainArgument(TyperArgument):
    """An argument shown the way command-line users expect (`QUESTION`, `[FILE]`, `PATHS...`), without its Python
    type: Typer would print `{question}` in the usage line and `<str>` beside it."""

    @property
    def display_name_raw(self) -> str:
        return self.metavar or (self.name or "").upper()

    def display_type_rich(self, ctx: click.Context) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def _plain_parameters(params: list) -> None:
    """Flags show no value, options show their metavar (`--as PRINCIPAL`), never `<bool>` or `<list[str]>`."""
    for param in params:
        if type(param) is TyperArgument:
            param.__class__ = _PlainArgument
        elif isinstance(param, TyperOption) and param.metavar is None:
            param.metavar = "" if param.is_flag else (param.name or "value").upper()


class PlainHelpCommand(TyperCommand):
    def get_help_option(self, ctx: click.Context):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class PlainHelpGroup(TyperGroup):
    """The root command: every command and group below it gets plain help (so commands added later do too)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _make_plain(self)

    def get_help_option(self, ctx: click.Context):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


def _make_plain(command: click.Command) -> None:
    _plain_parameters(command.params)
    for sub in getattr(command, "commands", {}).values():
        if type(sub) is TyperCommand:
            sub.__class__ = PlainHelpCommand
        elif type(sub) is TyperGroup:
            sub.__class__ = PlainHelpGroup
        _make_plain(sub)


app = typer.Typer(help="ragbot: answers questions from your documents, with citations.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False, cls=PlainHelpGroup)
db_app = typer.Typer(help="Database commands.", no_args_is_help=True)
app.add_typer(db_app, name="db")

if TYPE_CHECKING:
    from knowledge import Answer, KnowledgeBase, Mode, SearchResults

# `ragbot ingest`'s exit status when a file could not be indexed (the others were): scripts and CI notice it.
# 2 stays the status of a usage error (bot.cli.common.fail).
INGEST_FAILED_EXIT = 3

AsOption = Annotated[
    list[str] | None,
    typer.Option("--as", metavar="PRINCIPAL", help="Search as this principal (repeatable), e.g. user:alice@example.com or group:eng; the "
                              "groups containing it (synced from the sources) are added unless --no-expand. "
                              "Documents shared with 'everyone' are always included."),
]
SourceOption = Annotated[
    list[str] | None, typer.Option("--source", metavar="SOURCE", help="Only this source (repeatable).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
NoExpandOption = Annotated[bool, typer.Option("--no-expand", help="Search exactly the --as principals, without "
                                                                 "adding the groups that contain them.")]


@app.callback()
def main() -> None:
    try:
        settings = BotSettings()
    except ValidationError as exc:
        error = exc.errors()[0]
        fail(f"{'.'.join(map(str, error['loc'])).upper()}: {error['msg']} (check the environment or .env)")
    try:
        secrets = secret_values(settings, KnowledgeSettings(), DatabaseSettings())
    except ValueError:  # a bad setting is reported by the command that reads it, with its own clear message
        secrets = secret_values(settings)
    configure_logging(settings.log_level, settings.log_format, secrets)
    for warning in dotenv_warnings():  # a misspelt setting in .env would otherwise do nothing, silently
        err_console.print(f"[yellow]Warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)


@app.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Folders or files to index.")],
    source: Annotated[str | None, typer.Option("--source", metavar="NAME", help="Source name (default: the folder's name).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Index folders of .md, .txt, .html, .pdf, .docx, .csv and .xlsx files (incremental: unchanged files are
    skipped; empty files are reported and left out). Exit status 3 when any file failed to index."""
    for path in paths:
        if not path.exists():
            fail(f"no such file or folder: {path}")

    async def sync_all(kb: KnowledgeBase) -> list[dict[str, object]]:
        reports = []
        for path in paths:
            folder = await kb.folder_source(path, source)
            with RichSyncProgress(folder.spec.name) as progress:
                report = await kb.sync(folder, progress)
            if not as_json:
                render_sync_report(report)
            reports.append(report.to_dict())
        await prepare_query_encoder(kb, as_json)
        return reports

    reports = with_kb(sync_all)
    if as_json:
        print_json({"reports": reports})
    if any(report["failed"] for report in reports):
        raise typer.Exit(INGEST_FAILED_EXIT)  # the summary and each failed file were printed above


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to search for.")],
    k: Annotated[int, typer.Option("-k", metavar="N", help="How many results.", min=1, max=200)] = 10,
    mode: Annotated[str, typer.Option("--mode", metavar="MODE", help="hybrid, dense or lexical.")] = "hybrid",
    principals: AsOption = None,
    no_expand: NoExpandOption = False,
    sources: SourceOption = None,
    updated_after: Annotated[
        datetime | None, typer.Option("--updated-after", metavar="DATE", help="Only documents updated on or after this date (YYYY-MM-DD).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Search the index and show the best chunks."""
    from knowledge import MODES, SearchFilters  # deferred: keeps `ragbot --help` fast

    if not query.strip():
        fail("the search query is empty")
    if mode not in MODES:
        fail(f"--mode must be one of {', '.join(MODES)}")

    async def run_search(kb: KnowledgeBase) -> SearchResults:
        await kb.check_sources(sources)
        since = updated_after.replace(tzinfo=updated_after.tzinfo or UTC) if updated_after else None
        filters = SearchFilters(tuple(await as_principals(kb, principals, no_expand)),
                                tuple(sources) if sources else None, since)
        return await kb.search(query, filters, k=k, mode=mode)

    results = with_kb(run_search)
    if as_json:
        print_json({"results": [hit.to_dict() for hit in results.hits]})
    else:
        render_hits(results.hits)


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="Your question.")],
    principals: AsOption = None,
    no_expand: NoExpandOption = False,
    sources: SourceOption = None,
    conversation: Annotated[
        str | None,
        typer.Option("--conversation", help="Continue this conversation (follow-ups are understood from its "
                                            "earlier questions). Default: a new conversation for each call."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Answer a question from the documents, with numbered citations."""
    if not question.strip():
        fail("the question is empty")
    conversation_id = conversation or f"cli:{uuid.uuid4()}"

    async def run_ask(kb: KnowledgeBase) -> Answer:
        kb.check_question(question)
        await kb.check_sources(sources)
        answer = await kb.answer(question, await as_principals(kb, principals, no_expand), conversation_id,
                                 sources=sources, asker=terminal_asker())
        await record_terminal_question(kb, conversation_id, question, answer)
        return answer

    answer = with_kb(run_ask)
    if as_json:
        print_json({**answer.to_dict(), "conversation_id": conversation_id})
    else:
        render_searched_for(question, answer)
        render_answer(answer)
        if conversation is None:  # on stderr, so piping the answer stays clean
            err_console.print(f"[dim]Follow up with: --conversation {shown(conversation_id)}[/]", highlight=False)


@app.command()
def chat(principals: AsOption = None, sources: SourceOption = None) -> None:
    """Chat with the knowledge base in the terminal."""

    from knowledge import KnowledgeBase  # deferred: keeps `ragbot --help` fast

    def session() -> None:
        chat_session(KnowledgeBase.open, checked_as(principals) if principals else ["everyone"], sources,
                     lambda kb: kb.check_sources(sources))

    run_sync(session)


@app.command()
def status(as_json: JsonOption = False) -> None:
    """What is indexed: sources, documents, chunks, model."""

    result = with_kb(lambda kb: kb.status())
    if as_json:
        print_json(result.to_dict())
    else:
        render_status(result)


@app.command("remove-source", hidden=True)
def remove_source(name: Annotated[str, typer.Argument(help="The source to forget.")]) -> None:
    """The old spelling of `ragbot source remove NAME`, kept hidden so existing scripts keep working."""
    remove(name)


@app.command()
def run(
    headless: Annotated[bool, typer.Option(
        "--headless", help="No terminal chat: serve /healthz, /metrics and /admin (with ADMIN_TOKEN) and run scheduled "
                           "syncs until stopped, as TERMINAL_CHAT=false does. Chat platforms whose tokens are set "
                           "still start.")] = False,
    port: Annotated[int | None, typer.Option("--port", metavar="PORT", min=0, max=65535,
                                             help="The HTTP port (default: the PORT setting, 3000).")] = None,
    host: Annotated[str | None, typer.Option("--host", metavar="HOST",
                                             help="The address to listen on (default: the HOST setting, 0.0.0.0).")] = None,
) -> None:
    """Start the bots (Slack and/or Discord, per the tokens set) with /healthz and /metrics; with no chat tokens,
    the terminal chat, or with --headless the server alone."""
    from bot.app import run as run_bots  # deferred: keeps `ragbot --help` fast

    overrides: dict[str, object] = {"terminal_chat": False} if headless else {}
    if port is not None:
        overrides["port"] = port
    if host is not None:
        overrides["host"] = host
    settings = BotSettings().model_copy(update=overrides)
    run_bots(settings, runner=run_async, terminal_chat=lambda: chat(principals=None, sources=None))


@app.command(name="eval")
def evaluate(
    file: Annotated[Path | None, typer.Argument(help="JSONL, one question per line with \"question\", \"relevant\" (document ids) and, for --answers, \"facts\".")] = None,
    beir: Annotated[Path | None, typer.Option("--beir", metavar="DIR", help="A BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv.")] = None,
    corpus: Annotated[
        Path | None,
        typer.Option("--corpus", metavar="PATH", help="A folder of documents (ids: paths under it) or a BEIR-style "
                                      "corpus.jsonl (\"_id\", \"title\", \"text\" per line; ids: _ids), indexed for "
                                      "the eval only; FILE's questions are searched and answered within it."),
    ] = None,
    no_memory: Annotated[
        bool, typer.Option("--no-memory", help="Search each question alone, ignoring its history (the baseline).")
    ] = False,
    last_two: Annotated[
        bool, typer.Option("--last-two", help="Search the last two user turns together (the other baseline).")
    ] = False,
    compare_memory: Annotated[
        bool, typer.Option("--compare-memory", help="Follow-ups only: conversation memory against the last question "
                                                    "alone and the last two user turns, nDCG@10 and answer facts.")
    ] = False,
    mode: Annotated[str, typer.Option("--mode", metavar="MODE", help="hybrid, dense, lexical, or all.")] = "all",
    principals: AsOption = None,
    sources: SourceOption = None,
    answers: Annotated[
        bool, typer.Option("--answers", help="Score the answers instead of retrieval: expected facts quoted, right "
                                             "document cited, no unrelated source, unanswerable questions declined.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Measure retrieval (precision@5, recall@10, recall@100, MRR@10, MAP@100, nDCG@10 per mode), or with
    --answers the answers themselves."""
    from bot.cli.evaluate import run_eval  # deferred: keeps `ragbot --help` fast
    from knowledge import MODES  # deferred: keeps `ragbot --help` fast

    if (file is None) == (beir is None):
        fail("give either an eval FILE.jsonl or --beir DIR")
    if corpus is not None and beir is not None:
        fail("--corpus goes with an eval FILE.jsonl; a --beir folder has its own corpus")
    for target in (file, beir, corpus):
        if target is not None and not target.exists():
            fail(f"no such file or folder: {target}")
    if compare_memory:
        if file is None:
            fail("--compare-memory needs an eval FILE.jsonl of conversations")
        from bot.cli.evaluate import render_memory_comparison, run_memory_comparison  # deferred: keeps --help fast

        table = with_kb(lambda kb: run_memory_comparison(kb, file, principals or ["everyone"], sources or [],
                                                         corpus=corpus))
        if as_json:
            print_json(table)
        else:
            render_memory_comparison(table)
        return
    if answers:
        if file is None:
            fail("--answers needs an eval FILE.jsonl with expected facts")
        from bot.cli.evaluate import render_answer_eval, run_answer_eval  # deferred: keeps `ragbot --help` fast

        summary = with_kb(lambda kb: run_answer_eval(kb, file, principals or ["everyone"], sources or [], corpus=corpus))
        if as_json:
            print_json(summary)
        else:
            render_answer_eval(summary)
        return
    modes: tuple[Mode, ...]
    if mode == "all":
        modes = ("dense", "lexical", "hybrid")
    elif mode in MODES:
        modes = (mode,)
    else:
        fail("--mode must be one of hybrid, dense, lexical, all")

    if no_memory and last_two:
        fail("give --no-memory or --last-two, not both")
    strategy = "last-two" if last_two else ("last" if no_memory else "memory")
    results = with_kb(lambda kb: run_eval(kb, file, beir, modes, principals or [], sources or [], corpus=corpus,
                                          strategy=strategy))
    if as_json:
        print_json(results)
    else:
        from bot.cli.evaluate import render_eval  # deferred: keeps `ragbot --help` fast

        render_eval(results)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or upgrade the schema to the newest migration."""
    from db.engine import create_engine, database_url  # deferred: keeps `ragbot --help` fast
    from db.migrate import current_revision, upgrade_to_head  # deferred: keeps `ragbot --help` fast

    async def go() -> str | None:
        engine = create_engine(database_url())
        try:
            await upgrade_to_head(engine)
            return await current_revision(engine)
        finally:
            await engine.dispose()

    console.print(f"Database schema is at revision {run_async(go)}.")


@db_app.command("stop")
def db_stop() -> None:
    """Stop the embedded Postgres (it is started again by the next command that needs it)."""
    settings = DatabaseSettings()
    if settings.database_url:
        fail("DATABASE_URL is set: ragbot is not running an embedded database")
    console.print("Stopped the embedded database." if stop_embedded(settings.home) else "The embedded database was not running.")


register_admin_commands(app)  # users, channel-access, feedback
register_channel_commands(app)  # channel, insights, forget-user
register_source_commands(app)  # source, sync, sync-runs, scheduler
register_access_commands(app)  # access explain|groups|refresh

if __name__ == "__main__":
    sys.exit(app())
