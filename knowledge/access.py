"""Principals: who a document is shown to. Documents carry access lists of principals (`everyone`,
`user:<email>`, `group:<name>`, any `kind:value`); a search runs with the asker's principals and only sees
chunks whose list shares one. The one definition both the sources (which write the lists) and the bots (which
decide the asker's principals) use.

Who a person is, in principals: the one resolver every surface uses (CLI `--as`, `access explain`, and later the
chat flow), with where each principal came from.

A person's principals = what they were given (`user:<email>`, or a platform identity's admin mappings from the
identity map) + every group containing any of those, transitively, in each source's synced directory, through that
directory's own groups only (`group:<source>/<name>`: see "principals" below) + `everyone`. Emails compare
case-insensitively in ASCII (folded here, as the sources fold them on documents; never `str.lower()`).

Directories (knowledge.storage.directory) hold direct edges only; nesting is expanded here by walking up from the
person's principals with a visited set, so a group cycle (a ∋ b ∋ a) terminates. A source's directory counts only
while it is fresh: `refreshed_at + ttl` past, its groups grant nothing (fail closed) until a refresh succeeds.

Cost: the directories are held in memory (one dict of member → groups per source) and re-read when another process
refreshed one (a generation check at most every `cache_seconds`); a person's resolution is cached for
`cache_seconds`, or until a directory changes or expires. So a revocation reaches questions within one refresh
interval plus `cache_seconds`.
"""

from __future__ import annotations

import asyncio
import re
import string
import time
import unicodedata
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from knowledge.chat_identities import identity_kinds
from knowledge.errors import InvalidPrincipal
from knowledge.storage import directory as directory_store

EVERYONE = "everyone"
MAX_CACHED_PEOPLE = 100_000
CUSTOMER = "customer:"  # knowledge.sources.google_directory.CUSTOMER: a group holding the whole Workspace

# --- principals: parsing, folding, group scopes ------------------------------------------------------------------
#
# Group principals are scoped to the directory that defines them: `group:<source>/<name>` is group <name> as the
# source named <source> (a Confluence site, a Google Workspace) defines it. A source writes its own groups that way
# on its documents and in its directory, and the resolver only expands a directory's edges inside its own scope, so
# a Confluence group called `eng@acme.example` never grants what Drive shared with the Google group of that name.
# An unscoped `group:<name>` is a local group no directory defines: folder `.access` files, `--as`, admin mappings
# and channel grants may name one, and only someone given it (not a synced directory) holds it.

GROUP_SCOPE_SEPARATOR = "/"

# A principal as documents carry them: `everyone`, or `kind:value` (user:a@example.com, group:eng, role:hr).
_PRINCIPAL = re.compile(r"^(everyone|[a-z][a-z0-9_-]*:\S+)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DOMAIN = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*$")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def fold_ascii(value: str) -> str:
    """Lowercase A-Z only. `str.lower()` also folds Unicode look-alikes into ASCII (the Kelvin sign U+212A becomes
    `k`, U+0130 becomes `i`), which would let a crafted address match another person's: emails and domains compare
    case-insensitively in ASCII only, and every other character must match exactly."""
    return value.translate(_ASCII_LOWER)


def _folds_to_ascii(char: str) -> bool:
    """A non-ASCII character that Unicode compatibility normalisation or a one-letter case mapping turns into ASCII
    (Kelvin sign, dotless i, long s, fullwidth letters, ligatures): a look-alike of an ASCII principal."""
    if char.isascii():
        return False
    compatible = unicodedata.normalize("NFKC", char)
    if compatible != char and any(c.isascii() for c in compatible):
        return True
    for mapped in (char.lower(), char.upper()):
        letters = [c for c in mapped if not unicodedata.combining(c)]
        if len(letters) == 1 and letters[0].isascii() and mapped != char:
            return True
    return False


def _describe_char(char: str) -> str:
    return f"{char!r} (U+{ord(char):04X} {unicodedata.name(char, 'unnamed character')})"


def email_domain(principal: str) -> str | None:
    """The domain of a `user:<email>` principal with a real address (one `@`, a non-empty local part that is not a
    typed id like `confluence:bob`, an ASCII domain), else None: `user:@acme.example` belongs to nobody's domain."""
    kind, _, value = principal.partition(":")
    if kind != "user" or value.count("@") != 1:
        return None
    local, _, domain = value.partition("@")
    if not local or ":" in local or not domain.isascii() or not _DOMAIN.match(domain):
        return None
    return fold_ascii(domain)


def scoped_group(scope: str, name: str) -> str:
    """`group:<scope>/<name>`: group `name` as the source named `scope` defines it."""
    return f"group:{scope}{GROUP_SCOPE_SEPARATOR}{name}"


def group_scope(principal: str) -> tuple[str | None, str]:
    """(scope, name) of a group principal: ("wiki", "hr") for `group:wiki/hr`, (None, "hr") for the unscoped
    `group:hr`. Source names never hold the separator, so the first one ends the scope."""
    value = principal.removeprefix("group:")
    scope, separator, name = value.partition(GROUP_SCOPE_SEPARATOR)
    return (scope, name) if separator else (None, value)


def check_scope_name(name: str) -> str | None:
    """Why a source name cannot scope groups (None when it can): it is the first part of `group:<source>/<name>`."""
    if not name or GROUP_SCOPE_SEPARATOR in name or any(c.isspace() or _CONTROL.match(c) for c in name):
        return (f"a source that defines groups cannot be named {name!r}: its name scopes them "
                f"(group:<source>/<group>), so it needs no {GROUP_SCOPE_SEPARATOR!r} and no spaces")
    return None


def _address(principal: str, value: str, what: str) -> str:
    """An email or a domain inside a principal: ASCII only, folded; a clear error otherwise."""
    bad = next((c for c in value if not c.isascii()), None)
    if bad is not None:
        raise InvalidPrincipal(
            f"{principal!r}: {what} holds {_describe_char(bad)}; emails and domains are ASCII (write the ASCII "
            "letter, and an internationalised domain in its xn-- form)")
    if what == "an email":
        local, _, domain = value.rpartition("@")
        if not local or "@" in local:
            raise InvalidPrincipal(f"{principal!r} has no name before the @ (write user:<name>@<domain>)"
                                   if not local else f"{principal!r} holds more than one @")
    else:
        domain = value
    if not _DOMAIN.match(domain):
        raise InvalidPrincipal(f"{principal!r}: {domain!r} is not a domain name")
    return fold_ascii(value)


def parse_principal(value: str, kinds: Collection[str] | None = None) -> str:
    """The one parser of principals people type (`--as`, `.access` lines, admin mappings, channel grants): the
    principal, normalised (emails and domains folded in ASCII), or InvalidPrincipal with a one-line reason.

    - `everyone`, or `kind:value` with no spaces or control characters (`kinds` limits the kinds);
    - no non-ASCII look-alike of an ASCII character anywhere (a Kelvin sign for a `k`): they would silently never
      match, or match someone else once something folds them;
    - `user:<email>` needs a name before the @; emails (`user:`, a Google `group:`) and `domain:` values are
      ASCII, compared case-insensitively;
    - `group:<source>/<name>` is a group of that source's directory; an unscoped `group:<name>` is a local group
      (folder `.access` files, mappings), which no synced directory grants."""
    principal = value.strip()
    if not _PRINCIPAL.match(principal) or _CONTROL.search(principal):
        raise InvalidPrincipal(
            f"{principal!r} is not a principal: use everyone, user:<email>, group:<name> (kind:value, no spaces)")
    if principal == EVERYONE:
        return principal
    kind, _, rest = principal.partition(":")
    if kinds is not None and kind not in kinds:
        raise InvalidPrincipal(f"{principal!r}: {kind}: is not a principal kind here (use "
                               f"{', '.join(k if k == EVERYONE else k + ':…' for k in kinds)})")
    lookalike = next((c for c in principal if _folds_to_ascii(c)), None)
    if lookalike is not None:
        raise InvalidPrincipal(f"{principal!r} holds {_describe_char(lookalike)}, a look-alike of an ASCII "
                               "character: write the ASCII character")
    if kind == "domain":
        return f"domain:{_address(principal, rest, 'a domain')}"
    if kind == "group":
        scope, name = group_scope(principal)
        if scope is not None and (not scope or not name):
            raise InvalidPrincipal(f"{principal!r}: write group:<source>/<group> (or group:<group> for a local one)")
        if "@" in name:
            name = _address(principal, name, "an email")
        return scoped_group(scope, name) if scope is not None else f"group:{name}"
    if kind == "user" and ("@" in rest and ":" not in rest):
        return f"user:{_address(principal, rest, 'an email')}"
    return principal


# The kinds a person can be asked as (`ragbot ask --as`, `chat --as`): a typo such as `grp:eng` matches no document,
# so it would answer from `everyone` alone without a word; it is refused instead, naming these.
ASKABLE_KINDS = ("everyone", "user", "group", "domain")
# Chat identities (`<platform>:<id>`): asking as one applies its admin mappings. The chat side registers the kinds
# (`bot.platforms` registers every platform's name: knowledge.chat_identities), since knowledge may not import bot.


def check_as_principal(principal: str) -> str:
    """A principal someone asks or searches as (`everyone`, `user:…`, `group:…`, `domain:…`, or a chat identity
    such as `slack:U1`, whose mappings apply), parsed by
    `parse_principal`; any other kind is an error listing the known ones (InvalidPrincipal)."""
    kind = principal.strip().partition(":")[0]
    kinds = identity_kinds()
    if kind in kinds:
        return parse_principal(principal, kinds)
    if principal.strip() != EVERYONE and ":" in principal and kind not in ASKABLE_KINDS:
        raise InvalidPrincipal(f"unknown principal kind {kind + ':'!r} in {principal.strip()!r}: the known kinds are "
                               f"{', '.join(k if k == EVERYONE else k + ':<name>' for k in ASKABLE_KINDS)}, or a chat "
                               f"identity ({', '.join(k + ':<id>' for k in kinds) or 'none registered'})")
    return parse_principal(principal, ASKABLE_KINDS)


def check_principal(principal: str) -> str:
    """parse_principal under its older name (the chat commands call it)."""
    return parse_principal(principal)


def normalise(principal: str) -> str:
    """A principal from a platform or the identity map, as documents carry it: emails in `user:`/`group:` values
    and `domain:` values folded in ASCII (never `str.lower()`: see fold_ascii). Nothing is rejected here (stored
    mappings and platform emails are matched exactly otherwise, so a look-alike matches nobody)."""
    principal = principal.strip()
    kind, _, value = principal.partition(":")
    if kind == "user" and "@" in value:
        return f"user:{fold_ascii(value)}"
    if kind == "group":
        scope, name = group_scope(principal)  # the source name keeps its case: only the email part folds
        if "@" in name:
            return scoped_group(scope, fold_ascii(name)) if scope is not None else f"group:{fold_ascii(name)}"
    if kind == "domain":
        return f"domain:{fold_ascii(value)}"
    return principal


@dataclass(frozen=True)
class Origin:
    """Why a person holds a principal. kind: "given" (asked as it), "everyone", "mapping" (an admin's identity map
    entry `identity`), or "group" (member of it in `source`'s directory, through `via`: the chain of principals
    from one the person holds to the group, e.g. (user:a@x, group:team@x) for group:eng@x ∋ group:team@x ∋ a)."""

    kind: str
    source: str | None = None
    via: tuple[str, ...] = ()
    identity: str | None = None

    def describe(self) -> str:
        if self.kind == "given":
            return "given"
        if self.kind == "everyone":
            return "everyone holds it"
        if self.kind == "mapping":
            return f"admin mapping of {self.identity}"
        chain = " ∈ ".join(self.via)
        return f"{self.source} directory: {chain}" if chain else f"{self.source} directory"


def describe_scope(principal: str) -> str | None:
    """Which directory defines a group principal, for `access explain` (None for other kinds)."""
    if not principal.startswith("group:"):
        return None
    scope, _ = group_scope(principal)
    if scope is None:
        return "local (an .access file, a mapping or a channel grant; no synced directory)"
    return f"source {scope}'s directory"


@dataclass(frozen=True)
class ResolvedPrincipals:
    """A person's principals, each with where it came from, and the directories that could not vouch for groups."""

    person: str
    principals: tuple[str, ...]
    origins: dict[str, tuple[Origin, ...]]
    expired: tuple[str, ...] = ()  # sources whose directory is past its TTL (their groups grant nothing now)
    resolved_at: float = 0.0
    expired_groups: tuple[str, ...] = ()  # single groups a refresh could not list, past their own TTL

    def to_dict(self) -> dict[str, object]:
        return {"person": self.person, "principals": list(self.principals),
                "origins": {p: [o.describe() for o in self.origins.get(p, ())] for p in self.principals},
                "scopes": {p: describe_scope(p) for p in self.principals if p.startswith("group:")},
                "expired_directories": list(self.expired), "expired_groups": list(self.expired_groups)}


@dataclass
class _Directory:
    source_id: int
    name: str
    kind: str
    refreshed_at: float | None  # epoch seconds of the last good refresh
    domains: frozenset[str]
    parents: dict[str, list[str]] = field(default_factory=dict)  # member -> groups listing it directly
    # Groups whose members the last refresh could not list (it kept their previous ones): when that was listed.
    group_refreshed: dict[str, float] = field(default_factory=dict)

    @property
    def scope(self) -> str:
        """The prefix of every group this directory defines (`group:<source>/`)."""
        return scoped_group(self.name, "")


@dataclass
class _Snapshot:
    directories: list[_Directory]
    generations: dict[int, int]
    checked_at: float


IdentityLookup = Callable[[str], Awaitable[list[str]]]


@dataclass(frozen=True)
class Person:
    """Who asks: principals they hold (`user:alice@acme.com`), and/or a platform identity (`slack:U1`) whose admin
    mappings apply."""

    principals: tuple[str, ...] = ()
    identity: str | None = None

    @classmethod
    def parse(cls, value: str | Person | Sequence[str]) -> Person:
        if isinstance(value, Person):
            return value
        values = [value] if isinstance(value, str) else list(value)
        identity = next((v for v in values if v.split(":", 1)[0] in identity_kinds()), None)
        return cls(tuple(v for v in values if v != identity), identity)

    @property
    def label(self) -> str:
        return ", ".join([*(self.principals), *([self.identity] if self.identity else [])]) or EVERYONE


class AccessResolver:
    """`await resolver.principals_for(person)` → ResolvedPrincipals. One per process (KnowledgeBase.access)."""

    def __init__(self, engine: AsyncEngine, *, ttl_seconds: float, cache_seconds: float,
                 identity_lookup: IdentityLookup | None = None, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.ttl = ttl_seconds
        self.cache_seconds = cache_seconds
        self.identity_lookup = identity_lookup
        self.clock = clock
        self._snapshot: _Snapshot | None = None
        self._cache: dict[Person, tuple[float, ResolvedPrincipals]] = {}
        self._loading = asyncio.Lock()

    def invalidate(self) -> None:
        """Forget everything (after a refresh in this process: the next question re-reads the directories)."""
        self._snapshot = None
        self._cache.clear()

    async def principals_for(self, person: str | Person | Sequence[str]) -> ResolvedPrincipals:
        who = Person.parse(person)
        now = self.clock()
        snapshot = await self._current(now)
        cached = self._cache.get(who)
        if cached is not None and cached[0] > now:
            return cached[1]
        resolved, expires = await self._resolve(who, snapshot, now)
        if len(self._cache) >= MAX_CACHED_PEOPLE:
            self._cache.clear()
        self._cache[who] = (expires, resolved)
        return resolved

    async def synced_groups_named(self, principal: str) -> list[str]:
        """For an unscoped `group:<name>`: the synced groups of that name (`group:<source>/<name>`, one per
        directory defining it), which the unscoped one is not. Lets `--as group:eng` say what it does not mean."""
        scope, name = group_scope(principal)
        if not principal.startswith("group:") or scope is not None:
            return []
        snapshot = await self._current(self.clock())
        found = []
        for directory in snapshot.directories:
            scoped = scoped_group(directory.name, name)
            if any(scoped in groups for groups in directory.parents.values()):
                found.append(scoped)
        return found

    # -- the directories in memory --

    async def _current(self, now: float) -> _Snapshot:
        snapshot = self._snapshot
        if snapshot is not None and now - snapshot.checked_at < self.cache_seconds:
            return snapshot
        async with self._loading:
            snapshot = self._snapshot
            if snapshot is not None and now - snapshot.checked_at < self.cache_seconds:
                return snapshot
            async with self.engine.connect() as conn:
                generations = await directory_store.generations(conn)
                if snapshot is not None and generations == snapshot.generations:
                    snapshot.checked_at = now
                    return snapshot
                states = await directory_store.list_states(conn)
                edges = await directory_store.load_edges(conn)
            self._snapshot = build_snapshot(states, edges, generations, now)
            self._cache.clear()
            return self._snapshot

    # -- one person --

    async def _resolve(self, who: Person, snapshot: _Snapshot, now: float) -> tuple[ResolvedPrincipals, float]:
        origins: dict[str, list[Origin]] = {}

        def add(principal: str, origin: Origin) -> None:
            origins.setdefault(principal, []).append(origin)

        for principal in who.principals:
            add(normalise(principal), Origin("given"))
        if who.identity and self.identity_lookup is not None:
            for principal in await self.identity_lookup(who.identity):
                add(normalise(principal), Origin("mapping", identity=who.identity))
        add(EVERYONE, Origin("everyone"))
        held = [p for p in origins if p != EVERYONE]
        expires = now + self.cache_seconds
        expired: list[str] = []
        expired_groups: list[str] = []
        for directory in snapshot.directories:
            if directory.refreshed_at is None:
                continue
            deadline = directory.refreshed_at + self.ttl
            if deadline <= now:
                expired.append(directory.name)
                continue
            expires = min(expires, deadline)
            stale = set()
            for group, refreshed in directory.group_refreshed.items():
                if refreshed + self.ttl <= now:
                    stale.add(group)
                else:
                    expires = min(expires, refreshed + self.ttl)
            for group, via in expand(directory, held, stale).items():
                add(group, Origin("group", directory.name, via))
            expired_groups += sorted(stale)
        principals = tuple(sorted(origins))
        frozen = {p: tuple(dict.fromkeys(o)) for p, o in origins.items()}
        return ResolvedPrincipals(who.label, principals, frozen, tuple(expired), now, tuple(expired_groups)), expires


def expand(directory: _Directory, held: Iterable[str], stale: Collection[str] = ()) -> dict[str, tuple[str, ...]]:
    """Every group of `directory` containing any of `held`, transitively (breadth first, each group once: cycles
    end), with the shortest chain from a held principal to it. A `stale` group (its members could not be listed for
    a whole TTL) grants nothing, and nothing through it. Only groups in the directory's own scope come out
    (build_snapshot keeps no other edge)."""
    chains: dict[str, tuple[str, ...]] = {}
    frontier: list[tuple[str, tuple[str, ...]]] = [(p, (p,)) for p in held]
    for principal in list(held):
        domain = email_domain(principal)
        if domain is not None and domain in directory.domains and CUSTOMER in directory.parents:
            frontier.append((CUSTOMER, (principal, "the whole Workspace")))
    seen = set(held)
    while frontier:
        following: list[tuple[str, tuple[str, ...]]] = []
        for member, chain in frontier:
            for group in directory.parents.get(member, ()):
                if group in seen or group in stale:
                    continue
                seen.add(group)
                chains[group] = (*chain, group)
                following.append((group, chains[group]))
        frontier = following
    return chains


def build_snapshot(states: Sequence[directory_store.DirectoryState], edges: dict[int, list[directory_store.Edge]],
                   generations: dict[int, int], now: float) -> _Snapshot:
    """The directories in memory. A directory keeps only edges inside its own scope (a group `group:<source>/…`
    whose members are people, `customer:` or groups of the same scope): whatever else a row says (one written
    before the groups were scoped, by a process still running the old code) grants nothing."""
    directories = []
    for state in states:
        refreshed = state.refreshed_at.timestamp() if isinstance(state.refreshed_at, datetime) else None
        directory = _Directory(state.source_id, state.source, state.kind, refreshed,
                               frozenset(fold_ascii(d) for d in state.domains))
        for edge in edges.get(state.source_id, ()):
            if not edge.group.startswith(directory.scope):
                continue
            if edge.member.startswith("group:") and not edge.member.startswith(directory.scope):
                continue
            directory.parents.setdefault(edge.member, []).append(edge.group)
            if edge.refreshed_at is not None:
                directory.group_refreshed[edge.group] = edge.refreshed_at.timestamp()
        directories.append(directory)
    return _Snapshot(directories, generations, now)


# --- explaining one document ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentVerdict:
    source: str
    external_id: str
    title: str | None
    access: tuple[str, ...]
    matched: tuple[str, ...]  # the document's principals the person holds (empty: they may not see it)

    @property
    def visible(self) -> bool:
        return bool(self.matched)


def verdict(resolved: ResolvedPrincipals, document: directory_store.DocumentAccess) -> DocumentVerdict:
    held = set(resolved.principals)
    matched = tuple(p for p in document.access if p in held)
    return DocumentVerdict(document.source, document.external_id, document.title, document.access, matched)
