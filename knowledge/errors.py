"""Typed errors the knowledge core raises. Each message names what went wrong and how to fix it, so the CLI and
the chat adapters can show it as it is."""

from __future__ import annotations


class KnowledgeError(Exception):
    """Base class: an error a user can act on (its message says how)."""


# --- sources and sync runs -----------------------------------------------------------------------------------


class SourceError(KnowledgeError):
    """A source cannot be synced right now. The run fails; the index keeps what it had."""


class UnknownSource(SourceError, ValueError):
    """No stored source has that name."""


class SourceBusy(SourceError):
    """Another process (or task) is syncing that source right now."""


class SourceConfigError(SourceError, ValueError):
    """A source's settings are invalid (bad URL, unknown kind, missing option, space not found)."""


class SourceAuthError(SourceError):
    """The credentials were refused (401/403) or are missing."""


class SourceUnavailable(SourceError):
    """The host cannot be reached, or kept answering 429/503 past the retry bound."""


class ItemUnavailable(KnowledgeError):
    """One item cannot be fetched (deleted mid-sync, too large, forbidden): it is skipped and reported, the run
    goes on."""
