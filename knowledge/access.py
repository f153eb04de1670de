"""Principals: who a document is shown to. Documents carry access lists of principals (`everyone`,
`user:<email>`, `group:<name>`, any `kind:value`); a search runs with the asker's principals and only sees
chunks whose list shares one. The one definition both the sources (which write the lists) and the bots (which
decide the asker's principals) use."""

from __future__ import annotations

import re

from knowledge.errors import InvalidPrincipal

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


__all__ = ["EVERYONE", "InvalidPrincipal", "check_principal"]
