"""The `/kb` admin commands, for every platform and the CLI: plain async functions returning text.

The adapter decides whether the caller is an admin (Slack: users.info is_admin/is_owner or ADMIN_USER_IDS; Discord:
Manage Server or ADMIN_USER_IDS) and passes that in `Caller`. Replies use light Markdown (`**bold**`, `` `code` ``,
"- " lists) that each adapter converts. Replies carry counts and source names only — never document titles — so a
reply can go anywhere.
"""

from __future__ import annotations

import logging
import shlex
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

from knowledge.errors import InvalidPrincipal, KnowledgeError

if TYPE_CHECKING:
    from knowledge.kb import KnowledgeBase

logger = logging.getLogger(__name__)

HELP = """**ragbot** answers questions from your documents, with citations. Mention me in a channel, message me \
directly, or open me in the assistant panel.
Commands:
- `/kb help`: this help
- `/kb sources`: what is indexed
- `/kb status`: documents, chunks and last sync per source
- `/kb reindex [source]`: sync one source, or all (admins)
- `/kb channel-access list|add|remove PRINCIPAL`: what this channel's answers may draw on besides documents \
shared with everyone (admins)
- `/kb users map|unmap|list IDENTITY PRINCIPAL`: whom a chat user asks as in private conversations (admins)
In a channel, answers only use documents everyone may see plus what an admin granted the channel. In a private \
conversation they also use the documents you may see."""

NEEDS_ADMIN = "`{command}` needs an admin (a workspace admin or owner, or a user listed in ADMIN_USER_IDS). Nothing was changed."


@dataclass(frozen=True)
class Caller:
    identity: str  # platform-qualified: "slack:U1", "discord:42"
    is_admin: bool
    channel_key: str | None = None  # where the command was typed ("slack:T1:C2"), for channel-access


@dataclass
class CommandResult:
    text: str  # shown to the caller at once (ephemeral where the platform allows)
    ok: bool = True
    # Long work (a reindex): the adapter runs this after showing `text` and posts what it returns.
    followup: Callable[[], Awaitable[str]] | None = None


# The commands themselves.


def _when(moment: object) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "never"  # type: ignore[attr-defined]


def _last_run(run: object | None, running: bool) -> str:
    """"last sync 2026-11-22 10:00 UTC (ok)" from a recorded SyncRun."""
    if running:
        return "syncing now"
    if run is None:
        return "never synced"
    status = getattr(run, "status", "?")
    return f"last sync {_when(getattr(run, 'finished_at', None) or getattr(run, 'started_at', None))} ({status})"


async def sources_text(kb: "KnowledgeBase") -> str:
    from knowledge.ingest.schedule import format_interval

    sources = await kb.list_sources()
    if not sources:
        return "Nothing is indexed yet."
    lines = ["**Sources**"]
    for s in sources:
        lines.append(f"- `{s.name}` ({s.kind}): {s.documents} documents, synced "
                     f"{format_interval(s.schedule_seconds) if s.schedule_seconds else 'on demand'}, "
                     f"{_last_run(s.last_run, s.running)}")
    return "\n".join(lines)


async def status_text(kb: "KnowledgeBase") -> str:
    status = await kb.status()
    lines = [
        f"**Index**: {status.documents} documents, {status.chunks} chunks, embedding model "
        f"`{status.embedding_model or 'none yet'}`"
    ]
    for s in status.sources:
        run = _last_run(s.last_run, s.running) if s.last_run or s.running else f"last synced {_when(s.last_synced_at)}"
        lines.append(f"- `{s.name}` ({s.kind}): {s.documents} documents, {s.chunks} chunks, {run}")
    mode = "Claude" if kb.answer_mode == "llm" else "offline excerpts"
    lines.append(f"Answers: {mode}.")
    return "\n".join(lines)


def report_text(report: object) -> str:
    """One line of counts from a SyncReport."""
    def count(name: str) -> int:
        value = getattr(report, name, 0)
        return len(value) if isinstance(value, (list, tuple)) else int(value or 0)

    parts = [f"{count('added')} added", f"{count('updated')} updated", f"{count('unchanged')} unchanged",
             f"{count('deleted')} deleted"]
    if count("failed"):
        parts.append(f"{count('failed')} failed")
    seconds = float(getattr(report, "seconds", 0.0) or 0.0)
    return f"`{getattr(report, 'source', '?')}`: {', '.join(parts)} ({seconds:.1f} s)"


async def reindex(kb: "KnowledgeBase", source: str | None = None, *, trigger: str = "chat") -> str:
    """Sync one source (or every source) through the one job function the scheduler and the CLI use."""
    names = [source] if source else await kb.source_names()
    if not names:
        return "Nothing to reindex: no sources are configured."
    lines = []
    for name in names:
        try:
            report = await kb.sync_source(name, trigger=trigger)  # type: ignore[attr-defined]
        except KnowledgeError as exc:  # SourceBusy, UnknownSource, a source's configuration: say so
            lines.append(f"`{name}`: {exc}")
            continue
        except Exception:
            error_id = uuid.uuid4().hex[:8]
            logger.exception("reindex of %s failed (error id %s)", name, error_id)
            lines.append(f"`{name}`: failed (error id `{error_id}`, see the bot's logs)")
            continue
        lines.append(report_text(report))
    return "**Reindex finished**\n" + "\n".join(f"- {line}" for line in lines)


async def channel_access_list(kb: "KnowledgeBase", channel_key: str) -> str:
    grants = await kb.channel_grants(channel_key)
    if not grants:
        return "Answers in this channel use documents shared with `everyone` only."
    listed = ", ".join(f"`{g.principal}`" for g in grants)
    return f"Answers in this channel use documents shared with `everyone` and with: {listed}."


async def channel_access_add(kb: "KnowledgeBase", channel_key: str, principal: str, by: str | None) -> str:
    added = await kb.grant_channel(channel_key, principal, by)
    principal = principal.strip()
    if not added:
        return f"This channel already has `{principal}`."
    return (f"Granted `{principal}` to this channel: everyone here can now get answers from documents "
            f"`{principal}` may see.")


async def channel_access_remove(kb: "KnowledgeBase", channel_key: str, principal: str) -> str:
    if await kb.revoke_channel(channel_key, principal):
        return f"Removed `{principal.strip()}` from this channel."
    return f"This channel had no grant for `{principal.strip()}`."


async def users_map(kb: "KnowledgeBase", identity: str, principal: str, by: str | None) -> str:
    added = await kb.map_identity(identity, principal, by)
    return (f"`{identity}` now also asks as `{principal.strip()}` in private conversations." if added
            else f"`{identity}` already asks as `{principal.strip()}`.")


async def users_unmap(kb: "KnowledgeBase", identity: str, principal: str | None) -> str:
    removed = await kb.unmap_identity(identity, principal)
    return f"Removed {removed} mapping(s) of `{identity}`."


async def users_list(kb: "KnowledgeBase", identity: str | None = None) -> str:
    mappings = await kb.identity_mappings(identity)
    if not mappings:
        return "No chat users are mapped."
    return "\n".join(f"- `{m.identity}` → `{m.principal}`" for m in mappings)


# Parsing and dispatch: `/kb <text>` on Slack, the same words from anywhere else.


async def run_command(kb: "KnowledgeBase", text: str, caller: Caller) -> CommandResult:
    """Parse `text` ("reindex handbook", "channel-access add group:eng") and run it for `caller`."""
    try:
        words = shlex.split(text or "")
    except ValueError:
        words = (text or "").split()
    command = words[0].lower() if words else "help"
    args = words[1:]
    admin_only = command in ("reindex", "channel-access", "users")
    if admin_only and not caller.is_admin:
        return CommandResult(NEEDS_ADMIN.format(command=f"/kb {command}"), ok=False)
    try:
        if command == "help":
            return CommandResult(HELP)
        if command == "sources":
            return CommandResult(await sources_text(kb))
        if command == "status":
            return CommandResult(await status_text(kb))
        if command == "reindex":
            if len(args) > 1:
                return CommandResult("Usage: `/kb reindex [source]`", ok=False)
            source = args[0] if args else None
            known = await kb.source_names()
            if source is not None and source not in known:
                return CommandResult(
                    f"Unknown source `{source}`. Sources: {', '.join(f'`{n}`' for n in known) or 'none'}.", ok=False
                )
            what = f"`{source}`" if source else "every source"
            return CommandResult(
                f"Reindexing {what}. I'll post the counts here when it is done.",
                followup=lambda: reindex(kb, source, trigger="chat"),
            )
        if command == "channel-access":
            return await _channel_access(kb, args, caller)
        if command == "users":
            return await _users(kb, args, caller)
    except InvalidPrincipal as exc:
        return CommandResult(str(exc), ok=False)
    return CommandResult(f"Unknown command `{command}`. Try `/kb help`.", ok=False)


async def _channel_access(kb: "KnowledgeBase", args: list[str], caller: Caller) -> CommandResult:
    if caller.channel_key is None:
        return CommandResult("Run `/kb channel-access` in the channel it should apply to.", ok=False)
    action = args[0].lower() if args else "list"
    if action == "list" and len(args) <= 1:
        return CommandResult(await channel_access_list(kb, caller.channel_key))
    if action in ("add", "remove") and len(args) == 2:
        if action == "add":
            return CommandResult(await channel_access_add(kb, caller.channel_key, args[1], caller.identity))
        return CommandResult(await channel_access_remove(kb, caller.channel_key, args[1]))
    return CommandResult("Usage: `/kb channel-access list|add|remove PRINCIPAL` (e.g. `group:eng`)", ok=False)


async def _users(kb: "KnowledgeBase", args: list[str], caller: Caller) -> CommandResult:
    action = args[0].lower() if args else "list"
    if action == "list" and len(args) <= 2:
        return CommandResult(await users_list(kb, args[1] if len(args) == 2 else None))
    if action == "map" and len(args) == 3:
        return CommandResult(await users_map(kb, args[1], args[2], caller.identity))
    if action == "unmap" and len(args) in (2, 3):
        return CommandResult(await users_unmap(kb, args[1], args[2] if len(args) == 3 else None))
    return CommandResult("Usage: `/kb users map|unmap IDENTITY PRINCIPAL`, `/kb users list [IDENTITY]`", ok=False)
