"""Who reads an answer, decided in one place for every platform and for both ways a question is answered: live,
and after a crash (`bot.chat.lease`), so that the two cannot drift apart (issue 42: one platform's crash resume
answered from `everyone` + grants where its live path used the channel members' common access).

The rule (docs/permissions.md, "In chat"):
- the asker alone (`Readers(channel=None)`: a DM, an assistant thread, an answer only the asker sees): the asker's
  principals through the one resolver, with the email the platform gives;
- a channel (`Readers(channel=<key>)`): what every member may see plus the channel's grants where the platform lists
  its members (a restricted channel), `everyone` + grants where anyone may join it (bot.chat.audience);
- a guest or another organisation's user asking (`Standing.outsider`): GUEST_ACCESS (bot.chat.guests).

An adapter supplies only the platform facts (`Directory`: a person's email and standing, a channel's members); a
question's `AnswerTarget` (who reads it, whose channel settings apply, and the adapter's plain data saying where to
post) is stored with its claim, so a resumed question is rebuilt here from data alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from bot.chat.access import Audience, private_audience
from bot.chat.audience import ChannelAudiences, Member
from bot.chat.guests import MEMBER, GuestAccess, Standing, outsider_audience

if TYPE_CHECKING:
    from bot.chat.state import BotState
    from knowledge import KnowledgeBase

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Readers:
    """Who will read an answer: the asker alone (`channel` None), or the members of the channel `channel` (its
    key, "<platform>:<workspace>:<channel>")."""

    channel: str | None = None

    @property
    def private(self) -> bool:
        return self.channel is None


@dataclass(frozen=True)
class PersonInfo:
    """What the platform says of a person: their email (None when it does not tell), their standing, and whether
    the platform makes them an admin (a workspace admin or owner, Manage Server): it counts for `/kb` only for a
    member of the installing organisation (`ChatFlow.kb_command`)."""

    email: str | None = None
    standing: Standing = MEMBER
    admin: bool = False


class Directory(Protocol):
    """The platform facts the audience rule needs, implemented by each adapter."""

    async def person(self, identity: str) -> PersonInfo:
        """The email and standing of a chat identity ("<platform>:<user id>")."""
        ...

    async def channel_members(self, channel_key: str, limit: int) -> Sequence[Member] | None:
        """None for a channel anyone may join; its members otherwise. Raises AudienceUnavailable when it cannot
        tell (the audience then falls back to `everyone` + grants)."""
        ...


class AudienceRule:
    """The audience of an answer, from its `Readers` and the platform's `Directory`; one per adapter (it caches
    channel member lists, `channels`)."""

    def __init__(self, kb: KnowledgeBase, state: BotState, directory: Directory, *, ttl_seconds: float,
                 max_members: int, guest_access: GuestAccess = "none") -> None:
        self.kb = kb
        self.directory = directory
        self.guest_access = guest_access
        self.channels = ChannelAudiences(kb, state, ttl_seconds=ttl_seconds, max_members=max_members,
                                         guest_access=guest_access)

    async def audience(self, asker: str, readers: Readers, person: PersonInfo | None = None) -> Audience:
        """Who reads the answer `asker` asked for. `person`: what the live event already told of the asker (else
        the directory is asked)."""
        if person is None:
            person = await self.directory.person(asker)
        if readers.channel is None:
            email = None if person.standing.outsider else person.email
            audience = await private_audience(self.kb, asker, email)
        else:
            channel = readers.channel
            audience = await self.channels.audience(
                channel, asker, lambda limit: self.directory.channel_members(channel, limit))
        if person.standing.outsider:
            logger.info("%s is %s: GUEST_ACCESS=%s applies", asker, person.standing.why, self.guest_access)
        return outsider_audience(audience, person.standing, self.guest_access)


@dataclass(frozen=True)
class AnswerTarget:
    """Where a claimed question is answered, stored with its claim as JSON: who reads it, the channel whose
    settings apply (`settings`: its sources; None in a DM), and the adapter's own plain data saying where to post
    (`post`: a channel and thread, an interaction's follow-up token...)."""

    readers: Readers
    post: Mapping[str, Any] = field(default_factory=dict)
    settings: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"readers": {"channel": self.readers.channel}, "settings": self.settings, "post": dict(self.post)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> AnswerTarget | None:
        """None for a target stored by an older version (no `post`): it cannot be resumed."""
        if not data or not isinstance(data.get("post"), Mapping) or not isinstance(data.get("readers"), Mapping):
            return None
        return cls(Readers(data["readers"].get("channel")), data["post"], data.get("settings"))
