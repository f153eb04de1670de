"""`ragbot source add|list|remove`, `ragbot sync`, `ragbot sync-runs` and `ragbot scheduler`.

Registered on the main Typer app by `bot.cli` (`register_source_commands(app)`). Every command is a thin shell
over `KnowledgeBase` (add_source, list_sources, remove_source, sync_source, sync_runs) and `knowledge.ingest.schedule`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.table import Table

from bot.cli.access import refresh_groups_after_sync
from bot.cli.common import cli_message, fail, prepare_query_encoder, print_json, with_kb
from bot.cli.terminal import (
    RichSyncProgress,
    console,
    describe_run,
    err_console,
    print_table,
    render_sync_report,
    shown,
)
from bot.settings import BotSettings
from knowledge import KnowledgeError

if TYPE_CHECKING:
    from knowledge import KnowledgeBase, SourceInfo, SyncReport, SyncRun

source_app = typer.Typer(help="Stored sources that `ragbot sync` and the scheduler keep fresh.", no_args_is_help=True)
add_app = typer.Typer(help="Add a source (its connection is checked first; a broken source is not saved).",
                      no_args_is_help=True)
source_app.add_typer(add_app, name="add")

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
EveryOption = Annotated[
    str | None, typer.Option("--every", help="Sync on this interval (e.g. 30m, 1h, 1d); default: on demand only.")
]
PruneOption = Annotated[
    str, typer.Option("--prune-every", help="Look for deleted items (and re-check permissions) this often.")
]
GroupsOption = Annotated[
    str, typer.Option("--groups-every", help="Refresh the source's group membership (who is in which group) this "
                                             "often; a removal from a group takes effect within one interval.")
]


def register_source_commands(app: typer.Typer) -> None:
    app.add_typer(source_app, name="source")
    app.command("sync")(sync)
    app.command("sync-runs")(sync_runs)
    app.command("scheduler")(scheduler)


def _intervals(every: str | None, prune_every: str) -> tuple[int | None, int]:
    from knowledge import parse_interval  # deferred: keeps `ragbot --help` fast

    try:
        return (parse_interval(every) if every else None), parse_interval(prune_every)
    except ValueError as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


VISIBILITIES: tuple[Literal["permissions", "everyone"], ...] = ("permissions", "everyone")  # --visibility


def _save(name: str, kind: str, config: dict[str, Any], every: int | None, prune_every: int) -> None:
    async def go(kb: KnowledgeBase) -> SourceInfo:
        return await kb.add_source(name, kind, config, schedule_seconds=every, prune_seconds=prune_every)

    info = with_kb(go)
    from knowledge import format_interval  # deferred: keeps `ragbot --help` fast

    console.print(
        f"Saved source [bold]{shown(info.name)}[/] ({info.kind}, {shown(info.location or '')}); syncs "
        f"{'every ' + format_interval(every) if every else 'on demand'}. Run `ragbot sync {shown(info.name)}` to index it now."
    )


@add_app.command("folder")
def add_folder(
    name: Annotated[str, typer.Argument(help="A name for the source.")],
    path: Annotated[Path, typer.Argument(help="The folder to index.")],
    every: EveryOption = None,
    prune_every: PruneOption = "1d",
) -> None:
    """A local folder (.md, .txt, .html, .pdf, .docx; `.access` files set who may see what)."""
    if not path.is_dir():
        fail(f"no such folder: {path}")
    seconds, prune = _intervals(every, prune_every)
    _save(name, "folder", {"path": str(path.resolve())}, seconds, prune)


@add_app.command("confluence")
def add_confluence(
    name: Annotated[str, typer.Argument(help="A name for the source.")],
    url: Annotated[str, typer.Option("--url", help="The wiki root: https://acme.atlassian.net/wiki (Cloud) or the "
                                                   "server URL with any context path (Data Center).")],
    space: Annotated[list[str], typer.Option("--space", help="A space KEY (repeatable).")],
    cql: Annotated[str | None, typer.Option("--cql", help="Extra CQL that narrows what is synced.")] = None,
    email: Annotated[str | None, typer.Option("--email", help="Cloud: the account's email (Basic auth with an "
                                                                 "API token). Omit for Data Center (Bearer PAT).")] = None,
    token_env: Annotated[str, typer.Option("--token-env", help="The environment variable holding the token.")] = "CONFLUENCE_API_TOKEN",
    exclude_label: Annotated[list[str] | None, typer.Option("--exclude-label", help="Skip pages with this label (repeatable).")] = None,
    everyone_group: Annotated[str, typer.Option("--everyone-group", help="The all-users group (its pages are for everyone).")] = "confluence-users",
    every: EveryOption = None,
    visibility: Annotated[str, typer.Option("--visibility", help="permissions: honour space permissions and page "
                                                                 "restrictions; everyone: index everything for everyone.")] = "permissions",
    prune_every: PruneOption = "1d",
    groups_every: GroupsOption = "1h",
) -> None:
    """Confluence Cloud or Data Center spaces (REST API v1), with permissions."""
    seconds, prune = _intervals(every, prune_every)
    config = {"url": url.rstrip("/"), "spaces": space, "cql": cql, "email": email, "token_env": token_env,
              "exclude_labels": exclude_label or [], "everyone_group": everyone_group, "visibility": visibility,
              "groups_every_seconds": _intervals(None, groups_every)[1]}
    _save(name, "confluence", config, seconds, prune)


@add_app.command("gdrive")
def add_gdrive(
    name: Annotated[str, typer.Argument(help="A name for the source.")],
    folder: Annotated[list[str] | None, typer.Option("--folder", help="A folder id or link (repeatable); "
                                                                       "everything below it is indexed.")] = None,
    shared_drive: Annotated[list[str] | None, typer.Option("--shared-drive", help="A shared drive id or link "
                                                                                   "(repeatable): the whole drive.")] = None,
    credentials_env: Annotated[str, typer.Option("--credentials-env", help="The environment variable holding the "
                                                                           "service account's JSON key (else "
                                                                           "GOOGLE_APPLICATION_CREDENTIALS names "
                                                                           "the key file).")] = "GOOGLE_SERVICE_ACCOUNT_JSON",
    subject: Annotated[str | None, typer.Option("--subject", help="Read as this user (domain-wide "
                                                                     "delegation).")] = None,
    admin_email: Annotated[str | None, typer.Option("--admin-email", help="A Workspace admin the service account "
                                                                             "acts as to read Google Groups and their "
                                                                             "members (domain-wide delegation of "
                                                                             "admin.directory.group.readonly).")] = None,
    groups_every: GroupsOption = "1h",
    every: EveryOption = None,
    visibility: Annotated[str, typer.Option("--visibility", help="permissions: each file's sharing decides who "
                                                                 "sees it; everyone: index everything for "
                                                                 "everyone.")] = "permissions",
    prune_every: PruneOption = "1d",
) -> None:
    """Google Drive folders and shared drives (kept fresh through the Changes API), with permissions."""
    from knowledge.sources.gdrive import GoogleDriveConfig, drive_id_from  # deferred: keeps `ragbot --help` fast

    if not folder and not shared_drive:
        fail("give at least one --folder ID or --shared-drive ID (the last part of its drive.google.com link)")
    if visibility not in VISIBILITIES:
        fail(f"--visibility must be permissions or everyone, not {visibility!r}")
    try:
        folders = tuple(dict.fromkeys(drive_id_from(f) for f in folder or []))
        drives = tuple(dict.fromkeys(drive_id_from(d) for d in shared_drive or []))
    except ValueError as exc:
        fail(str(exc))
        raise AssertionError("unreachable") from exc
    seconds, prune = _intervals(every, prune_every)
    if admin_email is not None and ("@" not in admin_email or " " in admin_email.strip()):
        fail(f"--admin-email must be a Workspace admin's email address, not {admin_email!r}")
    config = GoogleDriveConfig(folders=folders, shared_drives=drives, credentials_env=credentials_env,
                               subject=subject, visibility=visibility,
                               admin_email=admin_email.strip().lower() if admin_email else None)
    stored = config.to_dict()
    if admin_email:  # only a source with an admin to act as has a group directory to refresh
        stored["groups_every_seconds"] = _intervals(None, groups_every)[1]
    _save(name, "gdrive", stored, seconds, prune)


@source_app.command("list")
def list_sources(as_json: JsonOption = False) -> None:
    """Stored sources: kind, schedule, documents, last run."""
    from knowledge import format_interval  # deferred: keeps `ragbot --help` fast

    sources = with_kb(lambda kb: kb.list_sources())
    if as_json:
        print_json({"sources": [s.to_dict() for s in sources]})
        return
    if not sources:
        console.print("No sources yet: `ragbot source add folder NAME PATH`, `ragbot source add confluence ...` or "
                      "`ragbot source add gdrive ...`.")
        return
    table = Table("source", "kind", "schedule", "documents", "last run", "where")
    for s in sources:
        schedule = format_interval(s.schedule_seconds)
        if s.schedule_seconds and s.prune_seconds:
            schedule += f"\nprune {format_interval(s.prune_seconds)}"
        table.add_row(shown(s.name), s.kind, schedule, str(s.documents), describe_run(s.last_run, s.running),
                      shown(_where(s)))
    print_table(table)


def _where(info: SourceInfo) -> str:
    if info.kind == "confluence":
        spaces = ", ".join(info.config.get("spaces") or [])
        edition = "Cloud" if info.config.get("email") else "Data Center"
        return f"{info.location} ({edition}; spaces {spaces}; {info.config.get('visibility', 'permissions')})"
    if info.kind == "gdrive":
        parts = [f"folders {', '.join(info.config.get('folders') or [])}" if info.config.get("folders") else "",
                 f"shared drives {', '.join(info.config.get('shared_drives') or [])}"
                 if info.config.get("shared_drives") else "",
                 f"as {info.config['subject']}" if info.config.get("subject") else "",
                 info.config.get("visibility", "permissions")]
        return f"{info.location} ({'; '.join(p for p in parts if p)})"
    return info.location or ""


@source_app.command("remove")
def remove(name: Annotated[str, typer.Argument(help="The source to forget.")]) -> None:
    """Remove a source, everything indexed from it and its run history (the originals are not touched)."""
    removed = with_kb(lambda kb: kb.remove_source(name))
    console.print(f"Removed source {shown(name)} and its {removed} documents.")


def sync(
    name: Annotated[str | None, typer.Argument(help="The source to sync (default: every stored source).")] = None,
    full: Annotated[bool, typer.Option("--full", help="List everything, not just changes since the last sync, "
                                                      "and prune deleted items (nothing unchanged is re-embedded).")] = False,
    as_json: JsonOption = False,
) -> None:
    """Bring stored sources up to date (incremental from each one's checkpoint)."""
    async def go(kb: KnowledgeBase) -> tuple[list[SyncReport], list[tuple[str, str]]]:
        names = [name] if name else [s.name for s in await kb.list_sources() if _syncable(s.kind)]
        reports, errors = [], []
        for source in names:
            try:
                with RichSyncProgress(source) as progress:
                    report = await kb.sync_source(source, trigger="cli", full=full, progress=progress)
            except KnowledgeError as exc:
                if name:
                    raise
                errors.append((source, cli_message(exc)))
                continue
            if not as_json:
                render_sync_report(report)
            reports.append(report)
            await refresh_groups_after_sync(kb, source, quiet=as_json)
        await prepare_query_encoder(kb, as_json)
        return reports, errors

    reports, errors = with_kb(go)
    if as_json:
        print_json({"reports": [r.to_dict() for r in reports],
                    "errors": [{"source": s, "error": e} for s, e in errors]})
    for _source, error in errors:
        err_console.print(f"[red]Error:[/] {shown(error)}", highlight=False, soft_wrap=True)
    if not name and not reports and not errors and not as_json:
        fail("no sources to sync: add one with `ragbot source add folder NAME PATH` (or `ingest PATH`)")
    if errors:
        raise typer.Exit(1)


def _syncable(kind: str) -> bool:
    from knowledge.sources.base import registered_kinds  # deferred: keeps `ragbot --help` fast

    return kind in registered_kinds()


def sync_runs(
    name: Annotated[str | None, typer.Argument(help="Only this source.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="How many runs, newest first.", min=1, max=1000)] = 20,
    as_json: JsonOption = False,
) -> None:
    """Recorded sync runs: trigger, start and end, counts, error."""
    runs = with_kb(lambda kb: kb.sync_runs(name, limit))
    if as_json:
        print_json({"runs": [r.to_dict() for r in runs]})
        return
    if not runs:
        console.print("No sync runs yet.")
        return
    table = Table("run", "source", "trigger", "status", "started", "took", "counts")
    for run in runs:
        counts = ", ".join(f"{n} {label}" for n, label in (
            (run.added, "added"), (run.updated, "updated"), (run.deleted, "deleted"), (run.unchanged, "unchanged"),
            (run.skipped, "skipped"), (run.failed, "failed")) if n) or "no changes"
        if run.error:
            counts += f"\n[red]{shown(run.error[:300])}[/]"
        table.add_row(str(run.id), shown(run.source), shown(run.trigger), _status(run),
                      f"{run.started_at:%Y-%m-%d %H:%M:%S}", _took(run), counts)
    print_table(table)


def _status(run: SyncRun) -> str:
    colour = {"ok": "green", "failed": "red", "interrupted": "yellow", "running": "bold yellow"}.get(run.status, "white")
    return f"[{colour}]{run.status}[/]" + (" +prune" if run.pruned else "")


def _took(run: SyncRun) -> str:
    if run.finished_at is None:
        return "…"
    return f"{(run.finished_at - run.started_at).total_seconds():.1f}s"


def scheduler(
    refresh: Annotated[float, typer.Option("--refresh", help="Re-read the stored sources this often (seconds).")] = 60.0,
) -> None:
    """Run scheduled syncs only (for deployments that separate the bots from syncing). Stop with Ctrl-C."""
    from knowledge.ingest.schedule import format_interval, start_scheduler  # deferred: keeps `ragbot --help` fast

    async def go(kb: KnowledgeBase) -> None:
        handle = await start_scheduler(kb, refresh_seconds=refresh)
        sources = [s for s in await kb.list_sources() if s.schedule_seconds]
        if sources:
            listed = ", ".join(f"{s.name} every {format_interval(s.schedule_seconds)}" for s in sources)
            console.print(f"Scheduler running: {shown(listed)}. Ctrl-C stops it.")
        else:
            console.print("Scheduler running, but no source has a schedule yet (`ragbot source add ... --every 1h`); "
                          "new sources are picked up automatically.")
        from bot.app import stop_on_signals  # deferred: keeps `ragbot --help` fast
        from bot.chat.retention import RetentionService  # deferred (start-up); RETENTION_DAYS as in `ragbot run`

        retention = RetentionService(lambda: kb, BotSettings().retention_days)
        await retention.start()
        stop = stop_on_signals()
        try:
            await stop.wait()
        finally:
            await retention.stop()
            await handle.stop()
            console.print("Scheduler stopped.")

    with_kb(go)


def _print_json(payload: object) -> None:
    print_json(payload)
