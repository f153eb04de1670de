"""CLI commands over the bots' state: `ragbot users …`, `ragbot channel-access …`, `ragbot feedback`, `ragbot audit`.

They call the same functions as the `/kb` chat commands (`bot/chat/admin.py`); registered from `bot/cli/main.py`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from bot.cli.common import with_state
from bot.cli.terminal import console, print_table

if TYPE_CHECKING:
    from bot.chat.state import BotState
    from knowledge import KnowledgeBase

users_app = typer.Typer(help="Map chat users to principals (whom they ask as in private conversations).",
                        no_args_is_help=True)
channel_app = typer.Typer(help="What a shared channel's answers may draw on besides `everyone` documents.",
                          no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(users_app, name="users")
    app.add_typer(channel_app, name="channel-access")
    app.command("feedback")(feedback)
    app.command("audit")(audit)


def print_plain(text: str) -> None:
    """A chat admin reply on the terminal: its `code` marks dropped, the rest as it reads."""
    console.print(escape(text.replace("`", "")), highlight=False, soft_wrap=True)


def chat_admin() -> ModuleType:
    """bot.chat.admin, imported when a command runs: it loads the knowledge core, which `ragbot --help` must not."""
    from bot.chat import admin

    return admin


def reply(action: Callable[[KnowledgeBase, BotState], Awaitable[str]]) -> None:
    """Run one of the `/kb` admin actions (bot.chat.admin) on the bot's state and print its reply."""
    print_plain(with_state(action))


@users_app.command("map")
def users_map(
    identity: Annotated[str, typer.Argument(help="A chat user: slack:<user id> or discord:<user id>.")],
    principal: Annotated[str, typer.Argument(help="Whom they ask as: user:<email>, group:<name>, ...")],
) -> None:
    """Let a chat user ask as PRINCIPAL in DMs and assistant threads."""
    reply(lambda kb, state: chat_admin().users_map(state, identity, principal))


@users_app.command("unmap")
def users_unmap(
    identity: Annotated[str, typer.Argument(help="A chat user: slack:<user id> or discord:<user id>.")],
    principal: Annotated[str | None, typer.Argument(help="One principal (default: all of them).")] = None,
) -> None:
    """Remove a chat user's mapping(s)."""
    reply(lambda kb, state: chat_admin().users_unmap(state, identity, principal))


@users_app.command("list")
def users_list(
    identity: Annotated[str | None, typer.Argument(help="Only this chat user.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the identity map."""
    if as_json:
        mappings = with_state(lambda kb, state: state.identity_mappings(identity))
        print(json.dumps([{"identity": m.identity, "principal": m.principal, "mapped_by": m.mapped_by,
                           "mapped_at": m.mapped_at.isoformat()} for m in mappings], indent=2))
        return
    reply(lambda kb, state: chat_admin().users_list(state, identity))


@channel_app.command("add")
def channel_add(
    channel: Annotated[str, typer.Argument(help="A channel key: slack:<team id>:<channel id> or discord:<guild>:<channel>.")],
    principal: Annotated[str, typer.Argument(help="user:<email>, group:<name>, ...")],
) -> None:
    """Let everyone in CHANNEL get answers from what PRINCIPAL may see."""
    reply(lambda kb, state: chat_admin().channel_access_add(state, channel, principal))


@channel_app.command("remove")
def channel_remove(
    channel: Annotated[str, typer.Argument(help="A channel key.")],
    principal: Annotated[str, typer.Argument(help="The principal to take away.")],
) -> None:
    """Take a grant away from a channel."""
    reply(lambda kb, state: chat_admin().channel_access_remove(state, channel, principal))


@channel_app.command("list")
def channel_list(channel: Annotated[str, typer.Argument(help="A channel key.")]) -> None:
    """What a channel's answers may draw on."""
    reply(lambda kb, state: chat_admin().channel_access_list(state, channel))


def feedback(
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many, newest first.", min=1, max=10000)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Recent feedback on the bots' answers: who rated what, the question, what was searched, which chunks."""
    records = with_state(lambda kb, state: state.recent_feedback(limit))
    if as_json:
        print(json.dumps({"feedback": [r.to_dict() for r in records]}, indent=2))
        return
    if not records:
        console.print("No feedback yet.")
        return
    table = Table("when", "rating", "user", "question", "searched", "chunks")
    for r in records:
        table.add_row(r.created_at.strftime("%Y-%m-%d %H:%M"), "👍" if r.rating == "up" else "👎",
                      escape(r.platform_user), escape(r.question), escape(r.standalone_query),
                      ", ".join(str(c) for c in r.chunk_ids))
    print_table(table)


def audit(
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many, newest first.", min=1, max=100000)] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Who changed who may see what: identity mappings and channel grants, from the CLI and from chat, with
    refused attempts (a workspace admin handing out a principal they do not hold)."""
    entries = with_state(lambda kb, state: state.audit_entries(limit))
    if as_json:
        print(json.dumps({"audit": [e.to_dict() for e in entries]}, indent=2))
        return
    if not entries:
        console.print("No access changes yet.")
        return
    for e in entries:  # one line each, newest first: easy to grep
        print_plain(f"{e.at:%Y-%m-%d %H:%M:%S} {e.actor} ({e.actor_role}) {e.action} {e.subject} "
                    f"{e.principal or '-'}: {e.outcome}")
