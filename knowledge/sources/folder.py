"""A local folder of files. A document's external id is its path relative to the source's root folder.

Access rules (every ambiguity fails closed, and is reported in the sync report):
- `.access` files list one principal per line (`everyone`, `user:alice@example.com`, `group:eng`,
  `domain:example.com`; `#` starts a comment line), parsed by knowledge.access.parse_principal: emails and domains
  fold in ASCII, and a non-ASCII look-alike (a Kelvin sign for a `k`) is an error. `group:eng` is a local group:
  no synced directory defines it, so only people given it (an admin mapping, `--as group:eng`) hold it;
  `group:<source>/<name>` names a group of that source's synced directory (e.g. `group:drive/eng@acme.com`), whose
  members then see the folder's documents. One applies to the folder it sits in and everything below;
  the nearest one wins, looking all the way up the file system (indexing a subfolder or a single file never loses a
  restriction set above it). No `.access` anywhere above a document means `everyone`; one with no principals means
  nobody.
- An `.access` that cannot be read, is not a regular file (a directory, a dangling symlink, a pipe), is not UTF-8,
  is over 64 KB, or holds a line that is not a principal, means nobody. A UTF-8 byte-order mark is ignored.
- Symbolic links are followed only when their target is inside the source's root folder (and not hidden); a
  document reached through one gets the intersection of the access of the link's location and of the target's
  location (the stricter of both). Links leaving the root, dangling links and link loops are skipped and reported.
- A document's version names the file actually read: its resolved path, device and inode, size and mtime. A link
  retargeted to a decoy of the same size and mtime (`touch -r`) is a new version, so its content is read again
  with its new access: content and access always change together. The bytes are read from the resolved path
  listed, and only if it is still the same file (device, inode, size, mtime), else the item fails and keeps
  nothing new.
- Hard links: a file with several names inside the root gets the intersection of the access of all of them
  (a name outside the root cannot be seen; see docs/security.md).
- A folder that cannot be listed makes the listing incomplete: nothing indexed under it is deleted (reported).
- File names that are not valid UTF-8 keep their undecodable bytes as `\\xNN` in the document's id and title.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from knowledge.access import EVERYONE, parse_principal
from knowledge.errors import InvalidPrincipal, ItemUnavailable, Remedy, SourceConfigError, SourceUnavailable
from knowledge.sources.base import ChangeBatch, ItemRef, SourceItem, SourceSpec, register_source

ACCESS_FILE = ".access"
MAX_ACCESS_FILE_BYTES = 64 * 1024
NOBODY: tuple[str, ...] = ()
# The kinds an `.access` line may hold (parse_principal checks the rest: no spaces, no control characters such as
# a NUL, which Postgres text cannot even hold, no look-alikes).
ACCESS_KINDS = (EVERYONE, "user", "group", "domain")


@dataclass(frozen=True)
class AccessFile:
    """What one `.access` file grants. `problem` set means the file is unusable, so it grants nobody."""

    principals: tuple[str, ...]
    problem: str | None = None


def read_access_file(path: Path) -> AccessFile:
    """Parse an `.access` file; anything unreadable or malformed grants nobody (with the reason)."""
    try:
        info = path.stat()  # follows a symlink; a dangling one raises
    except OSError as exc:
        return AccessFile(NOBODY, f"cannot be read ({_reason(exc)})")
    if not stat.S_ISREG(info.st_mode):
        return AccessFile(NOBODY, "is not a regular file")
    if info.st_size > MAX_ACCESS_FILE_BYTES:
        return AccessFile(NOBODY, f"is larger than {MAX_ACCESS_FILE_BYTES // 1024} KB")
    try:
        data = path.read_bytes()
    except OSError as exc:
        return AccessFile(NOBODY, f"cannot be read ({_reason(exc)})")
    if b"\x00" in data:
        return AccessFile(NOBODY, "contains a NUL byte (not a text file?)")
    try:
        content = data.decode("utf-8-sig")  # a byte-order mark must not become part of the first principal
    except UnicodeDecodeError:
        return AccessFile(NOBODY, "is not UTF-8 text")
    return parse_access_lines(content)


def parse_access_lines(content: str) -> AccessFile:
    principals: list[str] = []
    for number, line in enumerate(content.splitlines(), start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        try:
            principals.append(parse_principal(entry, kinds=ACCESS_KINDS))
        except InvalidPrincipal as exc:
            return AccessFile(NOBODY, f"line {number} is not a principal (everyone, user:…, group:… or domain:…): "
                                      f"{str(exc)[:200]}")
    return AccessFile(tuple(dict.fromkeys(principals)))


def nearest_access(folder: Path, warn: Callable[[str], None]) -> tuple[str, ...]:
    """The access list of the nearest `.access` at or above `folder` (everyone if there is none)."""
    for current in (folder, *folder.parents):
        candidate = current / ACCESS_FILE
        if os.path.lexists(candidate):  # lexists: a dangling symlink or a directory named .access counts too
            found = read_access_file(candidate)
            if found.problem:
                warn(f"{candidate} {found.problem}: nobody may see the documents under {current} until it is fixed")
            return found.principals
    return (EVERYONE,)


def intersect_access(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    """Who may see a document that two access lists both govern (a link and its target): the stricter of both.
    Group membership is not known here, so `group:hr` ∩ `user:alice` is nobody: fail closed."""
    if EVERYONE in a:
        return b
    if EVERYONE in b:
        return a
    return tuple(p for p in a if p in set(b))


def is_inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class FolderSource:
    """Index `path` (a folder, or one file) as part of the folder source rooted at `root`.

    `root` defaults to `path` itself (or a file's folder). Indexing a subfolder or a file of an existing source
    passes that source's root, so external ids stay relative to it and only the listed part can be deleted.

    On the source interface: every sync lists the folder (cheap) and reports every file as a change with
    version "mtime_ns:size", so only files whose version moved are read; the same listing is the inventory, so
    files that are gone are pruned on every sync (`prune_on_every_sync`). There is no checkpoint. `warnings`,
    `unlisted_prefixes` and `vanished()` are the optional listing extras the indexer honours (see base.py).
    """

    prune_on_every_sync = True

    def __init__(self, path: Path, name: str | None = None, root: Path | None = None, *,
                 top_level_only: bool = False) -> None:
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {path}")
        self.path = path.resolve()
        self.root = (root or (self.path.parent if self.path.is_file() else self.path)).resolve()
        if not is_inside(self.path, self.root):
            raise ValueError(f"{self.path} is not inside the source folder {self.root}")
        self.spec = SourceSpec(name=name or self.root.name, kind="folder", location=str(self.root))
        # A folder listing is complete for that folder: what is no longer there was deleted. One file says nothing
        # about its neighbours.
        self.complete_listing = self.path.is_dir() and not top_level_only
        # The files directly in the folder (and its links), not its subfolders: one part of a split first sync.
        self.top_level_only = top_level_only
        self.listing_prefix = "" if self.path == self.root else self.path.relative_to(self.root).as_posix() + "/"
        # Filled by each listing: problems to report, and folders that could not be listed (nothing under them
        # may be deleted, as prefixes of external ids).
        self.warnings: list[str] = []
        self.unlisted_prefixes: list[str] = []
        self._access_cache: dict[Path, tuple[str, ...]] = {}
        self._listed: list[SourceItem] | None = None

    # --- listing ---------------------------------------------------------------------------------------------

    def files(self) -> list[Path]:
        """Every regular file that is not hidden, by its path under the root (symlinks not resolved). Unsupported
        types are listed too, so the sync can report them."""
        self.warnings = []
        self.unlisted_prefixes = []
        if self.path.is_file():
            return [self.path]
        found: list[Path] = []
        self._scan(self.path, self.path, (self.path,), found)
        return found

    def _scan(self, folder: Path, real_folder: Path, real_ancestors: tuple[Path, ...], found: list[Path]) -> None:
        """List `folder` (its path as the source sees it) whose real location is `real_folder`; `real_ancestors`
        are the real folders being listed above it, so a link back to one of them is caught as a loop."""
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            prefix = self._external_id(folder) + "/" if folder != self.root else ""
            self.unlisted_prefixes.append(prefix)
            self.warn(f"could not list {self._external_id(folder) or '.'}/ ({_reason(exc)}): nothing indexed under "
                      "it was deleted or updated")
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = folder / entry.name
            try:
                if entry.is_symlink():
                    self._follow_link(path, real_ancestors, found)
                elif entry.is_dir(follow_symlinks=False):
                    if self.top_level_only and folder == self.path:
                        continue  # each subfolder is a part of its own
                    real = real_folder / entry.name
                    self._scan(path, real, (*real_ancestors, real), found)
                elif entry.is_file(follow_symlinks=False):
                    found.append(path)
            except OSError as exc:
                self.warn(f"skipped {self._external_id(path)}: {_reason(exc)}")

    def _follow_link(self, path: Path, real_ancestors: tuple[Path, ...], found: list[Path]) -> None:
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError) as exc:  # dangling (OSError) or a loop (RuntimeError before Python 3.13)
            self.warn(f"skipped {self._external_id(path)}: a broken symbolic link ({_reason(exc)})")
            return
        if not is_inside(target, self.root):
            self.warn(f"skipped {self._external_id(path)}: a symbolic link to outside the source folder")
            return
        if any(part.startswith(".") for part in target.relative_to(self.root).parts):
            self.warn(f"skipped {self._external_id(path)}: a symbolic link to a hidden file or folder")
            return
        if target.is_dir():
            if any(target == a or is_inside(a, target) for a in real_ancestors):
                self.warn(f"skipped {self._external_id(path)}: a symbolic link to a folder that contains it (a loop)")
                return
            self._scan(path, target, (*real_ancestors, target), found)
        elif target.is_file():
            found.append(path)

    def items(self) -> Iterator[SourceItem]:
        seen: set[str] = set()
        listed: list[tuple[Path, str, Path, os.stat_result]] = []
        # (device, inode) -> the real paths it has here: several are hard links (a symlink resolves to one of them)
        names: dict[tuple[int, int], set[Path]] = {}
        for path in self.files():
            external_id = self._external_id(path)
            if external_id in seen:  # two names differing only in undecodable bytes
                self.warn(f"skipped {external_id}: another file has the same printable name")
                continue
            seen.add(external_id)
            try:
                real = path.resolve(strict=True)
                info = real.stat()
            except (OSError, RuntimeError) as exc:
                self.warn(f"skipped {external_id}: {_reason(exc)}")
                continue
            listed.append((path, external_id, real, info))
            names.setdefault((info.st_dev, info.st_ino), set()).add(real)
        for path, external_id, real, info in listed:
            access = self.access_for(path)
            for other in sorted(names[(info.st_dev, info.st_ino)]):  # hard links: the stricter of all its places
                if other != real:
                    access = intersect_access(access, self._folder_access(other.parent))
            yield SourceItem(
                external_id=external_id,
                filename=printable_name(path.name),
                read=_IdentityRead(real, info),
                url=path.as_uri(),
                path=f"{self.spec.name}/{external_id}",
                updated_at=datetime.fromtimestamp(info.st_mtime, tz=UTC),
                access=access,
                version=file_version(real, info),
                size=info.st_size,
            )

    # --- parts: a first sync split across workers (knowledge.ingest.split) -------------------------------------

    def parts(self) -> list[str]:
        """The units a first sync can be split into, as external-id prefixes: each top-level folder ("name/") and,
        as one more unit, the files and links directly in the folder (""). None to split (an empty list) for one
        file, a subfolder of a source, or a name that is not UTF-8 (a unit is stored as text)."""
        if self.path != self.root or not self.path.is_dir() or self.top_level_only:
            return []
        units: list[str] = []
        loose = False
        try:
            with os.scandir(self.root) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            return []  # the sync itself reports it
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if printable_name(entry.name) != entry.name:
                return []
            if entry.is_dir(follow_symlinks=False):
                units.append(entry.name + "/")
            else:
                loose = True
        return ([""] if loose else []) + units

    def part(self, unit: str) -> FolderSource:
        """The source limited to one unit of `parts()`: same root, so the same external ids and access."""
        if unit == "":
            return FolderSource(self.root, self.spec.name, self.root, top_level_only=True)
        return FolderSource(self.root / unit.rstrip("/"), self.spec.name, self.root)

    # --- the source interface (see knowledge.sources.base) ---------------------------------------------------

    async def check(self) -> None:
        if not self.path.exists():
            raise folder_missing(self.spec.name, self.path)

    async def changes(self, checkpoint: str | None, *, full: bool = False) -> AsyncIterator[ChangeBatch]:
        self._access_cache.clear()  # .access files may have changed since the last listing
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

    def vanished(self, external_ids: list[str]) -> list[str]:
        """Which of these indexed documents no longer exist on disk (so a partial sync can drop a moved file's old
        copy). Only a definite "no such file" counts; a permission error or an id that cannot be mapped back to a
        file name (undecodable bytes) keeps the document."""
        gone = []
        for external_id in external_ids:
            if "\\" in external_id:
                continue
            try:
                os.lstat(self.root / external_id)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    gone.append(external_id)
        return gone

    # --- access ----------------------------------------------------------------------------------------------

    def access_for(self, path: Path) -> tuple[str, ...]:
        """The access of a file: its folder's nearest `.access`, intersected with its real location's when it is
        reached through a symbolic link."""
        access = self._folder_access(path.parent)
        real = path.resolve()
        if real.parent != path.parent:
            access = intersect_access(access, self._folder_access(real.parent))
        return access

    def _folder_access(self, folder: Path) -> tuple[str, ...]:
        if folder not in self._access_cache:
            self._access_cache[folder] = nearest_access(folder, self.warn)
        return self._access_cache[folder]

    def warn(self, message: str) -> None:
        message = printable_name(message)
        if message not in self.warnings:
            self.warnings.append(message)

    def _external_id(self, path: Path) -> str:
        return printable_name(path.relative_to(self.root).as_posix()) if path != self.root else ""


def file_version(real: Path, info: os.stat_result) -> str:
    """What identifies the bytes a document was read from: the file itself (resolved path, device, inode), not
    the name it was reached by, plus its size and mtime. A link retargeted to a decoy of the same size and mtime
    changes it, so the new target's text is read together with the new access."""
    return f"{info.st_mtime_ns}:{info.st_size}:{info.st_dev}:{info.st_ino}:{os.fsencode(str(real)).hex()}"


@dataclass(frozen=True)
class _IdentityRead:
    """Read the file listed, and only that file: open its resolved path, then check that what was opened is still
    the listed file (device, inode, size, mtime). A link retargeted or a file replaced between listing and reading
    fails the item (kept at its previous version; the next sync reads it with its new access)."""

    real: Path
    info: os.stat_result

    def __call__(self) -> bytes:
        with open(self.real, "rb") as handle:
            now = os.fstat(handle.fileno())
            if (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns) != (
                self.info.st_dev, self.info.st_ino, self.info.st_size, self.info.st_mtime_ns
            ):
                raise ItemUnavailable("the file changed between listing and reading; the next sync reads it again")
            return handle.read(self.info.st_size + 1)[: self.info.st_size]


def printable_name(name: str) -> str:
    """File names that are not valid UTF-8 keep their undecodable bytes as `\\xNN`, so they can be stored and
    shown (and two such names stay distinct); reading still uses the real path."""
    return os.fsencode(name).decode("utf-8", errors="backslashreplace")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def folder_missing(name: str, path: Path) -> SourceUnavailable:
    """A stored folder source whose folder is gone: most often an unmounted drive, sometimes a source to drop."""
    return SourceUnavailable(
        f"source {name!r}: the folder {path} does not exist (is the drive mounted?); fix the path or remove the source",
        remedy=Remedy.REMOVE_SOURCE, source=name,
    )


@register_source("folder")
def build_folder_source(name: str, config: Mapping[str, Any]) -> FolderSource:
    """A stored folder source: config {"path": "/abs/path"}."""
    path = Path(str(config["path"]))
    try:
        return FolderSource(path, name)
    except FileNotFoundError as exc:
        raise folder_missing(name, path) from exc
    except ValueError as exc:
        raise SourceConfigError(f"source {name!r}: {exc}") from exc
