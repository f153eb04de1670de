"""Refreshing a source's group directory (issue 33): the job the scheduler runs every `--groups-every` and
`ragbot sync NAME` runs after the sync.

Which sources have one: Confluence with `visibility=permissions` (its groups gate pages), and Google Drive with an
`admin_email` (the Directory API needs an admin to act as). A refresh either stores the whole new membership or
records its error and keeps the last good one (which the resolver trusts for at most one TTL). A group whose
members alone could not be listed is skipped and reported (`skipped`): the rest is stored, and that group keeps its
last listed members, which expire on their own one TTL after they were listed.

Every group a source defines is scoped to it (`group:<source>/<name>`, knowledge.access): the source writes them so
on its documents and here, and the resolver never lets one directory's group grant another source's documents.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from knowledge.errors import SourceConfigError, SourceError, UnknownSource
from knowledge.sources.base import build_source
from knowledge.storage import directory as directory_store
from knowledge.storage import sources as sources_store

logger = logging.getLogger(__name__)

DEFAULT_GROUPS_SECONDS = 3600


@dataclass
class DirectoryReport:
    source: str
    groups: int = 0
    memberships: int = 0
    api_calls: int = 0
    seconds: float = 0.0
    missing: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # group -> why its members could not be listed

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "groups": self.groups, "memberships": self.memberships,
                "api_calls": self.api_calls, "seconds": round(self.seconds, 3), "missing": self.missing,
                "skipped": self.skipped}


def has_directory(kind: str, config: Mapping[str, Any]) -> bool:
    if kind == "confluence":
        return (config.get("visibility") or "permissions") == "permissions"
    if kind == "gdrive":
        return bool(config.get("admin_email")) and (config.get("visibility") or "permissions") == "permissions"
    return False


def groups_seconds(kind: str, config: Mapping[str, Any]) -> int | None:
    """How often the source's directory is refreshed (None: it has none)."""
    if not has_directory(kind, config):
        return None
    return int(config.get("groups_every_seconds") or DEFAULT_GROUPS_SECONDS)


async def refresh_directory(engine: AsyncEngine, name: str) -> DirectoryReport:
    """Fetch the source's groups and members and store them; on failure record the error and re-raise it."""
    async with engine.connect() as conn:
        row = await sources_store.get_source(conn, name)
    if row is None:
        raise UnknownSource(f"unknown source {name!r}")
    if not has_directory(row.kind, row.config):
        raise SourceConfigError(f"source {name!r} has no group directory (Confluence with permissions, or Google "
                                "Drive with an admin email, have one)")
    started = time.perf_counter()
    report = DirectoryReport(source=name)
    try:
        edges, domains = await _fetch(row.id, row.name, row.kind, row.config, engine, report)
    except SourceError as exc:
        async with engine.begin() as conn:
            await directory_store.record_failure(conn, row.id, str(exc))
        logger.warning("group directory of %s not refreshed: %s", name, exc)
        raise
    if report.skipped:
        logger.warning("group directory of %s refreshed without %d group(s) whose members could not be listed: %s",
                       name, len(report.skipped), "; ".join(f"{g}: {why}" for g, why in report.skipped.items()))
    async with engine.begin() as conn:
        state = await directory_store.replace_membership(
            conn, row.id, edges, domains=sorted(domains), api_calls=report.api_calls, kept=sorted(report.skipped),
            skipped=[f"{g} ({why})" for g, why in sorted(report.skipped.items())])
    report.groups, report.memberships = state.groups, state.memberships
    report.seconds = time.perf_counter() - started
    return report


async def _fetch(source_id: int, name: str, kind: str, config: Mapping[str, Any], engine: AsyncEngine,
                 report: DirectoryReport) -> tuple[list[tuple[str, str]], set[str]]:
    if kind == "confluence":
        # Each source kind's module loads only when a source of that kind is used (as knowledge.sources.base
        # loads them): a Google Drive deployment never imports the Confluence client, nor the reverse.
        from knowledge.sources.confluence import ConfluenceSource
        from knowledge.sources.confluence_groups import group_members

        async with engine.connect() as conn:
            on_documents = await directory_store.document_group_principals(conn, source_id)
        source = build_source(name, kind, dict(config))
        try:
            assert isinstance(source, ConfluenceSource)  # the factory of kind "confluence"
            found = await group_members(source, on_documents)
        finally:
            await source.aclose()
        report.api_calls, report.missing = found.api_calls, found.missing
        return found.edges, set()
    # Lazy, as above.
    from knowledge.sources.gdrive import GoogleDriveConfig
    from knowledge.sources.google_directory import DirectoryClient, directory_credentials, fetch_directory

    parsed = GoogleDriveConfig.from_dict(dict(config))
    assert parsed.admin_email
    client = DirectoryClient(name, directory_credentials(parsed.credentials_env, parsed.admin_email))
    directory = await fetch_directory(client, parsed.admin_email)
    report.api_calls, report.missing, report.skipped = directory.api_calls, directory.missing, directory.skipped
    return directory.edges, directory.domains
