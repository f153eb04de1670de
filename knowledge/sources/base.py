"""What every source hands the indexer: items with an id, metadata, an access list and bytes to parse."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Protocol, Iterator

EVERYONE = "everyone"


@dataclass(frozen=True)
class SourceItem:
    """One document as a source sees it, before parsing.

    `read` is called only when the indexer needs the bytes, so a source can list thousands of items cheaply.
    `title` overrides the title found in the file (a Confluence page's own title, a BEIR record's title).
    """

    external_id: str
    filename: str  # decides the parser, by suffix
    read: Callable[[], bytes]
    title: str | None = None
    url: str | None = None
    path: str | None = None  # breadcrumb shown in citations
    author: str | None = None
    updated_at: datetime | None = None
    access: tuple[str, ...] = (EVERYONE,)


@dataclass(frozen=True)
class SourceSpec:
    """Which source the items belong to. `kind` is "folder", "beir", and later "confluence" or "gdrive"."""

    name: str
    kind: str
    location: str | None = None


class Source(Protocol):
    spec: SourceSpec
    # True when `items()` lists everything under `listing_prefix` (all of the source when it is ""), so documents
    # there that it does not list have been deleted.
    complete_listing: bool
    listing_prefix: str

    def items(self) -> Iterator[SourceItem]: ...


@dataclass
class StaticSource:
    """A source whose items are already in memory (used by the BEIR loader and by tests)."""

    spec: SourceSpec
    item_list: list[SourceItem] = field(default_factory=list)
    complete_listing: bool = True
    listing_prefix: str = ""

    def items(self) -> Iterator[SourceItem]:
        return iter(self.item_list)
