"""Who may see what, for every chat platform.

An answer is read by its whole audience, so it may only draw on documents everyone in that audience may see:
- a private conversation (a DM, an assistant thread, an ephemeral answer): the asker alone. Their principals come
  from the one resolver (`kb.principals_for`, knowledge.access): `user:<email>` when the platform tells us their
  email, what an admin mapped their platform identity to (`ragbot users map slack:U1 group:eng`), every synced
  group containing any of those (transitively), and `everyone`;
- a shared channel: `everyone`, plus whatever an admin granted that channel (`/kb channel-access add PRINCIPAL`).
  The asker's own principals never apply there: the channel's other members would read the answer too. A
  restricted channel answers from what all its members may see (bot.chat.audience).

Identities are platform-qualified ("slack:U123", "discord:4567"); channel keys too ("slack:T1:C2", "discord:G1:C2").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from knowledge import EVERYONE, Person, ResolvedPrincipals


class PrincipalResolver(Protocol):
    """The one resolver (`KnowledgeBase.principals_for`)."""

    async def principals_for(self, person: Person) -> ResolvedPrincipals: ...


class ChannelGrants(Protocol):
    """A channel's admin grants (`bot.chat.state.BotState.channel_principals`)."""

    async def channel_principals(self, channel_key: str) -> list[str]: ...


@dataclass(frozen=True)
class Audience:
    """Who will read an answer, and therefore which principals the search runs with."""

    kind: Literal["private", "shared"]
    principals: tuple[str, ...]
    asker: str  # platform identity of the person asking

    @property
    def is_private(self) -> bool:
        return self.kind == "private"


def _unique(values: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for v in values if v))


async def private_audience(kb: PrincipalResolver, identity: str, email: str | None = None) -> Audience:
    """A DM, assistant thread or ephemeral answer: the asker's principals through the one resolver (email, admin
    mappings, synced groups, `everyone`)."""
    given = (f"user:{email.strip()}",) if email and email.strip() else ()
    resolved = await kb.principals_for(Person(given, identity))
    # Emails are case-insensitive: the resolver lowercases them; the spelling as given is kept too, so an access
    # list written either way matches.
    return Audience("private", _unique([*resolved.principals, *given, EVERYONE]), identity)


async def shared_audience(state: ChannelGrants, identity: str, channel_key: str) -> Audience:
    """A channel many people read: `everyone` plus the channel's grants, whoever asks."""
    granted = await state.channel_principals(channel_key)
    return Audience("shared", _unique([EVERYONE, *granted]), identity)
