"""What every command module of the CLI shares: running a command's work, its errors worded for the terminal, and
--json output. Imported at the top of `bot.cli.main` and of each command-group module (so none of them imports
another to reach these).

The knowledge core's errors never name a command (the same errors reach Slack and Discord): where the fix is an
action on a source they carry it as a `Remedy`, and `cli_message` adds the command that does it here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer
from rich.markup import escape
from sqlalchemy.exc import DBAPIError

from bot.chat.sanitize import quote_safe, strip_control
from bot.cli.terminal import err_console, with_remedy
from db.errors import DatabaseUnavailable
from knowledge.errors import KnowledgeError, SourceConflict, UnknownSource

if TYPE_CHECKING:
    from knowledge.kb import KnowledgeBase

T = TypeVar("T")

def cli_message(exc: Exception) -> str:
    """The knowledge core's typed errors, worded for the command line (naming the command or flag that fixes them)."""
    if isinstance(exc, SourceConflict):
        where = f"{exc.kind} {exc.location}" if exc.location else exc.kind
        return f"source {exc.name!r} already indexes {where}; pick another name with --source"
    if isinstance(exc, UnknownSource) and exc.names:  # raised with a ready message otherwise (sync by name)
        return (f"unknown source {', '.join(exc.names)}; indexed sources: {', '.join(exc.known) or 'none yet'} "
                "(check --source)")
    if isinstance(exc, KnowledgeError):
        return with_remedy(str(exc), exc.remedy, exc.source)
    return str(exc)


def fail(message: str) -> NoReturn:
    """A clear one-line error and exit code 2, for anything the user can fix."""
    # escape: paths and messages may contain [brackets]; soft_wrap: one line, however long.
    one_line = " ".join(strip_control(message).split("\n"))
    err_console.print(f"[red]Error:[/] {escape(one_line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def print_json(payload: object) -> None:
    """--json output: every string in it passes through quote_safe, like every other surface (document titles,
    paths and text are data, never mentions, markup or terminal control)."""
    print(json.dumps(_quote_safe_strings(payload), indent=2))


def _quote_safe_strings(value: object) -> object:
    if isinstance(value, str):
        return quote_safe(value)
    if isinstance(value, dict):
        return {_quote_safe_strings(k): _quote_safe_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_quote_safe_strings(v) for v in value]
    return value


def run_async(factory: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await factory()

    return run_sync(lambda: asyncio.run(main()))


def run_sync(work: Callable[[], T]) -> T:
    """Run `work`, turning the errors a user can fix into one clear line and exit code 2."""
    try:
        return work()
    except (KnowledgeError, DatabaseUnavailable, FileNotFoundError, ValueError) as exc:
        fail(cli_message(exc))
    except DBAPIError as exc:
        fail(f"database error: {exc.orig or exc}".splitlines()[0])


def with_kb(action: Callable[[KnowledgeBase], Awaitable[T]]) -> T:
    """Open the knowledge base (starting the embedded database if needed), run `action`, always close."""
    from knowledge.kb import KnowledgeBase  # lazy for start-up speed: the knowledge base's wiring

    async def go() -> T:
        kb = await KnowledgeBase.open()
        try:
            return await action(kb)
        finally:
            await kb.close()

    return run_async(go)


async def prepare_query_encoder(kb: KnowledgeBase, quiet: bool) -> None:
    """After an ingest or sync (torch is loaded then): build the fast question encoder's file if it is missing."""
    if not kb.query_encoder_missing():
        return
    if quiet:
        await kb.prepare_query_encoder()
        return
    with err_console.status("Preparing the fast question encoder (ONNX, once; a few seconds)…"):
        built = await kb.prepare_query_encoder()
    if built:
        err_console.print(f"Questions now use the {escape(built)}.", highlight=False, soft_wrap=True)
