"""A local folder of files. A document's external id is its path relative to the folder.

Access lists come from `.access` files: one principal per line (`everyone`, `user:alice@example.com`,
`group:eng`), applying to the folder they sit in and everything below it; the nearest one wins. No `.access`
file anywhere above a document means `everyone`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from knowledge.sources.base import EVERYONE, SourceItem, SourceSpec

ACCESS_FILE = ".access"


class FolderSource:
    complete_listing = True

    def __init__(self, root: Path, name: str | None = None) -> None:
        if not root.exists():
            raise FileNotFoundError(f"no such file or folder: {root}")
        self.root = root.resolve()
        self.single_file = self.root.is_file()
        if self.single_file:
            # One file: it joins its folder's source, and nothing else in that source is touched.
            self.complete_listing = False
        base = self.root.parent if self.single_file else self.root
        self.spec = SourceSpec(name=name or base.name, kind="folder", location=str(base))
        self._access_cache: dict[Path, tuple[str, ...]] = {}

    @property
    def base(self) -> Path:
        return self.root.parent if self.single_file else self.root

    def files(self) -> list[Path]:
        """Every file that is not hidden. Unsupported types are listed too, so the sync can report them."""
        if self.single_file:
            return [self.root]
        found = []
        for path in sorted(self.root.rglob("*")):
            relative = path.relative_to(self.root)
            if any(part.startswith(".") for part in relative.parts) or not path.is_file():
                continue
            found.append(path)
        return found

    def items(self) -> Iterator[SourceItem]:
        for path in self.files():
            relative = path.relative_to(self.base).as_posix()
            stat = path.stat()
            yield SourceItem(
                external_id=relative,
                filename=path.name,
                read=path.read_bytes,
                url=path.as_uri(),
                path=f"{self.spec.name}/{relative}",
                updated_at=datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc),
                access=self._access_for(path.parent),
            )

    def _access_for(self, folder: Path) -> tuple[str, ...]:
        if folder not in self._access_cache:
            self._access_cache[folder] = _nearest_access(folder, self.base)
        return self._access_cache[folder]


def _nearest_access(folder: Path, base: Path) -> tuple[str, ...]:
    current = folder
    while True:
        access_file = current / ACCESS_FILE
        if access_file.is_file():
            principals = [
                line.strip() for line in access_file.read_text().splitlines() if line.strip() and not line.startswith("#")
            ]
            return tuple(principals) or (EVERYONE,)
        if current == base or current.parent == current:
            return (EVERYONE,)
        current = current.parent
