"""Channel audiences from real membership (issue 33), for every chat platform.

An answer posted in a channel is read by all of its members, so it may only draw on documents every member may
see. A restricted channel (a private Slack channel or group DM, a Discord channel whose overwrites hide it from
@everyone) therefore answers from the **intersection** of its members' principals, each resolved by the one
resolver (`kb.principals_for`: given email, admin mappings, synced groups, `everyone`), plus the channel's admin
grants. An open channel (a public Slack channel, a Discord channel @everyone may view) stays `everyone` + grants:
anyone may join it and read the answer later.

What is cached, and for how long:
- the member LIST of a channel (the platform API calls), for `CHANNEL_AUDIENCE_TTL` seconds, or until a member
  join/leave/role event for that channel calls `invalidate`;
- nothing else: the intersection is recomputed at every question from the resolver's own per-person cache, so a
  member losing a group narrows the channel with the same delay as everywhere else (docs/permissions.md).

Failing closed: when the member list cannot be had (an API error, a missing scope or intent, more than
`CHANNEL_AUDIENCE_MAX_MEMBERS` members) the audience is `everyone` + grants, never the asker's own access.
Bots and apps in a channel are not members here (see `Member.is_bot`): an integration would otherwise reset every
private channel to `everyone`. A guest or another organisation's user among the members (`Member.outsider`,
bot.chat.guests) holds what GUEST_ACCESS gives them: under `none`, the channel answers from no document at all (its
grants included), since they would read the answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from bot.chat.access import Audience
from bot.chat.guests import GuestAccess, guest_principals
from knowledge import EVERYONE, Person

if TYPE_CHECKING:
    from bot.chat.state import BotState
    from knowledge import KnowledgeBase

logger = logging.getLogger(__name__)

# How long a failed member listing is remembered before it is tried again (it falls back to everyone + grants).
FAILURE_RETRY_SECONDS = 60.0


class AudienceUnavailable(Exception):
    """The channel's members cannot be listed (API error, missing scope/intent, too many members)."""


@dataclass(frozen=True)
class Member:
    """One channel member as the platform knows them: a chat identity ("slack:U1"), their email when the platform
    tells it, and whether they are a bot/app (not counted)."""

    identity: str
    email: str | None = None
    is_bot: bool = False
    outsider: bool = False  # a guest or another organisation's user (bot.chat.guests)

    def person(self) -> Person:
        email = (self.email or "").strip()
        return Person((f"user:{email}",) if email else (), self.identity)


# What an adapter supplies: the members of a restricted channel, or None when the channel is open to everyone.
# It raises AudienceUnavailable when it cannot tell; `limit` is the most members it should fetch before giving up.
ListMembers = Callable[[int], Awaitable["Sequence[Member] | None"]]


@dataclass(frozen=True)
class ChannelView:
    """How a channel's audience was decided (for logs, `/kb` replies and tests)."""

    kind: Literal["open", "members", "fallback"]
    members: tuple[Member, ...] = ()
    reason: str = ""


async def person_principals(kb: KnowledgeBase, person: Person) -> tuple[str, ...]:
    """A person's principals through the one resolver. Their email is given as written too, lowercased by the
    resolver; both spellings are kept so an access list written in either case matches."""
    resolved = await kb.principals_for(person)
    return tuple(dict.fromkeys([*resolved.principals, *person.principals]))


class ChannelAudiences:
    """One per adapter: channel key → its member list (cached), and the audience computed from it."""

    def __init__(self, kb: KnowledgeBase, state: BotState, *, ttl_seconds: float, max_members: int,
                 clock: Callable[[], float] = time.monotonic, guest_access: GuestAccess = "none") -> None:
        self.guest_access = guest_access  # GUEST_ACCESS: what an outsider member holds
        self.kb = kb
        self.state = state
        self.ttl = ttl_seconds
        self.max_members = max_members
        self.clock = clock
        self._views: dict[str, tuple[float, ChannelView]] = {}

    def invalidate(self, channel_key: str | None = None) -> None:
        """A member joined or left, a role or overwrite changed: list the members again at the next question.
        None forgets every channel (a guild-wide role change)."""
        if channel_key is None:
            self._views.clear()
        else:
            self._views.pop(channel_key, None)

    def invalidate_prefix(self, prefix: str) -> None:
        """Forget every channel whose key starts with `prefix` (all channels of one Discord server)."""
        for key in [k for k in self._views if k.startswith(prefix)]:
            self._views.pop(key, None)

    async def view(self, channel_key: str, list_members: ListMembers) -> ChannelView:
        now = self.clock()
        cached = self._views.get(channel_key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            members = await list_members(self.max_members)
            if members is None:
                view = ChannelView("open")
            else:
                people = tuple(m for m in members if not m.is_bot)
                if len(people) > self.max_members:
                    raise AudienceUnavailable(f"{len(people)} members, more than CHANNEL_AUDIENCE_MAX_MEMBERS="
                                              f"{self.max_members}")
                view = ChannelView("members", people)
            expires = now + self.ttl
        except AudienceUnavailable as exc:
            logger.warning("channel %s: answering from everyone + grants: %s", channel_key, exc)
            view = ChannelView("fallback", reason=str(exc))
            expires = now + min(self.ttl, FAILURE_RETRY_SECONDS)
        except Exception as exc:  # a platform error we did not foresee: still fail closed
            logger.warning("channel %s: could not list its members, answering from everyone + grants",
                           channel_key, exc_info=exc)
            view = ChannelView("fallback", reason=f"{type(exc).__name__}: {exc}")
            expires = now + min(self.ttl, FAILURE_RETRY_SECONDS)
        self._views[channel_key] = (expires, view)
        return view

    async def may_read(self, channel_key: str, identity: str, list_members: ListMembers) -> bool:
        """Could `identity` read this channel? An open channel: yes; a restricted one: if they are a member; one
        whose members cannot be listed: no (fail closed). For what admins are shown of a channel (`/kb gaps`)."""
        view = await self.view(channel_key, list_members)
        if view.kind == "open":
            return True
        return view.kind == "members" and any(m.identity == identity for m in view.members)

    async def principals(self, view: ChannelView) -> tuple[str, ...]:
        """The principals every member holds (`everyone` at least)."""
        if view.kind != "members" or not view.members:
            return (EVERYONE,)
        common: set[str] | None = None
        order: list[str] = []
        for member in view.members:
            if member.outsider:
                held = guest_principals(self.guest_access)
            else:
                held = await person_principals(self.kb, member.person())
            if common is None:
                common, order = set(held), list(held)
            else:
                common &= set(held)
            if common <= {EVERYONE}:
                break
        return tuple(dict.fromkeys([EVERYONE, *(p for p in order if p in (common or ()))]))

    async def audience(self, channel_key: str, asker: str, list_members: ListMembers) -> Audience:
        """The audience of an answer posted in `channel_key`: the members' common principals + the channel's
        grants. Never the asker's own access (unless the asker is the only member)."""
        view = await self.view(channel_key, list_members)
        if self.guest_access == "none" and any(m.outsider for m in view.members):
            return Audience("shared", (), asker)  # an outsider reads it: no document, no grant
        common = await self.principals(view)
        granted = await self.state.channel_principals(channel_key)
        return Audience("shared", tuple(dict.fromkeys([*common, *granted])), asker)
