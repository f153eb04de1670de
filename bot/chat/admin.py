"""The `/kb` admin commands, for every platform and the CLI: plain async functions returning text.

Whether the caller is an admin is decided by the chat core (`ChatFlow.kb_command`: the platform's admin flag from
the adapter's Directory, for a member of the installing organisation, or ADMIN_USER_IDS) and passed in `Caller`. Replies use light Markdown (`**bold**`, `` `code` ``,
"- " lists) that each adapter converts. Replies carry counts and source names only — never document titles — so a
reply can go anywhere.
"""

from __future__ import annotations

import logging
import shlex
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from bot.chat.access import private_audience
from bot.chat.channels import ChannelSettings, Mode, channel_settings, parse_mode, set_auto, set_mode, set_sources
from bot.chat.errors import chat_message
from bot.chat.insights import Viewer, build_report, gaps_text
from knowledge import InvalidPrincipal, KnowledgeError, check_principal, format_interval, identity_kinds, normalise

if TYPE_CHECKING:
    from collections.abc import Sequence

    from bot.chat.state import BotState
    from knowledge import KnowledgeBase, Person

logger = logging.getLogger(__name__)

HELP = """**ragbot** answers questions from your documents, with citations. Mention me in a channel, message me \
directly, or open me in the assistant panel.
Commands:
- `/kb help`: this help
- `/kb sources`: what is indexed (document counts for admins)
- `/kb status`: documents, chunks and last sync per source (admins)
- `/kb reindex [source]`: sync one source, or all (admins)
- `/kb channel-access list|add|remove PRINCIPAL`: what this channel's answers may draw on besides documents \
shared with everyone (admins)
- `/kb users map|unmap|list IDENTITY PRINCIPAL`: whom a chat user asks as in private conversations (admins; \
a workspace admin may hand out only principals they hold, operators any)
- `/kb channel show`, `/kb channel sources add|remove SOURCE`, `/kb channel auto on|off`, `/kb channel mode public|private`: this channel's sources, help-channel auto-answers and answer mode (admins)
- `/kb gaps`: questions the bot declined, was unsure about or got 👎 on, by topic (admins)
- `/kb access USER [DOCUMENT]`: a person's principals and where each came from; with DOCUMENT, whether they may \
see it and why (admins)
In a channel, answers only use documents everyone may see plus what an admin granted the channel. In a private \
conversation they also use the documents you may see."""

NEEDS_ADMIN = ("`{command}` needs an admin (an admin or owner of this workspace, server or team, or a user listed in "
               "ADMIN_USER_IDS). Nothing was changed.")
# What only an admin may run. status: its counts include restricted documents; sources shows them to admins only.
ADMIN_COMMANDS = ("reindex", "channel-access", "users", "status", "channel", "gaps", "access")


@dataclass(frozen=True)
class Caller:
    identity: str  # platform-qualified: "slack:U1", "discord:42"
    is_admin: bool
    channel_key: str | None = None  # where the command was typed ("slack:T1:C2"), for channel-access
    workspace: str | None = None  # the Slack workspace or Discord server ("slack:T1:"): whose questions /kb gaps shows
    # How the platform turns a USER argument ("<@U1>", "slack:U1", "user:a@x") into the person `/kb access`
    # resolves (Slack adds the user's email from users.info); None: the argument as it is.
    resolve_person: Callable[[str], Awaitable[Person | str]] | None = None
    email: str | None = None  # the caller's own email when the platform tells it (their own access: `caller_access`)
    # An operator (listed in ADMIN_USER_IDS): trusted like the CLI to hand out any principal. A platform admin
    # (workspace admin, Manage Server) is not: they may hand out only principals they hold (docs/security.md).
    operator: bool = False
    # Whether the caller may read a channel (by key) as a member would: `/kb gaps` shows only questions from such
    # channels (`ChannelAudiences.may_read`). None: no channel's questions are shown.
    reads_channel: Callable[[str], Awaitable[bool]] | None = None


@dataclass
class CommandResult:
    text: str  # shown to the caller at once (ephemeral where the platform allows)
    ok: bool = True
    # Long work (a reindex): the adapter runs this after showing `text` and posts what it returns.
    followup: Callable[[], Awaitable[str]] | None = None


# The commands themselves.


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "never"


def _last_run(run: object | None, running: bool) -> str:
    """"last sync 2026-11-22 10:00 UTC (ok)" from a recorded SyncRun."""
    if running:
        return "syncing now"
    if run is None:
        return "never synced"
    status = getattr(run, "status", "?")
    return f"last sync {_when(getattr(run, 'finished_at', None) or getattr(run, 'started_at', None))} ({status})"


async def sources_text(kb: KnowledgeBase, *, counts: bool = True) -> str:
    """The sources and their syncs. Document counts include restricted documents, so only admins get them
    (`counts`): a count that moves tells anyone that restricted documents were added or removed."""
    sources = await kb.list_sources()
    if not sources:
        return "Nothing is indexed yet."
    lines = ["**Sources**"]
    for s in sources:
        documents = f"{s.documents} documents, " if counts else ""
        lines.append(f"- `{s.name}` ({s.kind}): {documents}synced "
                     f"{format_interval(s.schedule_seconds) if s.schedule_seconds else 'on demand'}, "
                     f"{_last_run(s.last_run, s.running)}")
    if not counts:
        lines.append("Document counts are shown to admins only.")
    return "\n".join(lines)


async def status_text(kb: KnowledgeBase) -> str:
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


async def reindex(kb: KnowledgeBase, source: str | None = None, *, trigger: str = "chat") -> str:
    """Sync one source (or every source) through the one job function the scheduler and the CLI use."""
    names = [source] if source else await kb.source_names()
    if not names:
        return "Nothing to reindex: no sources are configured."
    lines = []
    for name in names:
        try:
            report = await kb.sync_source(name, trigger=trigger)
        except KnowledgeError as exc:  # SourceBusy, UnknownSource, a source's configuration: say so
            lines.append(f"`{name}`: {chat_message(exc)}")
            continue
        except Exception:
            error_id = uuid.uuid4().hex[:8]
            logger.exception("reindex of %s failed (error id %s)", name, error_id)
            lines.append(f"`{name}`: failed (error id `{error_id}`, see the bot's logs)")
            continue
        lines.append(report_text(report))
    return "**Reindex finished**\n" + "\n".join(f"- {line}" for line in lines)


# Who may hand out access (docs/security.md, "Trust model"). Mapping a chat user to a principal, or granting it to
# a channel, gives them the documents that principal may see: an operator (the CLI, ADMIN_USER_IDS: people who
# already hold the database or the deployment) may hand out any principal; a platform admin (a Slack workspace
# admin, a Discord member with Manage Server: trusted by the platform, not by the documents' owners) only principals
# they hold themselves, so the command never reads more than they could. Every change, and every refusal, is
# written to the audit log (`ragbot audit`, the admin page).

OPERATOR = "operator"
PLATFORM_ADMIN = "platform-admin"
REFUSED = ("Only an operator (the `ragbot` CLI, or a user listed in ADMIN_USER_IDS) may hand out `{principal}`: "
           "you do not hold it yourself. Nothing was changed.")


@dataclass(frozen=True)
class Grantor:
    """Who changes access: `actor` (a chat identity, or "cli") as `role`; `holds`: the principals a platform
    admin holds themselves (None: an operator, who may hand out any)."""

    actor: str
    role: str = OPERATOR
    holds: tuple[str, ...] | None = None

    def may_hand_out(self, principal: str) -> bool:
        if self.holds is None:
            return True
        return normalise(principal) in {normalise(p) for p in self.holds}


CLI = Grantor("cli")


async def grantor_of(kb: KnowledgeBase, caller: Caller) -> Grantor:
    if caller.operator:
        return Grantor(caller.identity, OPERATOR)
    return Grantor(caller.identity, PLATFORM_ADMIN, await caller_access(kb, caller))


async def _audit(state: BotState, grantor: Grantor, action: str, subject: str, principal: str | None,
                 outcome: str) -> None:
    await state.record_audit(actor=grantor.actor, actor_role=grantor.role, action=action, subject=subject,
                             principal=principal, outcome=outcome)


async def channel_access_list(state: BotState, channel_key: str) -> str:
    grants = await state.channel_grants(channel_key)
    if not grants:
        return "Answers in this channel use documents shared with `everyone` only."
    listed = ", ".join(f"`{g.principal}`" for g in grants)
    return f"Answers in this channel use documents shared with `everyone` and with: {listed}."


async def channel_access_add(state: BotState, channel_key: str, principal: str, by: Grantor = CLI) -> str:
    principal = check_principal(principal)
    if not by.may_hand_out(principal):
        await _audit(state, by, "channel-access add", channel_key, principal, "refused")
        return REFUSED.format(principal=principal)
    added = await state.grant_channel(channel_key, principal, by.actor)
    await _audit(state, by, "channel-access add", channel_key, principal, "done" if added else "unchanged")
    if not added:
        return f"This channel already has `{principal}`."
    return (f"Granted `{principal}` to this channel: everyone here can now get answers from documents "
            f"`{principal}` may see.")


async def channel_access_remove(state: BotState, channel_key: str, principal: str, by: Grantor = CLI) -> str:
    removed = await state.revoke_channel(channel_key, principal)
    await _audit(state, by, "channel-access remove", channel_key, principal.strip(), "done" if removed else "unchanged")
    if removed:
        return f"Removed `{principal.strip()}` from this channel."
    return f"This channel had no grant for `{principal.strip()}`."


async def users_map(state: BotState, identity: str, principal: str, by: Grantor = CLI) -> str:
    principal = check_principal(principal)
    if not by.may_hand_out(principal):
        await _audit(state, by, "users map", identity.strip(), principal, "refused")
        return REFUSED.format(principal=principal)
    added = await state.map_identity(identity, principal, by.actor)
    await _audit(state, by, "users map", identity.strip(), principal, "done" if added else "unchanged")
    return (f"`{identity}` now also asks as `{principal}` in private conversations." if added
            else f"`{identity}` already asks as `{principal}`.")


async def users_unmap(state: BotState, identity: str, principal: str | None, by: Grantor = CLI) -> str:
    removed = await state.unmap_identity(identity, principal)
    await _audit(state, by, "users unmap", identity.strip(), principal.strip() if principal else None,
                 "done" if removed else "unchanged")
    return f"Removed {removed} mapping(s) of `{identity}`."


async def users_list(state: BotState, identity: str | None = None) -> str:
    mappings = await state.identity_mappings(identity)
    if not mappings:
        return "No chat users are mapped."
    return "\n".join(f"- `{m.identity}` → `{m.principal}`" for m in mappings)


# Parsing and dispatch: `/kb <text>` on Slack, the same words from anywhere else.


def parse(text: str) -> list[str]:
    """A command's words ("channel-access add group:eng"); an unbalanced quote splits on spaces."""
    try:
        return shlex.split(text or "")
    except ValueError:
        return (text or "").split()


def refusal(text: str, caller: Caller) -> str | None:
    """What a caller who may not run this command is told (None: they may), before anything runs."""
    words = parse(text)
    command = words[0].lower() if words else "help"
    if command in ADMIN_COMMANDS and not caller.is_admin:
        return NEEDS_ADMIN.format(command=f"/kb {command}")
    return None


async def run_command(kb: KnowledgeBase, state: BotState, text: str, caller: Caller) -> CommandResult:
    """Parse `text` ("reindex handbook", "channel-access add group:eng") and run it for `caller`."""
    words = parse(text)
    command = words[0].lower() if words else "help"
    args = words[1:]
    refused = refusal(text, caller)
    if refused is not None:
        return CommandResult(refused, ok=False)
    try:
        if command == "help":
            return CommandResult(HELP)
        if command == "sources":
            return CommandResult(await sources_text(kb, counts=caller.is_admin))
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
            return await _channel_access(kb, state, args, caller)
        if command == "users":
            return await _users(kb, state, args, caller)
        if command == "channel":
            return await _channel(kb, state, args, caller)
        if command == "gaps":
            return CommandResult(await gaps(kb, state, caller))
        if command == "access":
            return await _access(kb, args, caller)
    except InvalidPrincipal as exc:
        return CommandResult(str(exc), ok=False)
    return CommandResult(f"Unknown command `{command}`. Try `/kb help`.", ok=False)


async def _channel_access(kb: KnowledgeBase, state: BotState, args: list[str], caller: Caller) -> CommandResult:
    if caller.channel_key is None:
        return CommandResult("Run `/kb channel-access` in the channel it should apply to.", ok=False)
    action = args[0].lower() if args else "list"
    if action == "list" and len(args) <= 1:
        return CommandResult(await channel_access_list(state, caller.channel_key))
    if action in ("add", "remove") and len(args) == 2:
        by = await grantor_of(kb, caller)
        if action == "add":
            text = await channel_access_add(state, caller.channel_key, args[1], by)
            return CommandResult(text, ok=not text.startswith("Only an operator"))
        return CommandResult(await channel_access_remove(state, caller.channel_key, args[1], by))
    return CommandResult("Usage: `/kb channel-access list|add|remove PRINCIPAL` (e.g. `group:eng`)", ok=False)


async def _users(kb: KnowledgeBase, state: BotState, args: list[str], caller: Caller) -> CommandResult:
    action = args[0].lower() if args else "list"
    if action == "list" and len(args) <= 2:
        return CommandResult(await users_list(state, args[1] if len(args) == 2 else None))
    if action == "map" and len(args) == 3:
        text = await users_map(state, args[1], args[2], await grantor_of(kb, caller))
        return CommandResult(text, ok=not text.startswith("Only an operator"))
    if action == "unmap" and len(args) in (2, 3):
        return CommandResult(await users_unmap(state, args[1], args[2] if len(args) == 3 else None,
                                               await grantor_of(kb, caller)))
    return CommandResult("Usage: `/kb users map|unmap IDENTITY PRINCIPAL`, `/kb users list [IDENTITY]`", ok=False)


# Channel settings and gaps (issue 34).

CHANNEL_USAGE = ("Usage: `/kb channel show`, `/kb channel sources add|remove SOURCE`, `/kb channel auto on|off`, "
                 "`/kb channel mode public|private`")


def channel_settings_text(settings: ChannelSettings) -> str:
    sources = ", ".join(f"`{name}`" for name in settings.sources) if settings.sources else "every source"
    auto = ("on: top-level questions here are answered without a mention, when there is an answer" if settings.auto
            else "off: answers only when mentioned")
    return (f"**Channel settings**\n- Sources: {sources}\n- Auto-answer: {auto}\n"
            f"- Mode: {settings.mode}")


async def channel_show(kb: KnowledgeBase, state: BotState, channel_key: str) -> str:
    settings = await channel_settings(state, channel_key)
    text = channel_settings_text(settings)
    known = set(await kb.source_names())
    missing = [name for name in settings.sources or () if name not in known]
    if missing:
        text += "\n" + "Not indexed (nothing answers from them): " + ", ".join(f"`{m}`" for m in missing)
    return text


async def channel_sources(kb: KnowledgeBase, state: BotState, channel_key: str, action: str, name: str, by: str | None) -> str:
    current = set((await channel_settings(state, channel_key)).sources or ())
    if action == "add":
        known = await kb.source_names()
        if name not in known:
            return f"Unknown source `{name}`. Sources: {', '.join(f'`{n}`' for n in known) or 'none'}."
        current.add(name)
    else:
        if name not in current:
            return f"`{name}` is not among this channel's sources. Nothing was changed."
        current.discard(name)
    await set_sources(state, channel_key, sorted(current), by)
    if not current:
        return "No source restriction left: every source (that the channel may see) answers here."
    return "Answers in this channel now come only from " + ", ".join(f"`{n}`" for n in sorted(current)) + "."


async def channel_auto(state: BotState, channel_key: str, on: bool, by: str | None) -> str:
    await set_auto(state, channel_key, on, by)
    if on:
        return ("Auto-answer is on: I'll answer top-level questions in this channel without a mention, but only "
                "when the documents answer them (I stay silent otherwise).")
    return "Auto-answer is off: I answer here only when mentioned."


async def channel_mode(state: BotState, channel_key: str, mode: Mode, by: str | None) -> str:
    await set_mode(state, channel_key, mode, by)
    return f"Answer mode for this channel: {mode}."


async def _channel(kb: KnowledgeBase, state: BotState, args: list[str], caller: Caller) -> CommandResult:
    if caller.channel_key is None:
        return CommandResult("Run `/kb channel` in the channel it should apply to.", ok=False)
    key, by = caller.channel_key, caller.identity
    action = args[0].lower() if args else "show"
    if action == "show" and len(args) <= 1:
        return CommandResult(await channel_show(kb, state, key))
    if action == "sources" and len(args) == 3 and args[1].lower() in ("add", "remove"):
        return CommandResult(await channel_sources(kb, state, key, args[1].lower(), args[2], by))
    if action == "auto" and len(args) == 2 and args[1].lower() in ("on", "off"):
        return CommandResult(await channel_auto(state, key, args[1].lower() == "on", by))
    if action == "mode" and len(args) == 2 and (mode := parse_mode(args[1].lower())) is not None:
        return CommandResult(await channel_mode(state, key, mode, by))
    return CommandResult(CHANNEL_USAGE, ok=False)


async def caller_access(kb: KnowledgeBase, caller: Caller) -> tuple[str, ...]:
    """What the calling chat admin may see themselves (their email, mappings, groups, `everyone`): a chat admin is
    trusted to run commands, not to read documents (docs/security.md): replies name only documents they may see."""
    return (await private_audience(kb, caller.identity, caller.email)).principals


async def gaps(kb: KnowledgeBase, state: BotState, caller: Caller, days: int = 30) -> str:
    """`/kb gaps` for a chat admin: the questions of their own workspace or server; documents named only if the
    admin may see them (their mapped principals and `everyone`)."""
    viewer = Viewer(caller.identity, caller.workspace, await caller_access(kb, caller), caller.reads_channel)
    return gaps_text(await build_report(kb, state, timedelta(days=days), viewer))
# `/kb access USER [DOCUMENT]`: what `ragbot access explain` shows, through the same `kb.explain_access`.


async def access_text(kb: KnowledgeBase, person: Person | str | Sequence[str], document: str | None = None, *,
                      visible_to: Sequence[str] | None = None) -> str:
    """A person's principals with where each came from, and for DOCUMENT whether they may see it and why. The
    reply goes to the admin who asked only (ephemeral); `visible_to` (the admin's own access) limits the documents
    it may name to those the admin may see: a title is never a way to read what one may not."""
    resolved, verdicts = await kb.explain_access(person, document, visible_to=visible_to)
    lines = [f"**{resolved.person}** holds {len(resolved.principals)} principals:"]
    for principal in resolved.principals:
        why = "; ".join(o.describe() for o in resolved.origins.get(principal, ()))
        lines.append(f"- `{principal}`: {why}")
    if resolved.expired:
        lines.append(f"Not counted: the group directory of {', '.join(resolved.expired)} is past its TTL (its "
                     "groups grant nothing until a refresh succeeds).")
    if document is not None and not verdicts:
        lines.append(f"No document you may see matches `{document}`: give its id, URL, SOURCE:ID or title.")
    for v in verdicts:
        name = f"{v.title or v.external_id} (`{v.source}:{v.external_id}`)"
        if v.visible:
            lines.append(f"**May see** {name}: it is shared with {', '.join(f'`{p}`' for p in v.matched)}.")
        else:
            shared = ", ".join(f"`{p}`" for p in v.access) or "nobody"
            lines.append(f"**May not see** {name}: it is shared with {shared}, none of which they hold.")
    return "\n".join(lines)


async def _access(kb: KnowledgeBase, args: list[str], caller: Caller) -> CommandResult:
    if not args or len(args) > 2:
        kinds = ", ".join(f"{kind}:ID" for kind in identity_kinds())
        return CommandResult(f"Usage: `/kb access USER [DOCUMENT]` (USER: @someone, {kinds} or user:alice@acme.com)",
                             ok=False)
    who, document = args[0], (args[1] if len(args) == 2 else None)
    if caller.resolve_person is not None:
        person = await caller.resolve_person(who)
    elif who.split(":", 1)[0] in identity_kinds():
        person = who
    else:
        person = check_principal(who)
    visible = await caller_access(kb, caller) if document is not None else None
    return CommandResult(await access_text(kb, person, document, visible_to=visible))
