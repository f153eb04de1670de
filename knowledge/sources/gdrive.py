"""Google Drive: folders (recursively) and whole shared drives, kept fresh through Drive's Changes API.

How a sync goes:
- The first (or a full) sync takes `changes.getStartPageToken` *before* walking the scope (one token per change log
  the scope lives in: the user's for My Drive folders, and each shared drive's own, read with `driveId`), then lists every folder
  of the scope with `files.list` (shared drives need `supportsAllDrives` and `includeItemsFromAllDrives`), following
  shortcuts to their targets once. The checkpoint stores that token and the scope's shape: which folders are in it
  (with their breadcrumb), which folder each file sits in, and which shortcuts point where.
- Later syncs walk `changes.list` from each stored token (following `nextPageToken` until a page carries
  `newStartPageToken`, which is stored) and keep only changes inside the scope: a file moved out
  leaves the index, one moved in joins it, trashed or removed files are deleted, and a folder moved, renamed,
  trashed or lost takes its whole subtree with it.
- A file's version is its `md5Checksum` (binary files) or `modifiedTime` (Google Docs, Sheets, Slides), with its
  name: sharing changes move neither, so they update access without fetching content again.
- Content: Docs are exported as HTML (headings, lists and tables kept), Sheets as XLSX read sheet by sheet into rows
  that repeat the header in every chunk, Slides as plain text; PDF, DOCX, TXT, MD, HTML and CSV are downloaded.
- Access: `permissions.list` → `user:<email>`, `group:<source>/<email>` (a Google group, scoped to this source's
  directory: knowledge.access), `domain:<domain>` (or `everyone` for the domains in GDRIVE_EVERYONE_DOMAINS),
  anyone-with-the-link → `everyone`. Emails and domains fold in ASCII only. Shared-drive members come back from
  `permissions.list` as inherited permissions, so they count.

Requests go through knowledge.sources.google_api (as the group directory's do): google-api-python-client is
synchronous, so every request runs in a worker thread (with its own httplib2 connection, which is not thread-safe)
under a semaphore, and the source is async to the rest of ragbot. Rate limits (429, and 403 `rateLimitExceeded` /
`userRateLimitExceeded`) and 5xx back off exponentially (honouring Retry-After), a bounded number of times; past that
the sync fails cleanly and the checkpoint stays where it was.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Literal, TypeVar

from google.oauth2 import service_account
from googleapiclient.errors import HttpError
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from knowledge.access import EVERYONE, check_scope_name, fold_ascii, scoped_group
from knowledge.errors import ItemUnavailable, SourceAuthError, SourceConfigError, SourceUnavailable
from knowledge.sources.base import ChangeBatch, ItemRef, SourceItem, SourceSpec, register_source
from knowledge.sources.google_api import GoogleApiClient, error_reason, http_reason, short_message

# The Google client libraries are imported at the top: this module is loaded only when a Drive source is used (the
# registry in knowledge.sources.base imports a kind's module on first use), never by `ragbot --help` or a folder sync.

logger = logging.getLogger(__name__)
T = TypeVar("T")
# googleapiclient logs every 403 it inspects (even the per-file ones ragbot reports itself) as a warning.
logging.getLogger("googleapiclient.http").setLevel(logging.ERROR)

DRIVE_SCOPE = "https://www.googleapis.com/auth/drive.readonly"
DEFAULT_CREDENTIALS_ENV = "GOOGLE_SERVICE_ACCOUNT_JSON"

FOLDER = "application/vnd.google-apps.folder"
SHORTCUT = "application/vnd.google-apps.shortcut"
GOOGLE_DOC = "application/vnd.google-apps.document"
GOOGLE_SHEET = "application/vnd.google-apps.spreadsheet"
GOOGLE_SLIDES = "application/vnd.google-apps.presentation"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

# Google-native files: (export MIME type, suffix that picks ragbot's parser).
EXPORTS = {
    GOOGLE_DOC: ("text/html", ".html"),
    GOOGLE_SHEET: (XLSX, ".xlsx"),
    GOOGLE_SLIDES: ("text/plain", ".txt"),
}
# Files downloaded as they are: MIME type -> suffix (used when the file name has no suffix ragbot knows).
DOWNLOADS = {
    "application/pdf": ".pdf",
    DOCX: ".docx",
    "text/plain": ".txt",
    "text/markdown": ".md",
    "text/x-markdown": ".md",
    "text/html": ".html",
    "text/csv": ".csv",
    XLSX: ".xlsx",
}
DOWNLOAD_SUFFIXES = {".pdf", ".docx", ".txt", ".md", ".markdown", ".html", ".htm", ".csv", ".xlsx"}
EXPORT_LIMIT_MB = 10  # Drive refuses larger exports (403 exportSizeLimitExceeded)

FILE_FIELDS = (
    "id,name,mimeType,parents,driveId,trashed,modifiedTime,version,md5Checksum,size,webViewLink,"
    "owners(displayName,emailAddress),shortcutDetails(targetId,targetMimeType)"
)


class GoogleDriveSettings(BaseSettings):
    """Settings shared by every Drive source (per-source options live in the stored source config)."""

    model_config = SettingsConfigDict(env_prefix="GDRIVE_", env_file=".env", extra="ignore")

    # Workspace domains whose `domain:` grants mean everyone in the company (comma-separated), e.g. "acme.com".
    everyone_domains: str = ""
    # Files larger than this (by Drive's reported size) are skipped without downloading.
    max_file_mb: int = Field(default=25, ge=1)
    # Requests to Drive in flight at once.
    concurrency: int = Field(default=4, ge=1, le=32)
    # Rate limits and server errors: retries per request, first wait, longest wait (seconds).
    max_retries: int = Field(default=6, ge=0)
    backoff_seconds: float = Field(default=1.0, ge=0)
    max_backoff_seconds: float = Field(default=64.0, ge=0)
    # Another API root (a proxy, or a local fake in tests); unset means Google's.
    api_endpoint: str | None = None

    def everyone_domain_set(self) -> set[str]:
        return {fold_ascii(d.strip()) for d in self.everyone_domains.split(",") if d.strip()}


@dataclass(frozen=True)
class GoogleDriveConfig:
    """What `ragbot source add gdrive` stores. Secrets never: only the name of the variable holding the key."""

    folders: tuple[str, ...] = ()
    shared_drives: tuple[str, ...] = ()
    credentials_env: str = DEFAULT_CREDENTIALS_ENV
    subject: str | None = None
    visibility: Literal["permissions", "everyone"] = "permissions"
    # A Workspace admin the service account acts as to read groups (knowledge.sources.google_directory).
    admin_email: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"folders": list(self.folders), "shared_drives": list(self.shared_drives),
                "credentials_env": self.credentials_env, "subject": self.subject, "visibility": self.visibility,
                "admin_email": self.admin_email}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GoogleDriveConfig:
        return cls(
            folders=tuple(data.get("folders") or ()), shared_drives=tuple(data.get("shared_drives") or ()),
            credentials_env=data.get("credentials_env") or DEFAULT_CREDENTIALS_ENV, subject=data.get("subject"),
            visibility=data.get("visibility") or "permissions", admin_email=data.get("admin_email") or None,
        )


_DRIVE_ID = re.compile(r"^[A-Za-z0-9_-]{4,}$")
_DRIVE_LINK = re.compile(r"/(?:folders|drives|d)/([A-Za-z0-9_-]{4,})|[?&]id=([A-Za-z0-9_-]{4,})")


def drive_id_from(text: str) -> str:
    """A folder or shared-drive id, given the id itself or a drive.google.com link to it. Raises ValueError."""
    text = text.strip()
    if _DRIVE_ID.match(text):
        return text
    match = _DRIVE_LINK.search(text)
    if match:
        return match.group(1) or match.group(2)
    raise ValueError(f"{text!r} is not a Drive folder or shared drive id: pass the last part of its "
                     f"drive.google.com/drive/folders/<id> link (or the link itself)")


class DriveSourceError(RuntimeError):
    """The whole sync cannot go on. The message names the problem and the fix; nothing in the index is touched.
    `kind`: "auth" (credentials refused or missing), "unavailable" (network, rate limits past the bound) or
    "config" (a folder or drive not found or not shared)."""

    def __init__(self, message: str, kind: Literal["auth", "unavailable", "config"] = "config") -> None:
        super().__init__(message)
        self.kind = kind


class DriveFileError(Exception):
    """One file cannot be indexed. `kind`: "type" (a type ragbot does not read: reported as skipped), "size"
    (over a size limit) or "error" (Drive refused: not downloadable, gone, export too large...)."""

    def __init__(self, reason: str, kind: Literal["type", "size", "error"] = "error") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


# ---------------------------------------------------------------------------------------------------------------
# Credentials and the API client
# ---------------------------------------------------------------------------------------------------------------


def load_credentials(
    credentials_env: str = DEFAULT_CREDENTIALS_ENV, subject: str | None = None
) -> service_account.Credentials:
    """Service-account credentials from the JSON in `credentials_env`, else from the file named by
    GOOGLE_APPLICATION_CREDENTIALS; with `subject`, impersonating that user (domain-wide delegation)."""
    raw = os.environ.get(credentials_env, "").strip()
    credentials: service_account.Credentials
    try:
        if raw:
            try:
                info = json.loads(raw)
            except json.JSONDecodeError:
                raise DriveSourceError(
                    f"{credentials_env} does not hold JSON: put the service account's JSON key in it (the whole file)",
                    "auth") from None
            credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]  # google-auth leaves it unannotated
                info, scopes=[DRIVE_SCOPE])
        elif os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
            path = os.environ["GOOGLE_APPLICATION_CREDENTIALS"]
            if not os.path.isfile(path):
                raise DriveSourceError(f"GOOGLE_APPLICATION_CREDENTIALS names {path}, which is not a file: "
                                       f"point it at the service account's JSON key", "auth")
            credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]  # google-auth leaves it unannotated
                path, scopes=[DRIVE_SCOPE])
        else:
            raise DriveSourceError(
                f"no Google credentials: put the service account's JSON key in {credentials_env} "
                f"(or its path in GOOGLE_APPLICATION_CREDENTIALS)", "auth"
            )
    except ValueError as exc:  # missing fields, a key that does not parse
        raise DriveSourceError(f"the service account key in {credentials_env or 'GOOGLE_APPLICATION_CREDENTIALS'} "
                               f"is not valid ({exc}): download a new JSON key for the service account", "auth") from None
    if subject:
        credentials = credentials.with_subject(subject)  # type: ignore[no-untyped-call]  # google-auth leaves it unannotated
    return credentials


class DriveClient(GoogleApiClient):
    """Drive v3 through google-api-python-client, async, with bounded concurrency and rate-limit backoff
    (knowledge.sources.google_api). `credentials=None` talks without authentication (only useful against a local
    fake). Errors of one file (403, 404...) reach the caller as HttpError; those of the whole sync are
    DriveSourceError."""

    api_name = "Drive"

    def __init__(self, credentials: Any, settings: GoogleDriveSettings | None = None) -> None:
        self.settings: GoogleDriveSettings = settings or GoogleDriveSettings()
        super().__init__("drive", "v3", credentials, self.settings)

    def exhausted(self, error: Any, retries: int) -> Exception:
        return DriveSourceError(
            f"Google Drive still answers {http_reason(error)} after {retries} retries "
            f"({'rate limited' if error.status_code < 500 else 'a Google-side outage'}); "
            f"the next sync carries on from the same checkpoint", "unavailable"
        )

    def refused(self, error: Any) -> Exception | None:
        if error.status_code == 401:
            return DriveSourceError("Google Drive rejected the credentials (401): check the service account key", "auth")
        return None  # one file's error (403, 404...): the caller decides

    def token_refused(self, error: BaseException) -> Exception:
        return DriveSourceError(
            f"Google refused the service account's token ({short_message(error)}): check the JSON key, and for a "
            f"source that reads as a user, that domain-wide delegation grants the scope {DRIVE_SCOPE}", "auth"
        )

    def unreachable(self, error: BaseException) -> Exception:
        return DriveSourceError(f"cannot reach the Google Drive API ({short_message(error)}): check the network "
                                f"(and GDRIVE_API_ENDPOINT if set)", "unavailable")

    # -- the calls ragbot makes -------------------------------------------------------------------------------
    async def get_file(self, file_id: str) -> dict[str, Any]:
        file: dict[str, Any] = await self.call(
            lambda s: s.files().get(fileId=file_id, fields=FILE_FIELDS, supportsAllDrives=True))
        return file

    async def get_drive(self, drive_id: str) -> dict[str, Any]:
        drive: dict[str, Any] = await self.call(lambda s: s.drives().get(driveId=drive_id, fields="id,name"))
        return drive

    async def list_children(self, folder_id: str, drive_id: str | None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        token: str | None = None
        corpus = {"corpora": "drive", "driveId": drive_id} if drive_id else {"corpora": "user"}
        while True:
            page = await self.call(lambda s, t=token: s.files().list(
                q=f"'{folder_id}' in parents and trashed = false", pageSize=1000, pageToken=t,
                fields=f"nextPageToken,files({FILE_FIELDS})", supportsAllDrives=True,
                includeItemsFromAllDrives=True, **corpus,
            ))
            found.extend(page.get("files", []))
            token = page.get("nextPageToken")
            if not token:
                return found

    async def start_page_token(self, drive_id: str | None = None) -> str:
        """The token of "now" in one change log: the user's (`drive_id` None) or a shared drive's own. Each shared
        drive keeps its own log, and Google says apps must not rely on shared-drive file events appearing in the
        user's ("Retrieve changes", developers.google.com/workspace/drive/api/guides/manage-changes)."""
        extra = {"driveId": drive_id} if drive_id else {}
        reply = await self.call(lambda s: s.changes().getStartPageToken(supportsAllDrives=True, **extra))
        token: str = reply["startPageToken"]
        return token

    async def changes_page(self, token: str, drive_id: str | None = None) -> dict[str, Any]:
        """One page of a change log: `nextPageToken` while more pages follow, `newStartPageToken` on the last
        (changes.list reference). `drive_id` reads that shared drive's log."""
        extra: dict[str, Any] = {"driveId": drive_id} if drive_id else {"spaces": "drive"}
        page: dict[str, Any] = await self.call(lambda s: s.changes().list(
            pageToken=token, pageSize=1000, includeRemoved=True, supportsAllDrives=True,
            includeItemsFromAllDrives=True, **extra,
            fields=f"nextPageToken,newStartPageToken,changes(changeType,removed,fileId,driveId,time,"
                   f"file({FILE_FIELDS}))",
        ))
        return page

    async def permissions(self, file_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await self.call(lambda s, t=token: s.permissions().list(
                fileId=file_id, supportsAllDrives=True, pageSize=100, pageToken=t,
                fields="nextPageToken,permissions(id,type,emailAddress,domain,role,deleted)",
            ))
            found.extend(page.get("permissions", []))
            token = page.get("nextPageToken")
            if not token:
                return found

    async def export(self, file_id: str, mime_type: str) -> bytes:
        data: bytes = await self.call(lambda s: s.files().export_media(fileId=file_id, mimeType=mime_type))
        return data

    async def download(self, file_id: str) -> bytes:
        data: bytes = await self.call(lambda s: s.files().get_media(fileId=file_id, supportsAllDrives=True))
        return data


# ---------------------------------------------------------------------------------------------------------------
# The scope: walking it, and keeping only the changes inside it
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriveEntry:
    """A file in scope, as listed (no content yet): its Drive metadata and the folder path it is shown under."""

    file: dict[str, Any]
    folder_path: str

    @property
    def id(self) -> str:
        return str(self.file["id"])

    @property
    def name(self) -> str:
        return str(self.file.get("name") or self.file["id"])

    @property
    def mime_type(self) -> str:
        return str(self.file.get("mimeType", ""))

    @property
    def version(self) -> str:
        """Moves when the content (or the name, which is the title) changes; a sharing change moves it not."""
        content = self.file.get("md5Checksum") or self.file.get("modifiedTime") or f"v{self.file.get('version')}"
        return f"{content}|{self.name}"

    @property
    def url(self) -> str | None:
        return self.file.get("webViewLink")

    @property
    def path(self) -> str:
        return f"{self.folder_path}/{self.name}" if self.folder_path else self.name

    @property
    def owner(self) -> str | None:
        owners = self.file.get("owners") or []
        if not owners:
            return None
        owner: str | None = owners[0].get("emailAddress") or owners[0].get("displayName")
        return owner

    @property
    def modified(self) -> datetime | None:
        value = self.file.get("modifiedTime")
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None

    @property
    def title(self) -> str:
        stem, suffix = os.path.splitext(self.name)
        return stem if suffix.lower() in DOWNLOAD_SUFFIXES and stem else self.name


@dataclass
class ScopeState:
    """The scope's shape, stored in the checkpoint with the changes token.

    folders: folder id -> [parent folder id or None for a scope root, breadcrumb, shared drive id or None]
    files: file id -> the folder id it is listed under (for a shortcut's target: the shortcut's folder)
    shortcuts: shortcut id -> target id
    """

    token: str = ""  # before issue 29: the user's change log only (read as tokens[""])
    folders: dict[str, list[Any]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    shortcuts: dict[str, str] = field(default_factory=dict)
    # One changes token per change log the scope needs: "" = the user's (My Drive roots), else a shared drive id.
    tokens: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"tokens": self.tokens, "folders": self.folders, "files": self.files,
                           "shortcuts": self.shortcuts}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> ScopeState | None:
        if not text:
            return None
        data = json.loads(text)
        tokens = data.get("tokens") or ({"": data["token"]} if data.get("token") else {})
        return cls("", data.get("folders", {}), data.get("files", {}), data.get("shortcuts", {}), dict(tokens))

    def logs(self) -> set[str]:
        """The change logs the scope's roots live in: "" for My Drive, the shared drive id otherwise."""
        return {drive or "" for _fid, (parent, _path, drive) in self.folders.items() if parent is None}

    def subtree(self, folder_id: str) -> set[str]:
        """The folder and every folder below it."""
        below = {folder_id}
        grew = True
        while grew:
            grew = False
            for fid, (parent, _path, _drive) in self.folders.items():
                if parent in below and fid not in below:
                    below.add(fid)
                    grew = True
        return below

    def drop_subtree(self, folder_id: str) -> set[str]:
        """Forget a folder and everything below it; returns the file ids that were in it."""
        folders = self.subtree(folder_id)
        gone = {fid for fid, parent in self.files.items() if parent in folders}
        for fid in gone:
            del self.files[fid]
        for fid in folders:
            self.folders.pop(fid, None)
        for shortcut, target in list(self.shortcuts.items()):
            if shortcut in gone or target in gone:
                self.shortcuts.pop(shortcut, None)
        return gone


@dataclass
class ScanResult:
    entries: list[DriveEntry]
    deleted: set[str]
    state: ScopeState
    skipped: list[tuple[str, str]]  # (id or name, reason): shortcuts to nowhere and the like


class DriveScope:
    """Walk and follow the folders and shared drives of one source."""

    def __init__(self, client: DriveClient, config: GoogleDriveConfig) -> None:
        self.client = client
        self.config = config

    async def roots(self) -> list[tuple[str, str, str | None]]:
        """(folder id, breadcrumb, shared drive id) for each root; raises DriveSourceError naming a missing one."""
        found: list[tuple[str, str, str | None]] = []
        for drive_id in self.config.shared_drives:
            try:
                drive = await self.client.get_drive(drive_id)
            except HttpError as error:
                raise DriveSourceError(_unreachable("shared drive", drive_id, error)) from None
            found.append((drive_id, drive.get("name") or drive_id, drive_id))
        for folder_id in self.config.folders:
            try:
                folder = await self.client.get_file(folder_id)
            except HttpError as error:
                raise DriveSourceError(_unreachable("folder", folder_id, error)) from None
            if folder.get("mimeType") != FOLDER:
                raise DriveSourceError(f"{folder_id} ({folder.get('name')}) is not a folder: pass a folder id "
                                       f"(the last part of its drive.google.com/drive/folders/… link)")
            if folder.get("trashed"):
                raise DriveSourceError(f"folder {folder_id} ({folder.get('name')}) is in the trash: restore it or "
                                       f"remove it from the source")
            found.append((folder_id, folder.get("name") or folder_id, folder.get("driveId")))
        if not found:
            raise DriveSourceError("a Google Drive source needs at least one folder or shared drive")
        return found

    async def scan(self, unit: str | None = None) -> ScanResult:
        """List the whole scope, or with `unit` one unit of a split first sync (`units`): a root's top-level folder
        ("ROOT/FOLDER") or the files directly in a root ("ROOT/"). The changes token is taken first, so nothing
        changed meanwhile is missed (not for a unit: a part's listing sets no checkpoint, knowledge.ingest.split)."""
        roots = await self.roots()
        state = ScopeState()
        if unit is None:
            for log in sorted({drive_id or "" for _f, _n, drive_id in roots}):  # before the walk: nothing is missed
                state.tokens[log] = await self.client.start_page_token(log or None)
        entries: dict[str, DriveEntry] = {}
        skipped: list[tuple[str, str]] = []
        for folder_id, name, drive_id in roots:
            state.folders[folder_id] = [None, name, drive_id]
        if unit is None:
            await self._walk([r[0] for r in roots], state, entries, skipped)
        else:
            await self._walk_unit(unit, state, entries, skipped)
        return ScanResult(list(entries.values()), set(), state, skipped)

    async def units(self) -> list[str]:
        """The units a first sync can be split into: for each root (a shared drive or a configured folder), each of
        its top-level folders ("ROOT/FOLDER") and, as one more unit, the files and shortcuts directly in it
        ("ROOT/"). Together they cover what `scan` lists; a folder reached from two units is listed by both."""
        units: list[str] = []
        for folder_id, _name, drive_id in await self.roots():
            units.append(f"{folder_id}/")
            units += [f"{folder_id}/{child['id']}" for child in await self.client.list_children(folder_id, drive_id)
                      if child.get("mimeType") == FOLDER and not child.get("trashed")]
        return units

    async def _walk_unit(self, unit: str, state: ScopeState, entries: dict[str, DriveEntry],
                         skipped: list[tuple[str, str]]) -> None:
        """`scan` of one unit: the root's children that belong to it placed as the whole walk places them (same
        breadcrumbs), then the folders below walked. A unit whose root or folder is gone lists nothing."""
        root_id, _, folder = unit.partition("/")
        if root_id not in state.folders:
            return
        below: list[str] = []
        for child in await self.client.list_children(root_id, state.folders[root_id][2]):
            if (child.get("mimeType") == FOLDER) != bool(folder) or (folder and child["id"] != folder):
                continue  # another unit's (a top-level folder is a unit of its own)
            below += await self._place(child, root_id, state, entries, skipped)
        await self._walk(below, state, entries, skipped)

    async def _walk(self, start: list[str], state: ScopeState, entries: dict[str, DriveEntry],
                    skipped: list[tuple[str, str]]) -> None:
        """Breadth-first over folders already placed in `state.folders`, listing several folders at once."""
        queue = list(start)
        while queue:
            listings = await asyncio.gather(*(self.client.list_children(f, state.folders[f][2]) for f in queue))
            next_level: list[str] = []
            for folder_id, children in zip(queue, listings, strict=True):
                for child in children:
                    next_level.extend(await self._place(child, folder_id, state, entries, skipped))
            queue = next_level

    async def _place(self, child: dict[str, Any], folder_id: str, state: ScopeState, entries: dict[str, DriveEntry],
                     skipped: list[tuple[str, str]]) -> list[str]:
        """Put one listed child into the scope; returns folders still to list."""
        _parent, path, drive_id = state.folders[folder_id]
        mime = child.get("mimeType")
        if child.get("trashed"):
            return []
        if mime == FOLDER:
            if child["id"] in state.folders:
                return []  # reached twice (a shortcut loop, or a folder with two parents): walked once
            state.folders[child["id"]] = [folder_id, f"{path}/{child.get('name')}", child.get("driveId") or drive_id]
            return [child["id"]]
        if mime == SHORTCUT:
            target_id = (child.get("shortcutDetails") or {}).get("targetId")
            if not target_id:
                skipped.append((child["id"], f"shortcut {child.get('name')!r} has no target"))
                return []
            state.shortcuts[child["id"]] = target_id
            if target_id in state.folders or target_id in entries:
                return []  # already in scope: follow each target once
            try:
                target = await self.client.get_file(target_id)
            except HttpError as error:
                skipped.append((child["id"], f"shortcut {child.get('name')!r}: its target is not reachable "
                                             f"({http_reason(error)})"))
                return []
            if target.get("trashed"):
                return []
            if target.get("mimeType") == FOLDER:
                state.folders[target_id] = [folder_id, f"{path}/{child.get('name')}", target.get("driveId")]
                return [target_id]
            if target.get("mimeType") == SHORTCUT:
                skipped.append((child["id"], f"shortcut {child.get('name')!r} points at another shortcut"))
                return []
            state.files[target_id] = folder_id
            entries[target_id] = DriveEntry(target, path)
            return []
        if child["id"] not in entries:
            state.files[child["id"]] = folder_id
            entries[child["id"]] = DriveEntry(child, path)
        return []

    async def changes(self, state: ScopeState) -> AsyncIterator[ScanResult]:
        """Walk each change log of the scope (the user's and/or each shared drive's) from its stored token, one
        result per page of changes: the in-scope files to (re)consider, the ids that left the scope, and the state
        after that page (its log's token is the next page's, or the `newStartPageToken` after the last), so a run
        stopped between pages resumes after the last one done. `nextPageToken` is followed until a page carries
        `newStartPageToken` (changes.list reference: exactly one of the two is set)."""
        state = ScopeState("", {k: list(v) for k, v in state.folders.items()}, dict(state.files),
                           dict(state.shortcuts), dict(state.tokens))
        roots = {fid for fid, (parent, _p, _d) in state.folders.items() if parent is None}
        for log in sorted(state.tokens):
            while True:
                page = await self.client.changes_page(state.tokens[log], log or None)
                entries: dict[str, DriveEntry] = {}
                deleted: set[str] = set()
                skipped: list[tuple[str, str]] = []
                for change in page.get("changes", []):
                    if change.get("changeType", "file") == "file":
                        await self._apply_change(change, state, roots, entries, deleted, skipped)
                following = page.get("nextPageToken")
                state.tokens[log] = following or page.get("newStartPageToken") or state.tokens[log]
                deleted -= set(state.files)
                yield ScanResult([e for e in entries.values() if e.id not in deleted], deleted, state, skipped)
                if not following:
                    break

    async def _apply_change(self, change: dict[str, Any], state: ScopeState, roots: set[str],
                            entries: dict[str, DriveEntry], deleted: set[str], skipped: list[tuple[str, str]]) -> None:
        file_id = change["fileId"]
        file = change.get("file") or {}
        gone = change.get("removed") or file.get("trashed")
        if file_id in roots:
            if gone:
                # A scope root trashed or lost: everything under it leaves, and the source says so.
                skipped.append((file_id, "a folder of this source was trashed or is no longer shared with the "
                                         "service account; its documents were removed"))
                self._forget(file_id, state, deleted, entries)
            elif file.get("name") and state.folders[file_id][1] != file["name"]:
                # A scope folder renamed: every breadcrumb below it changes.
                drive_id = state.folders[file_id][2]
                self._forget(file_id, state, deleted, entries)
                state.folders[file_id] = [None, file["name"], drive_id]
                await self._walk([file_id], state, entries, skipped)
                deleted.difference_update(state.files)
            return
        parent = (file.get("parents") or [None])[0]
        in_scope = not gone and parent in state.folders
        if file_id in state.shortcuts and not in_scope:
            self._forget(state.shortcuts.pop(file_id), state, deleted, entries)
        if not in_scope:
            if not gone and _is_shortcut_target(file_id, state):
                if file_id in state.folders:
                    return  # a folder reached through a shortcut: its files report their own changes
                # A shortcut's target lives outside the scope: it stays in while the shortcut does.
                folder_id = state.files.get(file_id) or next(iter(state.folders))
                entries[file_id] = DriveEntry(file, state.folders.get(folder_id, [None, "", None])[1])
                return
            self._forget(file_id, state, deleted, entries)
            return
        if file.get("mimeType") == FOLDER:
            if file_id in state.folders and state.folders[file_id][0] == parent \
                    and state.folders[file_id][1].rsplit("/", 1)[-1] == file.get("name"):
                return  # a sharing or metadata change of a folder: files report their own changes
            # New, moved in, renamed or moved within: (re)walk it so every file below gets its new breadcrumb.
            self._forget(file_id, state, deleted, entries)
            _p, path, drive_id = state.folders[parent]
            state.folders[file_id] = [parent, f"{path}/{file.get('name')}", file.get("driveId") or drive_id]
            await self._walk([file_id], state, entries, skipped)
            deleted.difference_update(state.files)
            return
        placed: dict[str, DriveEntry] = {}
        to_walk = await self._place(file, parent, state, placed, skipped)
        if to_walk:  # a new shortcut to a folder
            await self._walk(to_walk, state, placed, skipped)
        entries.update(placed)
        deleted.difference_update(placed)

    def _forget(self, file_id: str, state: ScopeState, deleted: set[str], entries: dict[str, DriveEntry]) -> None:
        if file_id in state.folders:
            gone = state.drop_subtree(file_id)
        else:
            gone = {file_id} if state.files.pop(file_id, None) is not None else set()
            target = state.shortcuts.pop(file_id, None)
            if target is not None and not _is_shortcut_target(target, state):
                if target in state.folders:
                    gone |= state.drop_subtree(target)
                elif state.files.pop(target, None) is not None:
                    gone.add(target)
        deleted |= gone
        for fid in gone:
            entries.pop(fid, None)


def _is_shortcut_target(file_id: str, state: ScopeState) -> bool:
    return file_id in state.shortcuts.values()


def _unreachable(what: str, ident: str, error: Any) -> str:
    if error.status_code == 404:
        return (f"{what} {ident} was not found or is not shared with the service account: share it with the "
                f"service account's email (or have the source read as a user who can see it)")
    if error.status_code in (401, 403):
        return f"no access to {what} {ident} ({http_reason(error)}): share it with the service account"
    return f"could not open {what} {ident} ({http_reason(error)})"


# ---------------------------------------------------------------------------------------------------------------
# Content and access of one file
# ---------------------------------------------------------------------------------------------------------------


def principals_from_permissions(permissions: list[dict[str, Any]], everyone_domains: set[str],
                                scope: str) -> tuple[str, ...]:
    """Drive permissions → ragbot principals. Every role can read; deleted principals are dropped. A group is the
    Google group of this source's directory (`group:<scope>/<email>`), never a same-named group of another source."""
    found: set[str] = set()
    for permission in permissions:
        if permission.get("deleted"):
            continue
        kind = permission.get("type")
        if kind == "anyone":
            found.add(EVERYONE)
        elif kind == "domain" and permission.get("domain"):
            domain = fold_ascii(permission["domain"])
            found.add(EVERYONE if domain in everyone_domains else f"domain:{domain}")
        elif kind == "user" and permission.get("emailAddress"):
            found.add(f"user:{fold_ascii(permission['emailAddress'])}")
        elif kind == "group" and permission.get("emailAddress"):
            found.add(scoped_group(scope, fold_ascii(permission["emailAddress"])))
    return tuple(sorted(found))


async def file_access(client: DriveClient, entry: DriveEntry, config: GoogleDriveConfig,
                      settings: GoogleDriveSettings, scope: str) -> tuple[str, ...]:
    """Who may see the file. Raises DriveFileError when its permissions cannot be read (the caller fails closed)."""
    if config.visibility == "everyone":
        return (EVERYONE,)
    try:
        permissions = await client.permissions(entry.id)
    except HttpError as error:
        raise DriveFileError(f"could not read its permissions ({http_reason(error)}); it is hidden from everyone until "
                             f"the service account can list them") from None
    return principals_from_permissions(permissions, settings.everyone_domain_set(), scope)


def content_plan(entry: DriveEntry, settings: GoogleDriveSettings) -> tuple[str, str | None]:
    """(file name that picks the parser, export MIME type or None for a download). Raises DriveFileError for
    files that are skipped without fetching anything."""
    mime = entry.mime_type
    if mime in EXPORTS:
        export_mime, suffix = EXPORTS[mime]
        return entry.name + suffix, export_mime
    if mime.startswith("application/vnd.google-apps."):
        raise DriveFileError(f"Google {mime.rsplit('.', 1)[-1]} files cannot be exported as text", "type")
    suffix = PurePosixPath(entry.name).suffix.lower()
    if suffix not in DOWNLOAD_SUFFIXES:
        if mime not in DOWNLOADS:
            raise DriveFileError(f"unsupported type {mime or suffix or 'unknown'}", "type")
        suffix = DOWNLOADS[mime]
        filename = entry.name + suffix
    else:
        filename = entry.name
    size = int(entry.file.get("size") or 0)
    if size > settings.max_file_mb * 1024 * 1024:
        raise DriveFileError(f"{size / 1024 / 1024:.1f} MB is over GDRIVE_MAX_FILE_MB ({settings.max_file_mb} MB)",
                             "size")
    return filename, None


async def fetch_content(client: DriveClient, entry: DriveEntry, settings: GoogleDriveSettings) -> tuple[str, bytes]:
    """(file name for the parser, bytes): exported for Google files, downloaded for the rest."""
    filename, export_mime = content_plan(entry, settings)
    try:
        if export_mime:
            data = await client.export(entry.id, export_mime)
        else:
            data = await client.download(entry.id)
    except HttpError as error:
        reason = error_reason(error)
        if reason == "exportSizeLimitExceeded":
            raise DriveFileError(f"Drive cannot export files over {EXPORT_LIMIT_MB} MB (exportSizeLimitExceeded); "
                                 f"split the document or save a PDF copy in the folder") from None
        if reason == "fileNotDownloadable":
            raise DriveFileError("Drive does not allow downloading this file (fileNotDownloadable)") from None
        if error.status_code == 404:
            raise DriveFileError("gone while syncing (404)") from None
        raise DriveFileError(f"could not fetch it ({http_reason(error)})") from None
    if len(data) > settings.max_file_mb * 1024 * 1024:
        raise DriveFileError(f"{len(data) / 1024 / 1024:.1f} MB is over GDRIVE_MAX_FILE_MB "
                             f"({settings.max_file_mb} MB)", "size")
    return filename, data


# ---------------------------------------------------------------------------------------------------------------
# The source
# ---------------------------------------------------------------------------------------------------------------

ITEMS_PER_BATCH = 64


class GoogleDriveSource:
    """A Google Drive source on the source interface (see `knowledge.sources.base`).

    External ids are Drive file ids. The checkpoint is the scope state (`ScopeState`) as JSON: the changes token
    plus the folders, files and shortcuts in scope, so later syncs can tell which changes concern the source.
    Drive has a delete feed (`removed` / `trashed` changes), so pruning runs only on `sync --full` and on the
    source's prune schedule, as a safety net.
    """

    listing_prefix = ""
    prune_on_every_sync = False

    def __init__(self, name: str, config: GoogleDriveConfig, settings: GoogleDriveSettings | None = None,
                 credentials: Any = "load", unit: str | None = None) -> None:
        self.name = name
        self.unit = unit  # one unit of a split first sync (`part`), else None: the whole scope
        self.config = config
        self.settings = settings or GoogleDriveSettings()
        # The location stays the same when folders are added or removed (`source add` again updates the config).
        self.spec = SourceSpec(name=name, kind="gdrive", location="Google Drive")
        self._credentials = credentials
        self._client: DriveClient | None = None
        self._last_scan: ScanResult | None = None

    @property
    def client(self) -> DriveClient:
        if self._client is None:
            credentials = self._credentials
            if isinstance(credentials, str) and credentials == "load":
                credentials = self._translate(lambda: load_credentials(self.config.credentials_env,
                                                                       self.config.subject))
            self._client = DriveClient(credentials, self.settings)
        return self._client

    def _translate(self, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except DriveSourceError as error:
            raise _typed(self.name, error) from None

    async def _guard(self, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except DriveSourceError as error:
            raise _typed(self.name, error) from None

    async def check(self) -> None:
        """Credentials work and every folder and shared drive is reachable (raises a typed error naming the fix)."""
        await self._guard(DriveScope(self.client, self.config).roots())

    async def changes(self, checkpoint: str | None, *, full: bool = False) -> AsyncIterator[ChangeBatch]:
        scope = DriveScope(self.client, self.config)
        previous = None if full else ScopeState.from_json(checkpoint)
        if previous is not None and not self._roots_changed(previous):
            try:
                async for batch in self._changes_from(scope, previous):
                    yield batch
                return
            except HttpError as error:
                if error.status_code not in (400, 404, 410):
                    raise _typed(self.name, DriveSourceError(
                        f"Drive refused a request while reading changes ({http_reason(error)}); check that the service "
                        f"account can still open the source's folders", "unavailable")) from None
                # The stored token is no longer accepted: list the scope again (only fetching what changed).
                logger.warning("source %s: Drive refused the stored changes token (%s); listing the scope again",
                               self.name, http_reason(error))
        # First sync, `--full`, an edited list of folders, or a token Drive forgot: list the whole scope. The ids
        # the previous state had and this listing lacks are deleted (without a previous state, pruning does it).
        result = await self._guard(scope.scan(self.unit))
        self._last_scan = result
        gone = sorted(set(previous.files) - {e.id for e in result.entries}) if previous is not None else []
        total = len(result.entries)
        for start in range(0, max(total, 1), ITEMS_PER_BATCH):
            last = start + ITEMS_PER_BATCH >= total
            items = await self._items(result.entries[start : start + ITEMS_PER_BATCH])
            if last:
                items += _problem_items(result.skipped)
            yield ChangeBatch(items=items, deleted=gone if last else [],
                              checkpoint=result.state.to_json() if last else None, total=total)

    async def _changes_from(self, scope: DriveScope, previous: ScopeState) -> AsyncIterator[ChangeBatch]:
        pages = scope.changes(previous)
        while True:
            try:
                result = await self._guard(pages.__anext__())
            except StopAsyncIteration:
                return
            items = await self._items(result.entries) + _problem_items(result.skipped)
            yield ChangeBatch(items=items, deleted=sorted(result.deleted), checkpoint=result.state.to_json())

    # --- parts: a first sync split across workers (knowledge.ingest.split) -------------------------------------

    async def parts(self) -> list[str]:
        """The units a first sync can be split into (`DriveScope.units`: each root's top-level folders, and each
        root's loose files): listed with files.list, as the walk lists them."""
        return await self._guard(DriveScope(self.client, self.config).units())

    def part(self, unit: str) -> GoogleDriveSource:
        """The source limited to one unit of `parts()`: the same file ids, breadcrumbs and access."""
        return GoogleDriveSource(self.name, self.config, self.settings, self._credentials, unit=unit)

    def _roots_changed(self, state: ScopeState) -> bool:
        """The scope's roots changed, or the state lacks the token of a change log they need (a checkpoint from
        before per-drive change logs held only the user's): list the scope again."""
        roots = {fid for fid, (parent, _p, _d) in state.folders.items() if parent is None}
        return roots != set(self.config.folders) | set(self.config.shared_drives) or state.logs() != set(state.tokens)

    async def inventory(self) -> list[ItemRef]:
        """Every file in scope (a walk of folders, no content, no permission calls)."""
        result, self._last_scan = self._last_scan, None
        if result is None:  # the sync just listed the scope (first or full sync): no need to walk it twice
            result = await self._guard(DriveScope(self.client, self.config).scan(self.unit))
        return [ItemRef(entry.id) for entry in result.entries]

    async def aclose(self) -> None:
        self._client = None
        self._last_scan = None

    async def _items(self, entries: list[DriveEntry]) -> list[SourceItem]:
        return list(await asyncio.gather(*(self._item(entry) for entry in entries)))

    async def _item(self, entry: DriveEntry) -> SourceItem:
        """One file as a SourceItem: its access is read now (cheap), its content only when the indexer asks."""
        try:
            filename, _export = content_plan(entry, self.settings)
            problem: DriveFileError | None = None
        except DriveFileError as error:
            filename, problem = _unsupported_name(entry), error
        try:
            access = await self._guard(file_access(self.client, entry, self.config, self.settings, self.spec.name))
            version: str | None = entry.version
        except DriveFileError as error:
            # Fail closed: nobody sees the file until its permissions can be read; the read reports why.
            access, version, problem = (), None, error

        async def read() -> bytes:
            if problem is not None and problem.kind == "type":
                return b""  # the parser reports the type as unsupported: the file is skipped, not failed
            if problem is not None:
                raise ItemUnavailable(f"{entry.path}: {problem.reason}")
            try:
                _name, data = await self._guard(fetch_content(self.client, entry, self.settings))
            except DriveFileError as error:
                raise ItemUnavailable(f"{entry.path}: {error.reason}") from None
            return data

        return SourceItem(
            external_id=entry.id, filename=filename, read=read, title=entry.title, url=entry.url, path=entry.path,
            author=entry.owner, updated_at=entry.modified, access=access, version=version,
        )


def _problem_items(problems: list[tuple[str, str]]) -> list[SourceItem]:
    """Problems of the scope itself (a shortcut to nowhere, a scope folder trashed) reach the sync report the way
    failed files do: as items, visible to nobody, whose read raises the reason. Nothing is stored for them."""
    def item(ident: str, reason: str) -> SourceItem:
        async def read() -> bytes:
            raise ItemUnavailable(reason)

        return SourceItem(external_id=ident, filename=f"{ident}.shortcut", read=read, access=(), version=None)

    return [item(ident, reason) for ident, reason in problems]


def _unsupported_name(entry: DriveEntry) -> str:
    """A file name whose suffix shows the type, so the parser's "unsupported file type" names it."""
    suffix = entry.mime_type.rsplit(".", 1)[-1] if entry.mime_type.startswith("application/vnd.google-apps.") \
        else (PurePosixPath(entry.name).suffix.lstrip(".") or entry.mime_type.rsplit("/", 1)[-1])
    return f"{entry.name}.{suffix}" if not entry.name.lower().endswith("." + suffix.lower()) else entry.name


def _typed(name: str, error: DriveSourceError) -> Exception:
    """DriveSourceError → the typed source errors the sync runner and the CLI show."""
    kinds = {"auth": SourceAuthError, "unavailable": SourceUnavailable, "config": SourceConfigError}
    return kinds[error.kind](f"source {name!r}: {error}")


@register_source("gdrive")
def build_gdrive_source(name: str, config: Any) -> GoogleDriveSource:
    """A stored Google Drive source: config as `GoogleDriveConfig.to_dict()`."""
    parsed = GoogleDriveConfig.from_dict(dict(config))
    if (problem := check_scope_name(name)) is not None:
        raise SourceConfigError(problem)
    if not parsed.folders and not parsed.shared_drives:
        raise SourceConfigError(f"source {name!r}: a Google Drive source needs at least one folder or shared "
                                f"drive; remove it and add it again with its folders or shared drives")
    if parsed.visibility not in ("permissions", "everyone"):
        raise SourceConfigError(f"source {name!r}: visibility must be permissions or everyone")
    return GoogleDriveSource(name, parsed)
