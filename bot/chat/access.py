"""Who may see what, for every chat platform.

An answer is read by its whole audience, so it may only draw on documents everyone in that audience may see:
- a private conversation (a DM, an assistant thread): the asker alone. Their principals are what an admin mapped
  their platform identity to (`ragbot users map slack:U1 group:eng`), `user:<email>` when the platform tells us
  their email, and `everyone`;
- a shared channel: `everyone`, plus whatever an admin granted that channel (`/kb channel-access add PRINCIPAL`).
  The asker's own principals never apply there: the channel's other members would read the answer too.

Identities are platform-qualified ("slack:U123", "discord:4567"); channel keys too ("slack:T1:C2", "discord:G1:C2").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from knowledge.access import EVERYONE


class BotStateReader(Protocol):
    async def identity_principals(self, identity: str) -> list[str]: ...

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


async def private_audience(kb: BotStateReader, identity: str, email: str | None = None) -> Audience:
    """A DM or assistant thread: the asker's mapped principals, `user:<email>` if known, and `everyone`."""
    principals = await kb.identity_principals(identity)
    if email and email.strip():
        # Emails are case-insensitive; access lists may spell them either way.
        principals += [f"user:{email.strip()}", f"user:{email.strip().lower()}"]
    return Audience("private", _unique([*principals, EVERYONE]), identity)


async def shared_audience(kb: BotStateReader, identity: str, channel_key: str) -> Audience:
    """A channel many people read: `everyone` plus the channel's grants, whoever asks."""
    granted = await kb.channel_principals(channel_key)
    return Audience("shared", _unique([EVERYONE, *granted]), identity)
