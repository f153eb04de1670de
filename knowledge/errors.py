"""Typed errors the knowledge core raises.

Messages name what went wrong and how to fix it in plain words, never a CLI flag: the same errors are shown in
the terminal, in Slack and in Discord. Each surface adds its own wording (the CLI's lives in bot/cli.py).
"""

from __future__ import annotations

from typing import Sequence


class KnowledgeError(Exception):
    """Base class: an error a user can act on (its message says how)."""


# --- questions -------------------------------------------------------------------------------------------------


class EmptyQuestion(KnowledgeError, ValueError):
    def __init__(self) -> None:
        super().__init__("the question is empty")


# --- sources and sync runs -----------------------------------------------------------------------------------


class SourceError(KnowledgeError):
    """A source cannot be used or synced right now. A sync run fails; the index keeps what it had."""


class UnknownSource(SourceError, ValueError):
    """No stored source has that name. Built with `named()`, it also carries the names asked for and the known
    ones, so a surface can word its own hint."""

    names: tuple[str, ...] = ()
    known: tuple[str, ...] | None = None

    @classmethod
    def named(cls, names: Sequence[str], known: Sequence[str]) -> "UnknownSource":
        error = cls(f"unknown source {', '.join(names)}; indexed sources: {', '.join(known) or 'none yet'}")
        error.names, error.known = tuple(names), tuple(known)
        return error


class SourceBusy(SourceError):
    """Another process (or task) is syncing that source right now."""


class SourceConflict(SourceError, ValueError):
    """A source name already used for another kind of source or another location."""

    def __init__(self, name: str, kind: str, location: str | None) -> None:
        self.name = name
        self.kind = kind
        self.location = location
        where = f"{kind} {location}" if location else kind
        super().__init__(f"source {name!r} already indexes {where}; pick another name")


class SourceConfigError(SourceError, ValueError):
    """A source's settings are invalid (bad URL, unknown kind, missing option, space not found)."""


class SourceAuthError(SourceError):
    """The credentials were refused (401/403) or are missing."""


class SourceUnavailable(SourceError):
    """The host cannot be reached, or kept answering 429/503 past the retry bound."""


class ItemUnavailable(KnowledgeError):
    """One item cannot be fetched (deleted mid-sync, too large, forbidden): it is skipped and reported, the run
    goes on."""
