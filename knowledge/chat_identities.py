"""The kinds of chat identity (`slack:U1`, `discord:42`): registered by the chat side at start-up (`bot.platforms`
registers every platform's name), since knowledge may not import bot. Asking as such an identity
(`ragbot ask --as slack:U1`) applies its admin mappings; any other unknown kind is refused (`check_as_principal`).
Kept in its own module, free of heavy imports, so registering a kind loads nothing else."""

from __future__ import annotations

import re

_KINDS: list[str] = []
_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
# Kinds a principal has in the core, which no chat identity may take.
RESERVED = ("everyone", "user", "group", "domain")


def register_identity_kind(name: str) -> None:
    """Let `name:<id>` be a chat identity (idempotent)."""
    if not _NAME.match(name) or name in RESERVED:
        raise ValueError(f"{name!r} cannot be a chat identity kind: use a lowercase word other than "
                         f"{', '.join(RESERVED)}")
    if name not in _KINDS:
        _KINDS.append(name)


def identity_kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(_KINDS)
