"""Typed errors of the knowledge core.

Their messages describe the problem in plain words and never name a CLI flag: the same errors are shown in the
terminal, in Slack and in Discord. Each surface adds its own wording (the CLI's lives in bot/cli.py).
"""

from __future__ import annotations

from typing import Sequence


class KnowledgeError(Exception):
    """Base class: something the person asking can fix or should know about."""


class EmptyQuestion(KnowledgeError, ValueError):
    def __init__(self) -> None:
        super().__init__("the question is empty")


class UnknownSource(KnowledgeError, ValueError):
    """A source name that is not indexed. `known` lists the ones that are."""

    def __init__(self, names: Sequence[str], known: Sequence[str]) -> None:
        self.names = tuple(names)
        self.known = tuple(known)
        super().__init__(
            f"unknown source {', '.join(self.names)}; indexed sources: {', '.join(self.known) or 'none yet'}"
        )


class SourceConflict(KnowledgeError, ValueError):
    """A source name already used for another kind of source or another location."""

    def __init__(self, name: str, kind: str, location: str | None) -> None:
        self.name = name
        self.kind = kind
        self.location = location
        super().__init__(f"source {name!r} already indexes {kind} {location or ''}".rstrip() + "; pick another name")


class SourceBusy(KnowledgeError):
    """Another sync of the same source is running."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"source {name!r} is being synced right now; try again when that sync has finished")
