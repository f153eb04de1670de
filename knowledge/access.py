"""Principals: who a document is shown to. Documents carry access lists of principals (`everyone`,
`user:<email>`, `group:<name>`, any `kind:value`); a search runs with the asker's principals and only sees
chunks whose list shares one. The one definition both the sources (which write the lists) and the bots (which
decide the asker's principals) use.

Who a person is, in principals: the one resolver every surface uses (CLI `--as`, `access explain`, and later the
chat flow), with where each principal came from.

A person's principals = what they were given (`user:<email>`, or a platform identity's admin mappings from the
identity map) + every group containing any of those, transitively, in every source's synced directory + `everyone`.
Emails compare case-insensitively (lowercased here, as the sources lowercase them on documents).

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
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from knowledge.errors import InvalidPrincipal
from knowledge.storage import directory as directory_store

EVERYONE = "everyone"

# A principal as documents carry them: `everyone`, or `kind:value` (user:a@example.com, group:eng, role:hr).
_PRINCIPAL = re.compile(r"^(everyone|[a-z][a-z0-9_-]*:\S+)$")


def check_principal(principal: str) -> str:
    """The principal, stripped; a clear error for anything that could never match a document's access list."""
    principal = principal.strip()
    if not _PRINCIPAL.match(principal):
        raise InvalidPrincipal(
            f"{principal!r} is not a principal: use everyone, user:<email>, group:<name> (kind:value, no spaces)"
        )
    return principal


# The kinds a person can be asked as (`ragbot ask --as`, `.access` files): a typo such as `grp:eng` matches no
# document, so it would answer from `everyone` alone without a word; it is refused instead, naming these.
ASKABLE_KINDS = ("everyone", "user:", "group:", "domain:")


def check_as_principal(principal: str) -> str:
    """A principal someone asks or searches as: `everyone`, `user:…`, `group:…` or `domain:…`; anything else is
    an error listing the known kinds (InvalidPrincipal)."""
    principal = check_principal(principal)
    if principal != EVERYONE and not principal.startswith(ASKABLE_KINDS[1:]):
        kind = principal.partition(":")[0]
        raise InvalidPrincipal(f"unknown principal kind {kind + ':'!r} in {principal!r}: the known kinds are "
                               f"{', '.join(k if k == EVERYONE else k + '<name>' for k in ASKABLE_KINDS)}")
    return principal


MAX_CACHED_PEOPLE = 100_000
CUSTOMER = "customer:"  # knowledge.sources.google_directory.CUSTOMER: a group holding the whole Workspace


def normalise(principal: str) -> str:
    """`user:`/`group:` principals holding an email compare case-insensitively: lowercase them. Others (Confluence
    group names, `user:confluence:<id>`) are kept as the source wrote them."""
    principal = principal.strip()
    kind, _, value = principal.partition(":")
    if kind in ("user", "group") and "@" in value:
        return f"{kind}:{value.lower()}"
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


@dataclass(frozen=True)
class ResolvedPrincipals:
    """A person's principals, each with where it came from, and the directories that could not vouch for groups."""

    person: str
    principals: tuple[str, ...]
    origins: dict[str, tuple[Origin, ...]]
    expired: tuple[str, ...] = ()  # sources whose directory is past its TTL (their groups grant nothing now)
    resolved_at: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {"person": self.person, "principals": list(self.principals),
                "origins": {p: [o.describe() for o in self.origins.get(p, ())] for p in self.principals},
                "expired_directories": list(self.expired)}


@dataclass
class _Directory:
    source_id: int
    name: str
    kind: str
    refreshed_at: float | None  # epoch seconds of the last good refresh
    domains: frozenset[str]
    parents: dict[str, list[str]] = field(default_factory=dict)  # member -> groups listing it directly


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
        identity = next((v for v in values if v.split(":", 1)[0] in ("slack", "discord")), None)
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
        for directory in snapshot.directories:
            if directory.refreshed_at is None:
                continue
            deadline = directory.refreshed_at + self.ttl
            if deadline <= now:
                expired.append(directory.name)
                continue
            expires = min(expires, deadline)
            for group, via in expand(directory, held).items():
                add(group, Origin("group", directory.name, via))
        principals = tuple(sorted(origins))
        frozen = {p: tuple(dict.fromkeys(o)) for p, o in origins.items()}
        return ResolvedPrincipals(who.label, principals, frozen, tuple(expired), now), expires


def expand(directory: _Directory, held: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Every group of `directory` containing any of `held`, transitively (breadth first, each group once: cycles
    end), with the shortest chain from a held principal to it."""
    chains: dict[str, tuple[str, ...]] = {}
    frontier: list[tuple[str, tuple[str, ...]]] = [(p, (p,)) for p in held]
    for principal in list(held):
        if principal.startswith("user:") and "@" in principal:
            if principal.rsplit("@", 1)[-1] in directory.domains and CUSTOMER in directory.parents:
                frontier.append((CUSTOMER, (principal, "the whole Workspace")))
    seen = set(held)
    while frontier:
        following: list[tuple[str, tuple[str, ...]]] = []
        for member, chain in frontier:
            for group in directory.parents.get(member, ()):
                if group in seen:
                    continue
                seen.add(group)
                chains[group] = (*chain, group)
                following.append((group, chains[group]))
        frontier = following
    return chains


def build_snapshot(states: Sequence[directory_store.DirectoryState], edges: dict[int, list[tuple[str, str]]],
                   generations: dict[int, int], now: float) -> _Snapshot:
    directories = []
    for state in states:
        parents: dict[str, list[str]] = {}
        for group, member in edges.get(state.source_id, ()):
            parents.setdefault(member, []).append(group)
        refreshed = state.refreshed_at.timestamp() if isinstance(state.refreshed_at, datetime) else None
        directories.append(_Directory(state.source_id, state.source, state.kind, refreshed,
                                      frozenset(d.lower() for d in state.domains), parents))
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
