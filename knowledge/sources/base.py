"""The source interface (version 2): how a place where documents live feeds the index.

A *source* is one configured place (a folder, a Confluence site's spaces, a Google Drive). The indexer
(`knowledge.ingest.pipeline.Indexer`) drives it; a source never touches the database. To add a kind of source, write one
module in `knowledge/sources/` with a class satisfying `Source` and register a factory for its kind:

    @register_source("wiki")
    def build_wiki(name: str, config: Mapping[str, Any]) -> WikiSource:
        return WikiSource(name, base_url=config["url"], token_env=config.get("token_env", "WIKI_TOKEN"))

and add `"wiki": "knowledge.sources.wiki"` to `KIND_MODULES` below, so a stored row can be rebuilt without the
caller importing the module first. The stored row (table `sources`) holds `kind`, `config` (JSON: what the factory
needs), `checkpoint`, `schedule_seconds` and `prune_seconds`. **Secrets are never in `config`**: store the name of
the environment variable that holds one (`token_env`) and read `os.environ` when the source is built or checked.

How a sync run uses a source (see `Indexer.sync`):

1. `await source.check()` - fail fast: bad credentials, unreachable host or missing space raise
   `knowledge.errors.SourceAuthError` / `SourceUnavailable` / `SourceConfigError` with a message naming the
   source and the fix. Nothing in the index is touched. `ragbot source add` calls it too and refuses to save.
2. `async for batch in source.changes(checkpoint, full=full)` - what changed since `checkpoint` (the string this
   source returned last time, or None for "from the beginning"; `full=True` asks for everything regardless).
   Each `ChangeBatch` carries:
   - `items`: changed or added items. Each has a cheap `version` (Confluence version number, Drive md5/revision,
     folder mtime+size). When the stored version equals it, `read` is never called: only the item's metadata and
     `access` are compared and, if different, updated in place (a permission-only update: no fetch, no
     re-embedding). Listing an unchanged item is therefore cheap and harmless (overlapping windows are fine).
   - `deleted`: external ids the source knows were removed (a delete feed, e.g. Drive `removed=true`).
   - `checkpoint`: the checkpoint that is true once every item of this batch *and all earlier batches* is
     committed, or None to keep the previous one. The indexer commits documents a few at a time (each one fully
     old or fully new) and stores the batch's checkpoint only after the whole batch is committed, so a run killed
     at any moment resumes from the last stored checkpoint and nothing is lost or duplicated. Items must come in an order that makes
     that true (e.g. ascending last-modified).
3. Pruning, for sources without a delete feed: `await source.inventory()` lists every item in scope cheaply (no
   bodies) as `ItemRef(external_id, access)`. The indexer deletes stored documents under `listing_prefix` that
   are missing, and applies any `access` that differs from the stored one (permission re-check: restrictions can
   change without a new version). It returns None when the source cannot list its scope (a single file). It runs
   on `sync --full`, on the source's prune schedule, and on every sync when `prune_on_every_sync` is True (the
   folder: listing is as cheap as the change scan). An empty inventory never deletes anything (it is far more
   often an unmounted drive or a wrong query than a purge); the run reports a warning instead.
4. `await source.aclose()` - release HTTP clients.

Optional extras the indexer honours when a source has them: `warnings: list[str]` (listing problems, reported
in the run), `unlisted_prefixes: list[str]` (parts of the inventory that could not be listed: nothing under them
is deleted; "" means none of it), and `vanished(external_ids) -> list[str]` (for a partial listing: which stored
documents outside `listing_prefix` are definitely gone). A source whose first sync can be split across workers
(knowledge.ingest.split) also has `parts() -> list[str]` (its units: a folder's top-level folders as external-id
prefixes, Confluence's spaces, Drive's top-level folders; may be a coroutine) and `part(unit) -> Source` (the
source limited to one unit, with the same external ids).

Errors while reading one item: raise `knowledge.errors.ItemUnavailable` (gone mid-sync, too large, forbidden) or
`OSError` from `read`; the item is recorded as failed with the reason, its previous version stays indexed (with
its new access list), and the run goes on. Any other `SourceError` from `changes`/`inventory` fails the run at
once; what was committed before stays, and the checkpoint stays where the committed work is.

Access lists are principals: `everyone`, `user:<email>` (or `user:<platform>:<id>` where a platform hides
emails; a source documents its form), `group:<name>`. An empty tuple means nobody may see the item.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, Union, cast

from knowledge.access import EVERYONE
from knowledge.errors import SourceConfigError

if TYPE_CHECKING:
    from knowledge.storage.sources import SyncRun

ReadResult = Union[bytes, Awaitable[bytes]]  # noqa: UP007 (kept for the runtime check of this alias)


@dataclass(frozen=True)
class SourceItem:
    """One document as a source sees it, before parsing.

    `read` fetches the bytes and is called only when the indexer needs them (the stored version differs, or the
    item has no version). It is either a plain function (run in a worker thread: fine for files) or an `async def`
    function (HTTP sources; the source bounds its own concurrency). `title` overrides the title found in the
    content (a Confluence page's own title). `version` is the cheap change marker; None means "unknown: always
    read and compare the content hash". `parent_id` links an item to another (an attachment to its page).

    `resolve_access`, when set, computes the access list lazily (an `async def` returning principals; `access` is
    then ignored): the indexer awaits it only for items it fetches, and keeps the stored access of items whose
    version is unchanged, so a source whose permissions cost API calls pays them only for changed items; its
    `inventory()` must then return access on prune passes, which is where permission-only changes are found.
    """

    external_id: str
    filename: str  # decides the parser, by suffix
    read: Callable[[], ReadResult]
    title: str | None = None
    url: str | None = None
    path: str | None = None  # breadcrumb shown in citations
    author: str | None = None
    updated_at: datetime | None = None
    access: tuple[str, ...] = (EVERYONE,)
    version: str | None = None
    parent_id: str | None = None
    resolve_access: Callable[[], Awaitable[Sequence[str]]] | None = None
    # The size in bytes when the source knows it before reading (a file's stat): the indexer refuses an item over
    # MAX_FILE_MB without reading it.
    size: int | None = None


def bytes_read(data: bytes) -> Callable[[], bytes]:
    """A `SourceItem.read` for bytes already in memory (a page's body fetched with its listing, a corpus record)."""
    return lambda: data


async def read_item(item: SourceItem) -> bytes:
    """The item's bytes: async readers are awaited, plain ones run in a worker thread."""
    if inspect.iscoroutinefunction(item.read):
        data: bytes = await item.read()
        return data
    result = await asyncio.to_thread(item.read)
    if inspect.isawaitable(result):
        return await result
    return result


@dataclass(frozen=True)
class ItemRef:
    """An item in an inventory (pruning listing): its id and, when the source knows it cheaply or the pass is a
    permission re-check, its current access list (None = "not checked: keep what is stored")."""

    external_id: str
    access: tuple[str, ...] | None = None


@dataclass
class ChangeBatch:
    """Part of what changed since a checkpoint. See the module docstring for the checkpoint rule."""

    items: list[SourceItem] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    checkpoint: str | None = None
    total: int | None = None  # how many items the whole change set holds, when the source knows (progress bars)


@dataclass(frozen=True)
class SourceSpec:
    """Which source the items belong to. `kind` is "folder", "confluence", "gdrive" (or "beir"/"test")."""

    name: str
    kind: str
    location: str | None = None  # shown in `ragbot status`: a folder path, a wiki URL


class Source(Protocol):
    """What the indexer needs from a source. See the module docstring for how a sync run drives it."""

    spec: SourceSpec
    # The part of the external-id space this instance speaks for ("" = all of the source). Pruning and deletions
    # only ever touch stored documents under it (indexing one subfolder of a folder source).
    listing_prefix: str
    # True when `inventory()` is as cheap as `changes()`, so the indexer prunes after every sync.
    prune_on_every_sync: bool

    async def check(self) -> None: ...

    def changes(self, checkpoint: str | None, *, full: bool = False) -> AsyncIterator[ChangeBatch]: ...

    async def inventory(self) -> list[ItemRef] | None: ...

    async def aclose(self) -> None: ...


@dataclass
class StaticSource:
    """A source whose items are already in memory (the BEIR loader and tests). Items have no version, so their
    content hash decides what changed; the item list is the complete inventory."""

    spec: SourceSpec
    item_list: list[SourceItem] = field(default_factory=list)
    listing_prefix: str = ""
    prune_on_every_sync: bool = True

    def items(self) -> Iterator[SourceItem]:
        return iter(self.item_list)

    async def check(self) -> None:
        return None

    async def changes(self, checkpoint: str | None, *, full: bool = False) -> AsyncIterator[ChangeBatch]:
        yield ChangeBatch(items=list(self.item_list), total=len(self.item_list))

    async def inventory(self) -> list[ItemRef] | None:
        return [ItemRef(i.external_id, i.access) for i in self.item_list]

    async def aclose(self) -> None:
        return None


def as_source(source: Any) -> Source:
    """`source`, checked to speak this interface (a clear error instead of an AttributeError mid-sync)."""
    if not hasattr(source, "changes") or not hasattr(source, "inventory"):
        raise TypeError(f"{type(source).__name__} is not a source: it needs changes() and inventory() (see "
                        "knowledge/sources/base.py)")
    return cast(Source, source)


# --- the registry: rebuild a source from its stored row -------------------------------------------------------

SourceFactory = Callable[[str, Mapping[str, Any]], Source]
_FACTORIES: dict[str, SourceFactory] = {}
# Modules that register each kind, imported on first use so callers need not import every source module.
KIND_MODULES: dict[str, str] = {
    "folder": "knowledge.sources.folder",
    "confluence": "knowledge.sources.confluence",
    "gdrive": "knowledge.sources.gdrive",
}


def register_source(kind: str) -> Callable[[SourceFactory], SourceFactory]:
    """Decorator: `factory(name, config) -> Source` builds a source of `kind` from its stored config."""

    def decorate(factory: SourceFactory) -> SourceFactory:
        _FACTORIES[kind] = factory
        return factory

    return decorate


def build_source(name: str, kind: str, config: Mapping[str, Any]) -> Source:
    """A source object for a stored row. Raises `knowledge.errors.SourceConfigError` for an unknown kind or a
    config the factory rejects (factories raise SourceConfigError, KeyError or ValueError)."""
    if kind not in _FACTORIES and kind in KIND_MODULES:
        try:
            importlib.import_module(KIND_MODULES[kind])
        except ModuleNotFoundError as exc:
            raise SourceConfigError(f"source {name!r}: kind {kind!r} is not part of this build ({exc})") from exc
    factory = _FACTORIES.get(kind)
    if factory is None:
        known = ", ".join(sorted(set(_FACTORIES) | set(KIND_MODULES)))
        raise SourceConfigError(f"source {name!r} has kind {kind!r}, which ragbot cannot sync; known kinds: {known}")
    try:
        return factory(name, config)
    except SourceConfigError:
        raise
    except (KeyError, ValueError, TypeError) as exc:
        raise SourceConfigError(f"source {name!r}: its stored {kind} settings are invalid ({exc})") from exc


def registered_kinds() -> list[str]:
    return sorted(set(_FACTORIES) | set(KIND_MODULES))


@dataclass(frozen=True)
class SourceInfo:
    """A stored source as `ragbot source list` and the chat `/kb sources` show it. `config` never holds secrets
    (only environment-variable names)."""

    name: str
    kind: str
    location: str | None
    config: dict[str, Any]
    schedule_seconds: int | None  # None: synced only on demand
    prune_seconds: int | None
    documents: int
    last_run: SyncRun | None
    running: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name, "kind": self.kind, "location": self.location, "config": self.config,
            "schedule_seconds": self.schedule_seconds, "prune_seconds": self.prune_seconds,
            "documents": self.documents, "running": self.running,
            "last_run": self.last_run.to_dict() if self.last_run else None,
        }


def principals_key(access: Sequence[str]) -> tuple[str, ...]:
    """Access lists compare as sets: order and duplicates never count as a permission change."""
    return tuple(sorted(set(access)))
