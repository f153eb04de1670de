"""Typed errors the knowledge core raises.

One tree: every error the knowledge core raises on purpose is a `KnowledgeError` (those that were a ValueError or
RuntimeError before still are, so existing handlers keep working). Their messages describe the problem in plain
words and never name a CLI command or flag: the same errors are shown in the terminal, in Slack and in Discord.
Each surface adds its own wording (the CLI's lives in bot/cli/, the chat's in bot/chat/): where the fix is an
action on a source, the error carries it as a fact (`remedy`, and the source's name in `source`), and the surface
names its own command for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum


class Remedy(StrEnum):
    """What the person can do about an error or a sync warning, as a fact each surface words with its commands."""

    ADD_SOURCE = "add-source"  # no source by that name: add one
    REMOVE_SOURCE = "remove-source"  # drop the source (and what was indexed from it) on purpose
    SHOW_STATUS = "show-status"  # see which sync is running


class KnowledgeError(Exception):
    """Base class: something the person asking can fix or should know about (its message says how).

    `remedy` (with `source`, the source it is about): a fix a surface can name its own command for."""

    remedy: Remedy | None = None
    source: str | None = None

    def __init__(self, *args: object, remedy: Remedy | None = None, source: str | None = None) -> None:
        super().__init__(*args)
        if remedy is not None:
            self.remedy = remedy
        if source is not None:
            self.source = source


class SyncWarning(str):
    """A sync report's warning line: a plain string everywhere (JSON output, the run's record), with the same
    `remedy` and `source` facts as an error, so the surface showing it can add its command."""

    remedy: Remedy | None
    source: str | None

    def __new__(cls, text: str, *, remedy: Remedy | None = None, source: str | None = None) -> SyncWarning:
        warning = super().__new__(cls, text)
        warning.remedy = remedy
        warning.source = source
        return warning


class EmptyQuestion(KnowledgeError, ValueError):
    def __init__(self) -> None:
        super().__init__("the question is empty")


class QuestionTooLong(KnowledgeError, ValueError):
    """A question longer than MAX_QUESTION_CHARS: refused before any work (a 50 KB paste took 15 s and 590 MB to
    embed and search before being declined). The message is the one line every surface shows."""

    def __init__(self, length: int, limit: int) -> None:
        self.length = length
        self.limit = limit
        super().__init__(f"the question is {length:,} characters long; the limit is {limit:,} (MAX_QUESTION_CHARS): "
                         "ask something shorter")


class SourceConflict(KnowledgeError, ValueError):
    """A source name already used for another kind of source or another location."""

    def __init__(self, name: str, kind: str, location: str | None) -> None:
        self.name = name
        self.kind = kind
        self.location = location
        super().__init__(f"source {name!r} already indexes {kind} {location or ''}".rstrip() + "; pick another name")


# --- sources and sync runs -----------------------------------------------------------------------------------


class SourceError(KnowledgeError):
    """A source cannot be synced right now. The run fails; the index keeps what it had."""


class UnknownSource(SourceError, ValueError):
    """No stored source has that name. `known` lists the ones that are (when the raiser knew them).

    Raised either as `UnknownSource(names, known)` or with a ready message, `UnknownSource("unknown source 'x'")`.
    """

    def __init__(
        self, names: Sequence[str] | str, known: Sequence[str] | None = None, *, remedy: Remedy | None = None,
        source: str | None = None,
    ) -> None:
        if isinstance(names, str) and known is None:
            self.names: tuple[str, ...] = ()
            self.known: tuple[str, ...] = ()
            super().__init__(names, remedy=remedy, source=source)
            return
        self.names = (names,) if isinstance(names, str) else tuple(names)
        self.known = tuple(known or ())
        super().__init__(
            f"unknown source {', '.join(self.names)}; indexed sources: {', '.join(self.known) or 'none yet'}",
            remedy=remedy, source=source,
        )


class SourceBusy(SourceError):
    """Another process (or task) is syncing that source right now."""


class RecentlySynced(SourceBusy):
    """A scheduled run found that another replica already ran this source in this interval: skipped, as when the
    source is busy."""


class SourceConfigError(SourceError, ValueError):
    """A source's settings are invalid (bad URL, unknown kind, missing option, space not found)."""


class SourceAuthError(SourceError):
    """The credentials were refused (401/403) or are missing."""


class SourceUnavailable(SourceError):
    """The host cannot be reached, or kept answering 429/503 past the retry bound."""


class InvalidPrincipal(KnowledgeError, ValueError):
    """Not a principal documents could carry (`everyone`, or `kind:value`), or not a platform identity."""


class ItemUnavailable(KnowledgeError):
    """One item cannot be fetched (deleted mid-sync, too large, forbidden): it is skipped and reported, the run
    goes on."""


# --- documents, models, evaluation ------------------------------------------------------------------------------


class UnsupportedFormat(KnowledgeError, ValueError):
    """The file's type is not one ragbot reads."""


class CorruptDocument(KnowledgeError, ValueError):
    """The file claims a supported type but could not be read."""


class LimitExceeded(CorruptDocument):
    """The file would cost more than a resource limit allows. The message is "<limit> (setting NAME)", naming the
    setting that raises the limit; the sync reports it as "skipped: <file>: <message>"."""


class EmbeddingModelError(KnowledgeError, RuntimeError):
    """The embedding model cannot be found or loaded (the message names the setting to fix)."""


class OnnxBuildError(KnowledgeError, RuntimeError):
    """The ONNX question encoder could not be built or loaded (questions then use the NumPy encoder)."""


class GenerationError(KnowledgeError, RuntimeError):
    """The model could not be reached or refused; the message says what to do, never the API key."""


class JudgeError(KnowledgeError, RuntimeError):
    """The LLM judge's reply could not be read."""


class EvalFileError(KnowledgeError, ValueError):
    """A question file for `eval` cannot be read (the message names the line)."""
