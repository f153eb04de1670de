"""Guests and other organisations' users (issue 38, item 5), for every chat platform.

The organisation that installed the bot trusts its own members with the documents shared with `everyone`; a
guest (a Slack single- or multi-channel guest), a user of another organisation (Slack Connect: a stranger, or a
user whose team is not the installed one) or, when DISCORD_GUEST_WITHOUT_ROLE asks for it, a Discord member holding
no role besides @everyone, is not one of them. What such an outsider gets is GUEST_ACCESS:

- `none` (the default): nothing. Their questions get `OUTSIDER_REPLY` instead of an answer, and so does every
  question in a restricted or Slack Connect channel they are a member of, since they would read the answer.
- `everyone`: documents shared with `everyone` and nothing more: no email principal, no admin mapping, no group.

An outsider is never an admin, whatever their own organisation says (`is_admin` is about the user's own team). The
adapters say who is an outsider (`Standing`); the rules are here, so every platform applies the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from bot.chat.access import Audience
from knowledge import EVERYONE

GuestAccess = Literal["none", "everyone"]

# What an asker sees when the answer's audience holds no principal at all (an outsider asked, or reads the channel).
OUTSIDER_REPLY = ("I can't answer this here: the answer would be read by a guest or by someone from another "
                  "organisation, and I answer only the members of the organisation that installed me. An admin can "
                  "change this with GUEST_ACCESS.")
GUEST_ACCESS_VALUES: tuple[GuestAccess, ...] = ("none", "everyone")


@dataclass(frozen=True)
class Standing:
    """Where a chat user stands with the installing organisation. `outsider`: a guest or another organisation's
    user; `why` says which, for logs and replies."""

    outsider: bool = False
    why: str = ""


MEMBER = Standing()


def guest_principals(access: GuestAccess) -> tuple[str, ...]:
    """The principals an outsider holds: none, or `everyone` alone."""
    return (EVERYONE,) if access == "everyone" else ()


def outsider_audience(audience: Audience, standing: Standing, access: GuestAccess) -> Audience:
    """The audience of an answer an outsider asked for. A private answer (read by them alone): `guest_principals`.
    A shared channel's answer (read by the channel): nothing under `none` (the outsider asked, so nothing is
    answered for them), the channel's own audience under `everyone`."""
    if not standing.outsider:
        return audience
    if access == "none":
        return replace(audience, principals=())
    if audience.is_private:
        return replace(audience, principals=guest_principals(access))
    return audience


def trusted_admin(platform_admin: bool, standing: Standing) -> bool:
    """A platform's admin flag counts only for a member of the installing organisation: an external user's
    `is_admin` is about their own workspace."""
    return platform_admin and not standing.outsider
