"""CLI commands over the bots' state: `ragbot users …`, `ragbot channel-access …`, `ragbot feedback`.

They call the same functions as the `/kb` chat commands (`bot/chat/admin.py`); registered from `bot/cli/main.py`.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from bot.cli.common import with_state
from bot.cli.terminal import console

users_app = typer.Typer(help="Map chat users to principals (whom they ask as in private conversations).",
                        no_args_is_help=True)
channel_app = typer.Typer(help="What a shared channel's answers may draw on besides `everyone` documents.",
                          no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(users_app, name="users")
    app.add_typer(channel_app, name="channel-access")
    app.command("feedback")(feedback)


def _print(text: str) -> None:
    console.print(escape(text.replace("`", "")), highlight=False, soft_wrap=True)


@users_app.command("map")
def users_map(
    identity: Annotated[str, typer.Argument(help="A chat user: slack:<user id> or discord:<user id>.")],
    principal: Annotated[str, typer.Argument(help="Whom they ask as: user:<email>, group:<name>, ...")],
) -> None:
    """Let a chat user ask as PRINCIPAL in DMs and assistant threads."""
    from bot.chat import admin  # deferred: keeps `ragbot --help` fast

    _print(with_state(lambda kb, state: admin.users_map(state, identity, principal, "cli")))


@users_app.command("unmap")
def users_unmap(
    identity: Annotated[str, typer.Argument(help="A chat user: slack:<user id> or discord:<user id>.")],
    principal: Annotated[str | None, typer.Argument(help="One principal (default: all of them).")] = None,
) -> None:
    """Remove a chat user's mapping(s)."""
    from bot.chat import admin  # deferred: keeps `ragbot --help` fast

    _print(with_state(lambda kb, state: admin.users_unmap(state, identity, principal)))


@users_app.command("list")
def users_list(
    identity: Annotated[str | None, typer.Argument(help="Only this chat user.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the identity map."""
    from bot.chat import admin  # deferred: keeps `ragbot --help` fast

    if as_json:
        mappings = with_state(lambda kb, state: state.identity_mappings(identity))
        print(json.dumps([{"identity": m.identity, "principal": m.principal, "mapped_by": m.mapped_by,
                           "mapped_at": m.mapped_at.isoformat()} for m in mappings], indent=2))
        return
    _print(with_state(lambda kb, state: admin.users_list(state, identity)))


@channel_app.command("add")
def channel_add(
    channel: Annotated[str, typer.Argument(help="A channel key: slack:<team id>:<channel id> or discord:<guild>:<channel>.")],
    principal: Annotated[str, typer.Argument(help="user:<email>, group:<name>, ...")],
) -> None:
    """Let everyone in CHANNEL get answers from what PRINCIPAL may see."""
    from bot.chat import admin  # deferred: keeps `ragbot --help` fast

    _print(with_state(lambda kb, state: admin.channel_access_add(state, channel, principal, "cli")))


@channel_app.command("remove")
def channel_remove(
    channel: Annotated[str, typer.Argument(help="A channel key.")],
    principal: Annotated[str, typer.Argument(help="The principal to take away.")],
) -> None:
    """Take a grant away from a channel."""
    from bot.chat import admin  # deferred: keeps `ragbot --help` fast

    _print(with_state(lambda kb, state: admin.channel_access_remove(state, channel, principal)))


@channel_app.command("list")
def channel_list(channel: Annotated[str, typer.Argument(help="A channel key.")]) -> None:
    """What a channel's answers may draw on."""
    from bot.chat import admin  # deferred: keeps `ragbot --help` fast

    _print(with_state(lambda kb, state: admin.channel_access_list(state, channel)))


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
    console.print(table)
