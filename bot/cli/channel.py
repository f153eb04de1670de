"""`ragbot channel …` (per-channel settings), `ragbot insights` (gaps and citations) and `ragbot forget-user`.

The same functions as `/kb channel …` and `/kb gaps` (bot/chat/admin.py, bot/chat/insights.py); registered from
bot/cli/main.py. Whoever runs the CLI holds the database, so they are an operator: every question is shown, a
private conversation's without its asker.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from bot.cli.admin import chat_admin, print_plain, reply
from bot.cli.common import fail, print_json, run_sync, with_state
from bot.settings import BotSettings

channel_app = typer.Typer(help="Per-channel settings: sources, help-channel auto-answers, answer mode.",
                          no_args_is_help=True)
ChannelArg = Annotated[str, typer.Argument(help="A channel key: slack:<team id>:<channel id> or discord:<guild>:<channel>.")]


def register(app: typer.Typer) -> None:
    app.add_typer(channel_app, name="channel")
    app.command("insights")(insights)
    app.command("forget-user")(forget_user)


def _check_channel(channel: str) -> None:
    parts = channel.split(":")
    if len(parts) != 3 or parts[0] not in ("slack", "discord") or not all(parts):
        fail(f"{channel!r} is not a channel key: use slack:<team id>:<channel id> or discord:<guild id>:<channel id>")


@channel_app.command("show")
def show(channel: ChannelArg, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """A channel's settings."""
    from bot.chat.channels import channel_settings  # deferred: keeps `ragbot --help` fast

    _check_channel(channel)
    if as_json:
        print(json.dumps(with_state(lambda kb, state: channel_settings(state, channel)).to_dict(), indent=2))
        return
    reply(lambda kb, state: chat_admin().channel_show(kb, state, channel))


@channel_app.command("sources")
def sources(
    channel: ChannelArg,
    action: Annotated[str, typer.Argument(help="add or remove.")],
    name: Annotated[str, typer.Argument(help="A source name (ragbot source list).")],
) -> None:
    """Only these sources answer in CHANNEL (none listed: every source)."""
    _check_channel(channel)
    if action not in ("add", "remove"):
        fail("the action is add or remove, e.g. ragbot channel sources slack:T1:C2 add handbook")
    reply(lambda kb, st: chat_admin().channel_sources(kb, st, channel, action, name, "cli"))


@channel_app.command("auto")
def auto(channel: ChannelArg, state: Annotated[str, typer.Argument(help="on or off.")]) -> None:
    """Answer top-level questions in CHANNEL without a mention (only when there is an answer)."""
    _check_channel(channel)
    if state not in ("on", "off"):
        fail("the state is on or off, e.g. ragbot channel auto slack:T1:C2 on")
    reply(lambda kb, st: chat_admin().channel_auto(st, channel, state == "on", "cli"))


@channel_app.command("mode")
def mode(channel: ChannelArg, value: Annotated[str, typer.Argument(metavar="MODE", help="public or private.")]) -> None:
    """Answer in public, or privately to the asker (private delivery arrives with the permissions work)."""
    from bot.chat.channels import parse_mode  # deferred: keeps `ragbot --help` fast

    _check_channel(channel)
    chosen = parse_mode(value)
    if chosen is None:
        fail("the mode is public or private")
    reply(lambda kb, st: chat_admin().channel_mode(st, channel, chosen, "cli"))


def insights(
    since: Annotated[str, typer.Option("--since", metavar="SPAN", help="How far back: 30d, 2w, 12h.")] = "30d",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (with every question).")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV, one row per gap topic.")] = False,
) -> None:
    """What the bot misses: questions declined, answered as uncertain or rated 👎, grouped by topic; the most-cited
    documents, documents never cited, and cited documents not updated in a year."""
    from bot.chat.insights import build_report, gaps_text, parse_since  # deferred: keeps `ragbot --help` fast

    if as_json and as_csv:
        fail("choose one of --json and --csv")
    span = run_sync(lambda: parse_since(since))
    report = with_state(lambda kb, state: build_report(kb, state, span))
    if as_json:
        print_json(report.to_dict())
    elif as_csv:
        print(report.to_csv(), end="")
    else:
        print_plain(gaps_text(report, limit=50))
        if report.stale_cited:
            print_plain("Cited but not updated in a year: " + "; ".join(f"{d.title} ({d.source})"
                                                                  for d, _ in report.stale_cited))
        if report.never_cited:
            print_plain("Never cited (first few): " + "; ".join(f"{d.title} ({d.source})" for d in report.never_cited[:10]))


def forget_user(
    person: Annotated[str, typer.Argument(metavar="user:EMAIL", help="The person, as user:<email>.")],
    identity: Annotated[
        list[str] | None,
        typer.Option("--identity", metavar="IDENTITY", help="A chat identity of theirs too (slack:U123, discord:42); repeatable."),
    ] = None,
    no_lookup: Annotated[bool, typer.Option("--no-lookup", help="Do not ask Slack (users.lookupByEmail).")] = False,
) -> None:
    """Delete a person's questions, answers, conversation memory and feedback (a data-protection request).

    Their chat identities come from the identity map (`ragbot users map`), Slack's users.lookupByEmail when
    SLACK_BOT_TOKEN is set, and --identity."""
    from bot.chat.retention import forget_user as forget  # deferred: keeps `ragbot --help` fast
    from bot.slack.directory import slack_identities_for_email  # deferred: keeps `ragbot --help` fast

    if not person.startswith("user:") or "@" not in person:
        fail(f"{person!r} is not a person: use user:<email>, e.g. user:alice@example.com")
    settings = BotSettings()

    async def lookup(email: str) -> list[str]:
        return await slack_identities_for_email(settings, email)

    result = with_state(lambda kb, state: forget(kb, state, person, list(identity or ()), lookup=None if no_lookup else lookup))
    print_plain(result.text())
