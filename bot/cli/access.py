"""`ragbot access explain|groups|refresh`, and the `--as` expansion `ragbot search/ask` use.

Registered on the main Typer app by `bot.cli` (`register_access_commands(app)`). Every command is a thin shell over
`KnowledgeBase.explain_access`, `group_directories`, `refresh_groups` and `principals_for` (knowledge.access).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from bot.cli.common import fail, print_json, with_kb
from bot.cli.terminal import console, err_console, print_table, shown
from knowledge import KnowledgeError

if TYPE_CHECKING:
    from knowledge import KnowledgeBase
    from knowledge.ingest.groups import DirectoryReport

access_app = typer.Typer(help="Who sees what: a person's principals, synced group membership.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def register_access_commands(app: typer.Typer) -> None:
    app.add_typer(access_app, name="access")


def checked_as(given: Sequence[str]) -> list[str]:
    """The `--as` principals, each of a known kind (everyone, user:, group:, domain:): `--as grp:eng` is an error
    listing them (InvalidPrincipal, a one-line message), never a search that silently matches nothing."""
    from bot.platforms import platforms
    from knowledge import check_as_principal  # here, not at the top: knowledge.access loads SQLAlchemy

    platforms()  # every registered platform's name is a chat identity kind (`--as slack:U1`)
    return [check_as_principal(p) for p in given]


async def as_principals(kb: KnowledgeBase, given: Sequence[str] | None, no_expand: bool) -> list[str]:
    """What `--as` searches with: exactly the principals given (`--no-expand`), or each person's principals
    expanded through every synced group directory (the resolver the chat bots use too). Nothing given: everyone.

    `--as group:<source>/<name>` asks as a member of that source's group; an unscoped `--as group:<name>` is the
    local group folder `.access` files name (never a synced directory's group of the same name: a note says so)."""
    if not given:
        return ["everyone"]
    checked = checked_as(given)
    for principal in checked:
        synced = await kb.access.synced_groups_named(principal)
        if synced:
            err_console.print(f"[yellow]Note:[/] {shown(principal)} is a local group (folder .access files, "
                              f"mappings); the synced groups of that name are {shown(', '.join(synced))}: ask as "
                              "one of those for its members' documents.", highlight=False, soft_wrap=True)
    if no_expand:
        return [*checked, "everyone"]
    resolved = await kb.principals_for(checked)
    if resolved.expired:
        err_console.print(f"[yellow]Note:[/] the group directory of {shown(', '.join(resolved.expired))} is older "
                          "than GROUP_MEMBERSHIP_TTL_SECONDS: its groups grant nothing until `ragbot access refresh` "
                          "succeeds.", highlight=False, soft_wrap=True)
    if resolved.expired_groups:
        err_console.print(f"[yellow]Note:[/] {shown(', '.join(resolved.expired_groups))} could not be listed for "
                          "longer than GROUP_MEMBERSHIP_TTL_SECONDS: they grant nothing until a refresh lists them "
                          "(`ragbot access groups` shows why).", highlight=False, soft_wrap=True)
    return list(resolved.principals)


def _refreshed(report: DirectoryReport) -> str:
    line = (f"{report.groups} groups, {report.memberships} memberships ({report.api_calls} API calls, "
            f"{report.seconds:.1f}s).")
    if report.skipped:
        line += (f" Skipped {len(report.skipped)} group(s) whose members could not be listed (they keep their last "
                 f"members until those expire): " + "; ".join(f"{g}: {why}" for g, why in report.skipped.items()))
    return line


async def refresh_groups_after_sync(kb: KnowledgeBase, name: str, quiet: bool) -> None:
    """After `ragbot sync`: refresh the source's group membership too, if it has a directory. A failure is shown
    (the last good membership is kept) but does not fail the sync."""
    from knowledge.ingest.groups import has_directory  # deferred: keeps `ragbot --help` fast

    info = next((s for s in await kb.list_sources() if s.name == name), None)
    if info is None or not has_directory(info.kind, info.config):
        return
    try:
        report = await kb.refresh_groups(name)
    except KnowledgeError as exc:
        err_console.print(f"[yellow]Group membership not refreshed:[/] {shown(str(exc))}", highlight=False,
                          soft_wrap=True)
        return
    if not quiet or report.skipped:
        console.print(f"Group membership of {shown(name)}: {shown(_refreshed(report))}", highlight=False,
                      soft_wrap=True)


@access_app.command("explain")
def explain(
    person: Annotated[str, typer.Argument(metavar="PERSON", help="user:alice@acme.com (or slack:U1 / discord:ID "
                                                                 "for a chat identity's admin mappings).")],
    document: Annotated[str | None, typer.Argument(metavar="[DOCUMENT]", help="A document id, URL, SOURCE:ID or "
                                                                                 "title.")] = None,
    as_json: JsonOption = False,
) -> None:
    """A person's principals and where each came from (and, for a group, which source's directory defines it);
    with DOCUMENT, whether they may see it and why."""
    from knowledge import describe_scope, parse_principal  # here: knowledge.access loads SQLAlchemy

    if person.split(":", 1)[0] not in ("slack", "discord"):
        try:
            person = parse_principal(person)
        except ValueError as exc:
            fail(str(exc))
    resolved, verdicts = with_kb(lambda kb: kb.explain_access(person, document))
    if document is not None and not verdicts:
        fail(f"no indexed document matches {document!r}: give its id, URL, SOURCE:ID or title "
             "(`ragbot search` shows them)")
    if as_json:
        print_json({**resolved.to_dict(), "documents": [
            {"source": v.source, "id": v.external_id, "title": v.title, "visible": v.visible,
             "matched": list(v.matched), "access": list(v.access)} for v in verdicts]})
        return
    table = Table("principal", "why")
    for principal in resolved.principals:
        why = "; ".join(o.describe() for o in resolved.origins.get(principal, ()))
        table.add_row(shown(principal), shown(why))
    console.print(f"[bold]{shown(resolved.person)}[/] holds {len(resolved.principals)} principals:", highlight=False)
    print_table(table)
    for principal in resolved.principals:  # a group is only ever the group of the directory that defines it
        if (scope := describe_scope(principal)) is not None:
            console.print(f"{shown(principal)} is defined by {shown(scope)}.", highlight=False, soft_wrap=True)
    if resolved.expired:
        console.print(f"[yellow]Not counted:[/] the group directory of {shown(', '.join(resolved.expired))} is past "
                      "its TTL (its groups grant nothing until a refresh succeeds).", highlight=False)
    if resolved.expired_groups:
        console.print(f"[yellow]Not counted:[/] {shown(', '.join(resolved.expired_groups))} could not be listed for "
                      "longer than the TTL (they grant nothing until a refresh lists them).", highlight=False)
    for v in verdicts:
        name = f"{shown(v.title or v.external_id)} ({shown(v.source)}:{shown(v.external_id)})"
        if v.visible:
            console.print(f"[green]May see[/] {name}: it is shared with {shown(', '.join(v.matched))}.",
                          highlight=False)
        else:
            console.print(f"[red]May not see[/] {name}: it is shared with "
                          f"{shown(', '.join(v.access) or 'nobody')}, none of which they hold.", highlight=False)


@access_app.command("groups")
def groups(as_json: JsonOption = False) -> None:
    """Each source's synced group directory: last good refresh, last error, groups and memberships."""
    states = with_kb(lambda kb: kb.group_directories())
    if as_json:
        print_json({"directories": [
            {"source": s.source, "kind": s.kind, "refreshed_at": s.refreshed_at.isoformat() if s.refreshed_at else None,
             "attempted_at": s.attempted_at.isoformat() if s.attempted_at else None, "error": s.error,
             "groups": s.groups, "memberships": s.memberships, "api_calls": s.api_calls,
             "skipped": list(s.skipped)} for s in states]})
        return
    if not states:
        console.print("No group directory yet: Confluence sources and Google Drive sources added with --admin-email "
                      "get one at their next `ragbot sync NAME` (or `ragbot access refresh NAME`).")
        return
    table = Table("source", "kind", "refreshed", "groups", "memberships", "last error")
    for s in states:
        refreshed = f"{s.refreshed_at:%Y-%m-%d %H:%M:%S}" if s.refreshed_at else "never"
        problem = (f"[red]{shown(s.error[:200])}[/]" if s.error else
                   f"[yellow]skipped {shown('; '.join(s.skipped)[:300])}[/]" if s.skipped else "")
        table.add_row(shown(s.source), s.kind, refreshed, str(s.groups), str(s.memberships), problem)
    print_table(table)


@access_app.command("refresh")
def refresh(name: Annotated[str, typer.Argument(metavar="SOURCE", help="The source whose groups to refresh.")],
            as_json: JsonOption = False) -> None:
    """Refresh a source's group membership now (a removal from a group takes effect at once)."""
    report = with_kb(lambda kb: kb.refresh_groups(name))
    if as_json:
        print_json(report.to_dict())
        return
    console.print(f"Group membership of {shown(name)}: {shown(_refreshed(report))}", highlight=False,
                  soft_wrap=True)
