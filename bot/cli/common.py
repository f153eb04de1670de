"""What every `ragbot` command module shares: clear one-line errors, JSON output, running a coroutine, and opening
the knowledge base (and the bot's own tables) for one command. Its own module so the command modules (bot/cli/*.py)
import it at the top: none of them imports bot/cli/main.py, which only puts them together.

The knowledge core's errors never name a command (the same errors reach Slack and Discord): where the fix is an
action on a source they carry it as a `Remedy`, and `cli_message` adds the command that does it.

Start-up: `ragbot --help` imports this, so nothing here loads SQLAlchemy, NumPy or the model at import time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.markup import escape

from bot.chat.sanitize import quote_safe, strip_control
from bot.cli.terminal import err_console, with_remedy
from db.errors import DatabaseUnavailable
from knowledge import EmbeddingModelError, EvalFileError, KnowledgeError, SourceConflict, UnknownSource

if TYPE_CHECKING:
    from bot.chat.state import BotState
    from knowledge import KnowledgeBase

T = TypeVar("T")


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


def cli_message(exc: Exception) -> str:
    """The knowledge core's typed errors, worded for the command line (naming the command or flag that fixes them)."""
    if isinstance(exc, SourceConflict):
        where = f"{exc.kind} {exc.location}" if exc.location else exc.kind
        return f"source {exc.name!r} already indexes {where}; pick another name with --source"
    if isinstance(exc, UnknownSource) and exc.names:  # raised with a ready message otherwise (sync by name)
        return (f"unknown source {', '.join(exc.names)}; indexed sources: {', '.join(exc.known) or 'none yet'} "
                "(check --source)")
    if isinstance(exc, KnowledgeError):  # the core says what fixes it (a Remedy); the command is named here
        return with_remedy(str(exc), exc.remedy, exc.source)
    return str(exc)


def run_async(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_sync(lambda: asyncio.run(factory()))


def run_sync(work: Callable[[], T]) -> T:
    """Run `work`, turning the errors a user can fix into one clear line and exit code 2."""
    from sqlalchemy.exc import DBAPIError  # here, not at the top: loading SQLAlchemy would slow `ragbot --help`

    try:
        return work()
    except (KnowledgeError, EvalFileError, EmbeddingModelError, DatabaseUnavailable, FileNotFoundError, ValueError) as exc:
        fail(cli_message(exc))
    except DBAPIError as exc:
        fail(f"database error: {exc.orig or exc}".splitlines()[0])
    raise AssertionError("unreachable: fail() exits")


def with_kb(action: Callable[[KnowledgeBase], Awaitable[T]]) -> T:
    """Open the knowledge base (starting the embedded database if needed), run `action`, always close."""
    from knowledge import KnowledgeBase  # here, not at the top: keeps SQLAlchemy out of `ragbot --help`

    async def go() -> T:
        kb = await KnowledgeBase.open()
        try:
            return await action(kb)
        finally:
            await kb.close()

    return run_async(go)


def with_state(action: Callable[[KnowledgeBase, BotState], Awaitable[T]]) -> T:
    """`with_kb`, with the bot's own tables over the same engine (bot.chat.state.BotState)."""
    from bot.chat.state import BotState  # here, not at the top: keeps SQLAlchemy out of `ragbot --help`

    return with_kb(lambda kb: action(kb, BotState(kb.engine)))


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
