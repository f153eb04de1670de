"""A local folder of files. A document's external id is its path relative to the source's root folder.

Access lists come from `.access` files: one principal per line (`everyone`, `user:alice@example.com`,
`group:eng`), applying to the folder they sit in and everything below it; the nearest one wins, looking all the way
up the file system (so indexing a subfolder or a single file never loses a restriction set above it). No `.access`
file anywhere above a document means `everyone`; an `.access` file with no principals means nobody.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Mapping

from knowledge.errors import SourceConfigError, SourceUnavailable
from knowledge.sources.base import EVERYONE, ChangeBatch, ItemRef, SourceItem, SourceSpec, register_source

ACCESS_FILE = ".access"


class FolderSource:
    """Index `path` (a folder, or one file) as part of the folder source rooted at `root`.

    `root` defaults to `path` itself (or a file's folder). Indexing a subfolder or a file of an existing source
    passes that source's root, so external ids stay relative to it and only the listed part can be deleted.

    On the source interface: every sync lists the folder (cheap) and reports every file as a change with
    version "mtime_ns:size", so only files whose version moved are read; the same listing is the inventory, so
    files that are gone are pruned on every sync (`prune_on_every_sync`). There is no checkpoint.
    """

    prune_on_every_sync = True

    def __init__(self, path: Path, name: str | None = None, root: Path | None = None) -> None:
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {path}")
        self.path = path.resolve()
        self.root = (root or (self.path.parent if self.path.is_file() else self.path)).resolve()
        if self.path != self.root and self.root not in self.path.parents:
            raise ValueError(f"{self.path} is not inside the source folder {self.root}")
        self.spec = SourceSpec(name=name or self.root.name, kind="folder", location=str(self.root))
        # A folder listing is complete for that folder: what is no longer there was deleted. One file says nothing
        # about its neighbours.
        self.complete_listing = self.path.is_dir()
        self.listing_prefix = "" if self.path == self.root else self.path.relative_to(self.root).as_posix() + "/"
        self._access_cache: dict[Path, tuple[str, ...]] = {}
        self._listed: list[SourceItem] | None = None

    def files(self) -> list[Path]:
        """Every file that is not hidden. Unsupported types are listed too, so the sync can report them."""
        if self.path.is_file():
            return [self.path]
        found = []
        for path in sorted(self.path.rglob("*")):
            relative = path.relative_to(self.path)
            if any(part.startswith(".") for part in relative.parts) or not path.is_file():
                continue
            found.append(path)
        return found

    def items(self) -> Iterator[SourceItem]:
        for path in self.files():
            relative = _printable(path.relative_to(self.root).as_posix())
            stat = path.stat()
            yield SourceItem(
                external_id=relative,
                filename=path.name,
                read=path.read_bytes,
                url=path.as_uri(),
                path=f"{self.spec.name}/{relative}",
                updated_at=datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc),
                access=self._access_for(path.parent),
                version=f"{stat.st_mtime_ns}:{stat.st_size}",
            )

    # --- the source interface (see knowledge.sources.base) ---

    async def check(self) -> None:
        if not self.path.exists():
            raise SourceUnavailable(
                f"source {self.spec.name!r}: the folder {self.path} does not exist (is the drive mounted?); "
                f"fix the path or run `ragbot source remove {self.spec.name}`"
            )

    async def changes(self, checkpoint: str | None, *, full: bool = False) -> AsyncIterator[ChangeBatch]:
        self._access_cache.clear()
        listed = await asyncio.to_thread(lambda: list(self.items()))
        self._listed = listed
        yield ChangeBatch(items=listed, total=len(listed))

    async def inventory(self) -> list[ItemRef] | None:
        if not self.complete_listing:
            return None  # one file says nothing about its neighbours
        listed = self._listed if self._listed is not None else await asyncio.to_thread(lambda: list(self.items()))
        return [ItemRef(item.external_id, item.access) for item in listed]

    async def aclose(self) -> None:
        self._listed = None

    def _access_for(self, folder: Path) -> tuple[str, ...]:
        if folder not in self._access_cache:
            self._access_cache[folder] = _nearest_access(folder)
        return self._access_cache[folder]


def _printable(name: str) -> str:
    """File names that are not valid UTF-8 (undecodable bytes) are kept with a replacement character, so they can
    be stored and shown; reading still uses the real path."""
    return os.fsencode(name).decode("utf-8", errors="replace")


def _nearest_access(folder: Path) -> tuple[str, ...]:
    for current in (folder, *folder.parents):
        access_file = current / ACCESS_FILE
        if access_file.is_file():
            lines = access_file.read_text(encoding="utf-8", errors="replace").splitlines()
            return tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    return (EVERYONE,)


@register_source("folder")
def build_folder_source(name: str, config: Mapping[str, Any]) -> FolderSource:
    """A stored folder source: config {"path": "/abs/path"}."""
    path = Path(str(config["path"]))
    try:
        return FolderSource(path, name)
    except FileNotFoundError as exc:
        raise SourceUnavailable(
            f"source {name!r}: the folder {path} does not exist (is the drive mounted?); "
            f"fix the path or run `ragbot source remove {name}`"
        ) from exc
    except ValueError as exc:
        raise SourceConfigError(f"source {name!r}: {exc}") from exc
