"""ragbot's knowledge side, as the bots and the CLI use it: `from knowledge import KnowledgeBase, SearchFilters`.

The names below are the public API; everything else under `knowledge/` is how it is built (the stages: sources,
ingest, embedding, search, answer, eval, insights; storage holds every SQL statement). They are imported lazily
(PEP 562 `__getattr__`): `import knowledge` loads nothing else, so `ragbot --help` never pays for SQLAlchemy,
NumPy or torch, and `from knowledge import SearchFilters` loads only the module that defines it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name → the module that defines it
_EXPORTS: dict[str, str] = {
    # the knowledge base and its settings
    "KnowledgeBase": "knowledge.kb",
    "IndexStatus": "knowledge.kb",
    "KnowledgeSettings": "knowledge.settings",
    # who sees what
    "EVERYONE": "knowledge.access",
    "Person": "knowledge.access",
    "ResolvedPrincipals": "knowledge.access",
    "DocumentVerdict": "knowledge.access",
    "check_principal": "knowledge.access",
    "normalise": "knowledge.access",
    "parse_principal": "knowledge.access",
    "describe_scope": "knowledge.access",
    "check_as_principal": "knowledge.access",
    "register_identity_kind": "knowledge.chat_identities",
    "identity_kinds": "knowledge.chat_identities",
    # asking
    "Answer": "knowledge.answer.answering",
    "Citation": "knowledge.answer.answering",
    "ChatMessage": "knowledge.answer.memory",
    "SearchFilters": "knowledge.search.retrieval",
    "SearchHit": "knowledge.search.retrieval",
    "SearchResults": "knowledge.search.retrieval",
    "SearchTuning": "knowledge.storage.search",
    "MODES": "knowledge.search.retrieval",
    "Mode": "knowledge.search.retrieval",
    # sources and syncs
    "FolderSource": "knowledge.sources.folder",
    "StaticSource": "knowledge.sources.base",
    "SourceItem": "knowledge.sources.base",
    "SourceSpec": "knowledge.sources.base",
    "SourceInfo": "knowledge.sources.base",
    "SourceStatus": "knowledge.storage.documents",
    "SyncReport": "knowledge.ingest.pipeline",
    "SyncRun": "knowledge.storage.sources",
    "DocumentRef": "knowledge.storage.usage",
    "format_interval": "knowledge.ingest.schedule",
    "parse_interval": "knowledge.ingest.schedule",
    # the one error tree (knowledge.errors)
    "KnowledgeError": "knowledge.errors",
    "EmptyQuestion": "knowledge.errors",
    "QuestionTooLong": "knowledge.errors",
    "SourceError": "knowledge.errors",
    "SourceConflict": "knowledge.errors",
    "UnknownSource": "knowledge.errors",
    "SourceBusy": "knowledge.errors",
    "RecentlySynced": "knowledge.errors",
    "SourceConfigError": "knowledge.errors",
    "SourceAuthError": "knowledge.errors",
    "SourceUnavailable": "knowledge.errors",
    "InvalidPrincipal": "knowledge.errors",
    "EmbeddingModelError": "knowledge.errors",
    "GenerationError": "knowledge.errors",
    "JudgeError": "knowledge.errors",
    "EvalFileError": "knowledge.errors",
    "Remedy": "knowledge.errors",
    "SyncWarning": "knowledge.errors",
}

# the same names, spelled out for tools that read __all__ (test_architecture checks they match)
__all__ = ["Answer", "ChatMessage", "Citation", "DocumentRef", "DocumentVerdict", "EVERYONE", "EmbeddingModelError",
    "EmptyQuestion", "EvalFileError", "FolderSource", "GenerationError", "IndexStatus", "InvalidPrincipal",
    "JudgeError", "KnowledgeBase", "KnowledgeError", "KnowledgeSettings", "MODES", "Mode", "Person",
    "QuestionTooLong", "RecentlySynced", "Remedy", "ResolvedPrincipals", "SearchFilters", "SearchHit", "SearchResults", "SearchTuning",
    "SourceAuthError", "SourceBusy", "SourceConfigError", "SourceConflict", "SourceError", "SourceInfo",
    "SourceItem", "SourceSpec", "SourceStatus", "SourceUnavailable", "StaticSource", "SyncReport", "SyncRun", "SyncWarning",
    "UnknownSource", "check_as_principal", "check_principal", "describe_scope", "format_interval", "identity_kinds",
    "normalise", "parse_interval", "parse_principal", "register_identity_kind"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'knowledge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from knowledge.access import (
        EVERYONE,
        DocumentVerdict,
        Person,
        ResolvedPrincipals,
        check_as_principal,
        check_principal,
        describe_scope,
        normalise,
        parse_principal,
    )
    from knowledge.answer.answering import Answer, Citation
    from knowledge.answer.memory import ChatMessage
    from knowledge.chat_identities import identity_kinds, register_identity_kind
    from knowledge.errors import (
        EmbeddingModelError,
        EmptyQuestion,
        EvalFileError,
        GenerationError,
        InvalidPrincipal,
        JudgeError,
        KnowledgeError,
        QuestionTooLong,
        RecentlySynced,
        Remedy,
        SourceAuthError,
        SourceBusy,
        SourceConfigError,
        SourceConflict,
        SourceError,
        SourceUnavailable,
        SyncWarning,
        UnknownSource,
    )
    from knowledge.ingest.pipeline import SyncReport
    from knowledge.ingest.schedule import format_interval, parse_interval
    from knowledge.kb import IndexStatus, KnowledgeBase
    from knowledge.search.retrieval import MODES, Mode, SearchFilters, SearchHit, SearchResults
    from knowledge.settings import KnowledgeSettings
    from knowledge.sources.base import SourceInfo, SourceItem, SourceSpec, StaticSource
    from knowledge.sources.folder import FolderSource
    from knowledge.storage.documents import SourceStatus
    from knowledge.storage.search import SearchTuning
    from knowledge.storage.sources import SyncRun
    from knowledge.storage.usage import DocumentRef
