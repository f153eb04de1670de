"""A fake Google Drive API v3: a real HTTP server on 127.0.0.1 speaking Drive's JSON, for the real
google-api-python-client (pointed at it with `client_options={"api_endpoint": fake.endpoint}`).

It keeps an in-memory drive (folders, files, shortcuts, shared drives, permissions) that tests edit between syncs;
every edit is recorded in a change log served by `changes.list`, the way Drive's Changes API reports it.

    with FakeDrive() as drive:
        folder = drive.add_folder("Handbook")
        doc = drive.add_doc("Leave policy", folder, html="<h1>Leave</h1><p>25 days.</p>",
                            permissions=[drive.user("alice@example.com")])
        drive.rate_limit(3, status=403, reason="userRateLimitExceeded")   # the next 3 API calls fail
        drive.requests                                                    # every request, recorded

Implemented: files.list (`q` with `'<id>' in parents`, `trashed = true|false`, `mimeType = | != '…'`, joined by
`and`; pageSize/pageToken; corpora user|drive|allDrives with driveId; shared-drive items only with
supportsAllDrives + includeItemsFromAllDrives), files.get (metadata; `alt=media` downloads binary content and
refuses Google-native files with 403 fileNotDownloadable), files.export (Docs → text/html, text/markdown,
text/plain; Sheets → text/csv (first sheet) and xlsx; Slides → text/plain; over 10 MB → 403
exportSizeLimitExceeded), changes.getStartPageToken / changes.list (one change log per shared drive, read with
`driveId`; the user's log holds My Drive items only), permissions.list (paged by nextPageToken; shared-drive
members included as inherited permissions), drives.get, the `fields` partial-response mask, an OAuth token endpoint for
service-account JWTs, 401 without a valid token when `require_auth` is set, and 429 / 403 rate-limit storms.

Shapes, each from Google's Drive v3 reference (developers.google.com/workspace/drive/api/reference/rest/v3/...):
- files.list → `{"kind": "drive#fileList", "nextPageToken"?, "incompleteSearch", "files": [...]}` (files/list).
- changes.getStartPageToken → `{"kind": "drive#startPageToken", "startPageToken"}`; `driveId` picks a shared
  drive's own log (changes/getStartPageToken).
- changes.list → `{"kind": "drive#changeList", "nextPageToken" | "newStartPageToken", "changes": [{"kind":
  "drive#change", "changeType": "file", "fileId", "time", "removed", "file"?, "driveId"?}]}`: exactly one of the
  two tokens; a removed change has no `file` (changes/list, and the guide "Retrieve changes": each shared drive has
  its own change log, and apps must not rely on shared-drive file events in the user's log).
- permissions.list → `{"kind": "drive#permissionList", "nextPageToken"?, "permissions": [...]}`, pageSize ≤ 100
  (permissions/list).
- Errors → `{"error": {"code", "message", "errors": [{"domain", "reason", "message"}]}}`; rate limits are 429 or
  403 `rateLimitExceeded` / `userRateLimitExceeded` (guide "Resolve errors").
Every listing's smallest page size is settable (`list_page_size`, `changes_page_size`, `permissions_page_size`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fakes.server import HTTPServerThread

FOLDER = "application/vnd.google-apps.folder"
DOC = "application/vnd.google-apps.document"
SHEET = "application/vnd.google-apps.spreadsheet"
SLIDES = "application/vnd.google-apps.presentation"
SHORTCUT = "application/vnd.google-apps.shortcut"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
EXPORT_LIMIT_BYTES = 10 * 1024 * 1024
ACCESS_TOKEN = "ya29.fake-drive-token"


@dataclass
class FakeFile:
    id: str
    name: str
    mime_type: str
    parents: list[str]
    drive_id: str | None = None
    content: bytes = b""  # binary files
    exports: dict[str, bytes] = field(default_factory=dict)  # Google-native files: export MIME type -> bytes
    permissions: list[dict[str, Any]] = field(default_factory=list)
    owner: str | None = "owner@example.com"
    trashed: bool = False
    version: int = 1
    modified: datetime = field(default_factory=lambda: datetime(2026, 11, 1, 9, 0, tzinfo=UTC))
    target_id: str | None = None  # shortcuts

    def resource(self) -> dict[str, Any]:
        resource: dict[str, Any] = {
            "kind": "drive#file", "id": self.id, "name": self.name, "mimeType": self.mime_type,
            "parents": list(self.parents), "trashed": self.trashed, "version": str(self.version),
            "modifiedTime": self.modified.isoformat().replace("+00:00", "Z"),
            "createdTime": "2026-01-05T08:00:00.000Z",
            "webViewLink": _web_link(self),
            "permissionIds": [p["id"] for p in self.permissions],
        }
        if self.drive_id:
            resource["driveId"] = self.drive_id  # files in shared drives have no owners
        elif self.owner:
            resource["owners"] = [{"kind": "drive#user", "displayName": self.owner.split("@")[0].title(),
                                   "emailAddress": self.owner, "me": False}]
        if not self.mime_type.startswith("application/vnd.google-apps."):
            resource["md5Checksum"] = hashlib.md5(self.content).hexdigest()
            resource["size"] = str(len(self.content))
        if self.target_id is not None:
            resource["shortcutDetails"] = {"targetId": self.target_id, "targetMimeType": self.target_mime}
        return resource

    target_mime: str = ""


def _web_link(file: FakeFile) -> str:
    kinds = {DOC: "document", SHEET: "spreadsheets", SLIDES: "presentation"}
    if file.mime_type == FOLDER:
        return f"https://drive.google.com/drive/folders/{file.id}"
    if file.mime_type in kinds:
        return f"https://docs.google.com/{kinds[file.mime_type]}/d/{file.id}/edit?usp=drivesdk"
    return f"https://drive.google.com/file/d/{file.id}/view?usp=drivesdk"


@dataclass
class SharedDrive:
    id: str
    name: str
    members: list[dict[str, Any]]


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]

    @property
    def endpoint(self) -> str:
        """A short name: files.list, files.get, files.media, files.export, changes.list, permissions.list…"""
        parts = self.path.strip("/").split("/")
        if parts[:2] == ["drive", "v3"]:
            parts = parts[2:]
        if parts == ["files"]:
            return "files.list"
        if parts[0] == "files" and len(parts) == 2:
            return "files.media" if self.query.get("alt") == "media" else "files.get"
        if parts[0] == "files" and parts[2:] == ["export"]:
            return "files.export"
        if parts[0] == "files" and parts[2:] == ["permissions"]:
            return "permissions.list"
        if parts == ["changes", "startPageToken"]:
            return "changes.getStartPageToken"
        if parts == ["changes"]:
            return "changes.list"
        if parts[0] == "drives":
            return "drives.get"
        return "/".join(parts)


class DriveError(Exception):
    def __init__(self, status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.headers = status, reason, message, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"domain": "global" if self.status != 403 or "Rate" not in self.reason
                                      else "usageLimits", "reason": self.reason, "message": self.message}]}}


class FakeDrive(HTTPServerThread):
    """The fake's state and its HTTP server. Edits are thread-safe against requests in flight."""

    def __init__(self, require_auth: bool = False) -> None:
        self.files: dict[str, FakeFile] = {}
        self.drives: dict[str, SharedDrive] = {}
        self.removed: set[str] = set()  # permanently deleted ids (changes report them as removed)
        self.hidden: set[str] = set()  # ids the caller lost access to
        self.change_log: list[tuple[str, datetime]] = []  # (file id, time); a page token is an index + 1
        self.requests: list[RecordedRequest] = []
        self.token_requests: list[dict[str, str]] = []
        self.require_auth = require_auth
        self.storm: list[DriveError] = []  # errors answered to the next requests, in order
        self.file_errors: dict[str, DriveError] = {}  # file id -> error on media/export
        self.permission_errors: dict[str, DriveError] = {}  # file id -> error on permissions.list
        self.oldest_token = 1  # page tokens older than this are refused (Drive forgot them)
        self.list_page_size = 100
        self.changes_page_size = 1000
        self.permissions_page_size = 100
        self.log_of: dict[str, str] = {}  # file id -> its change log: "" (the user's) or its shared drive id
        from fakes.directory_api import FakeDirectory

        self.directory = FakeDirectory()  # Google Workspace groups, served under /admin/directory/v1/
        self.latency_seconds = 0.0  # added to every API answer (benchmarks: Drive's round trips are not free)
        self._ids = itertools.count(1)
        self._clock = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
        self._lock = threading.RLock()
        super().__init__()

    # -- lifecycle ------------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"drive": self})

    @property
    def base_url(self) -> str:
        return self.url

    @property
    def endpoint(self) -> str:
        """What goes into `client_options={"api_endpoint": …}`: the real service path under the fake's root."""
        return self.base_url + "/drive/v3/"

    @property
    def token_uri(self) -> str:
        return self.base_url + "/token"

    def service_account_json(self, private_key_pem: str) -> str:
        """GOOGLE_SERVICE_ACCOUNT_JSON for a service account whose key is `private_key_pem` and whose token endpoint
        (`token_uri`) is this fake's: google-auth signs its JWT grant with the key and trades it here."""
        return json.dumps({
            "type": "service_account", "project_id": "ragbot-test", "private_key_id": "key1",
            "private_key": private_key_pem, "client_email": "ragbot@ragbot-test.iam.gserviceaccount.com",
            "client_id": "1234", "token_uri": self.token_uri,
        })

    # -- building the drive -----------------------------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):04d}"

    def _tick(self) -> datetime:
        self._clock += timedelta(minutes=1)
        return self._clock

    def _changed(self, file_id: str) -> None:
        file = self.files.get(file_id)
        if file is not None:
            self.log_of[file_id] = file.drive_id or ""
        self.change_log.append((file_id, self._tick()))

    @staticmethod
    def user(email: str, role: str = "reader") -> dict[str, Any]:
        return {"kind": "drive#permission", "id": f"u-{email}", "type": "user", "emailAddress": email, "role": role}

    @staticmethod
    def group(email: str, role: str = "reader") -> dict[str, Any]:
        return {"kind": "drive#permission", "id": f"g-{email}", "type": "group", "emailAddress": email, "role": role}

    @staticmethod
    def domain(name: str, role: str = "reader") -> dict[str, Any]:
        return {"kind": "drive#permission", "id": f"d-{name}", "type": "domain", "domain": name, "role": role,
                "allowFileDiscovery": True}

    @staticmethod
    def anyone(role: str = "reader") -> dict[str, Any]:
        return {"kind": "drive#permission", "id": "anyoneWithLink", "type": "anyone", "role": role,
                "allowFileDiscovery": False}

    def add_shared_drive(self, name: str, members: list[dict[str, Any]]) -> str:
        with self._lock:
            drive_id = self._new_id("0AD")
            self.drives[drive_id] = SharedDrive(drive_id, name, [dict(m, role="organizer" if m.get("role") == "owner"
                                                                      else m.get("role", "reader")) for m in members])
            return drive_id

    def _add(self, file: FakeFile) -> str:
        with self._lock:
            parent = self.files.get(file.parents[0]) if file.parents else None
            if file.drive_id is None:
                file.drive_id = parent.drive_id if parent else (file.parents[0] if file.parents and
                                                                file.parents[0] in self.drives else None)
            if file.owner and file.drive_id:
                file.owner = None
            file.modified = self._tick()
            self.files[file.id] = file
            self._changed(file.id)
            return file.id

    def add_folder(self, name: str, parent: str | None = None, permissions: list[dict[str, Any]] | None = None) -> str:
        return self._add(FakeFile(self._new_id("fo"), name, FOLDER, [parent] if parent else ["root"],
                                  permissions=list(permissions or [])))

    def add_doc(self, name: str, parent: str, *, html: str, markdown: str | None = None,
                permissions: list[dict[str, Any]] | None = None) -> str:
        exports = {"text/html": html.encode(), "text/plain": re.sub(r"<[^>]+>", " ", html).encode()}
        exports["text/markdown"] = (markdown or re.sub(r"<[^>]+>", " ", html)).encode()
        return self._add(FakeFile(self._new_id("doc"), name, DOC, [parent], exports=exports,
                                  permissions=list(permissions or [])))

    def add_sheet(self, name: str, parent: str, sheets: dict[str, list[list[Any]]],
                  permissions: list[dict[str, Any]] | None = None) -> str:
        return self._add(FakeFile(self._new_id("sh"), name, SHEET, [parent], exports=_sheet_exports(sheets),
                                  permissions=list(permissions or [])))

    def add_slides(self, name: str, parent: str, text: str, permissions: list[dict[str, Any]] | None = None) -> str:
        return self._add(FakeFile(self._new_id("sl"), name, SLIDES, [parent], exports={"text/plain": text.encode()},
                                  permissions=list(permissions or [])))

    def add_file(self, name: str, parent: str, content: bytes, mime_type: str,
                 permissions: list[dict[str, Any]] | None = None) -> str:
        return self._add(FakeFile(self._new_id("fi"), name, mime_type, [parent], content=content,
                                  permissions=list(permissions or [])))

    def add_shortcut(self, name: str, parent: str, target: str) -> str:
        target_file = self.files[target]
        shortcut = FakeFile(self._new_id("sc"), name, SHORTCUT, [parent], target_id=target)
        shortcut.target_mime = target_file.mime_type
        return self._add(shortcut)

    # -- edits (each one is a change) -------------------------------------------------------------------------
    def edit_doc(self, file_id: str, html: str) -> None:
        with self._lock:
            file = self.files[file_id]
            file.exports.update({"text/html": html.encode(), "text/markdown": re.sub(r"<[^>]+>", " ", html).encode(),
                                 "text/plain": re.sub(r"<[^>]+>", " ", html).encode()})
            file.version += 1
            file.modified = self._tick()
            self._changed(file_id)

    def edit_file(self, file_id: str, content: bytes) -> None:
        with self._lock:
            file = self.files[file_id]
            file.content = content
            file.version += 1
            file.modified = self._tick()
            self._changed(file_id)

    def rename(self, file_id: str, name: str) -> None:
        with self._lock:
            self.files[file_id].name = name
            self.files[file_id].version += 1  # a rename bumps the version, not modifiedTime
            self._changed(file_id)

    def move(self, file_id: str, new_parent: str) -> None:
        with self._lock:
            self.files[file_id].parents = [new_parent]
            self.files[file_id].version += 1
            self._changed(file_id)

    def trash(self, file_id: str) -> None:
        with self._lock:
            self.files[file_id].trashed = True
            self.files[file_id].version += 1
            self._changed(file_id)

    def delete(self, file_id: str) -> None:
        with self._lock:
            del self.files[file_id]
            self.removed.add(file_id)
            self._changed(file_id)

    def set_permissions(self, file_id: str, permissions: list[dict[str, Any]]) -> None:
        """A sharing change: the version moves, the content and modifiedTime do not."""
        with self._lock:
            self.files[file_id].permissions = list(permissions)
            self.files[file_id].version += 1
            self._changed(file_id)

    def rate_limit(self, count: int, *, status: int = 429, reason: str = "rateLimitExceeded",
                   retry_after: str | None = None) -> None:
        """The next `count` API calls fail with a rate-limit error (429, or 403 with this reason)."""
        headers = {"Retry-After": retry_after} if retry_after else {}
        message = "Rate Limit Exceeded" if reason == "rateLimitExceeded" else "User Rate Limit Exceeded"
        with self._lock:
            self.storm.extend(DriveError(status, reason, message, headers) for _ in range(count))

    def calls(self, endpoint: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.endpoint == endpoint]

    # -- the API --------------------------------------------------------------------------------------------
    def _visible(self, file: FakeFile, params: dict[str, str]) -> bool:
        if file.id in self.hidden:
            return False
        if file.drive_id and not (_flag(params, "supportsAllDrives") or _flag(params, "supportsTeamDrives")):
            return False
        return True

    def _file(self, file_id: str, params: dict[str, str], *, any_drive: bool = False) -> FakeFile:
        """`any_drive`: files.export has no supportsAllDrives parameter and serves shared-drive files anyway."""
        file = self.files.get(file_id)
        if file is None or file_id in self.hidden or not (any_drive or self._visible(file, params)):
            raise DriveError(404, "notFound", f"File not found: {file_id}.")
        return file

    def handle(self, method: str, path: str, params: dict[str, str], headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.requests.append(RecordedRequest(method, path, params, headers))
            if path == "/token":
                return self._token(params)
            if self.require_auth and headers.get("authorization") != f"Bearer {ACCESS_TOKEN}":
                raise DriveError(401, "authError", "Request had invalid authentication credentials.")
            parts = path.strip("/").split("/")
            if parts[:3] == ["admin", "directory", "v1"]:  # the Directory API (fakes/directory_api.py)
                return _json(self.directory.handle(parts[3:], params))
            if self.storm:
                raise self.storm.pop(0)
            if parts[:2] != ["drive", "v3"]:
                raise DriveError(404, "notFound", f"Not Found: {path}")
            parts = parts[2:]
            if parts == ["files"]:
                return _json(self._files_list(params))
            if parts[0] == "files" and len(parts) == 2:
                file = self._file(parts[1], params)
                if params.get("alt") == "media":
                    return self._media(file)
                return _json(_masked(file.resource(), params.get("fields")))
            if parts[0] == "files" and parts[2:] == ["export"]:
                return self._export(self._file(parts[1], params, any_drive=True), params)
            if parts[0] == "files" and parts[2:] == ["permissions"]:
                return _json(self._permissions(parts[1], params))
            if parts == ["changes", "startPageToken"]:
                self._check_drive_param(params)
                return _json({"kind": "drive#startPageToken", "startPageToken": str(len(self.change_log) + 1)})
            if parts == ["changes"]:
                return _json(self._changes(params))
            if parts[0] == "drives" and len(parts) == 2:
                shared = self.drives.get(parts[1])
                if shared is None:
                    raise DriveError(404, "notFound", f"Shared drive not found: {parts[1]}")
                return _json(_masked({"kind": "drive#drive", "id": shared.id, "name": shared.name}, params.get("fields")))
            raise DriveError(404, "notFound", f"Not Found: {path}")

    def _token(self, params: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        self.token_requests.append(params)
        if params.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" or not params.get("assertion"):
            return 400, {"Content-Type": "application/json"}, json.dumps({"error": "invalid_grant"}).encode()
        claims = json.loads(base64.urlsafe_b64decode(params["assertion"].split(".")[1] + "==="))
        if "drive" not in claims.get("scope", "") and "admin.directory" not in claims.get("scope", ""):
            return 400, {"Content-Type": "application/json"}, json.dumps(
                {"error": "invalid_scope", "error_description": "no Drive scope"}).encode()
        return _json({"access_token": ACCESS_TOKEN, "expires_in": 3600, "token_type": "Bearer"})

    def _files_list(self, params: dict[str, str]) -> dict[str, Any]:
        all_drives = _flag(params, "includeItemsFromAllDrives") and _flag(params, "supportsAllDrives")
        corpora = params.get("corpora", "user")
        if corpora == "drive" and (not params.get("driveId") or not all_drives):
            raise DriveError(400, "invalid", "The driveId parameter must be specified together with "
                                             "includeItemsFromAllDrives and supportsAllDrives.")
        matches = _parse_query(params.get("q", ""))
        found = []
        for file in self.files.values():
            if file.id in self.hidden:
                continue
            if file.drive_id:
                # Shared-drive items need both flags and a corpus that holds them.
                in_corpus = corpora == "allDrives" or (corpora == "drive" and params["driveId"] == file.drive_id)
                if not (all_drives and in_corpus):
                    continue
            elif corpora == "drive":
                continue
            if all(match(file) for match in matches):
                found.append(file)
        found.sort(key=lambda f: f.id)
        page_size = min(int(params.get("pageSize", self.list_page_size)), self.list_page_size)
        start = int(params.get("pageToken") or 0)
        page = found[start : start + page_size]
        body: dict[str, Any] = {"kind": "drive#fileList", "incompleteSearch": False,
                                "files": [f.resource() for f in page]}
        if start + page_size < len(found):
            body["nextPageToken"] = str(start + page_size)
        return _masked(body, params.get("fields"))

    def _media(self, file: FakeFile) -> tuple[int, dict[str, str], bytes]:
        if file.id in self.file_errors:
            raise self.file_errors[file.id]
        if file.mime_type.startswith("application/vnd.google-apps."):
            raise DriveError(403, "fileNotDownloadable", "Only files with binary content can be downloaded. "
                                                         "Use Export with Docs Editors files.")
        return 200, {"Content-Type": file.mime_type}, file.content

    def _export(self, file: FakeFile, params: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if file.id in self.file_errors:
            raise self.file_errors[file.id]
        mime = params.get("mimeType", "")
        if mime not in file.exports:
            raise DriveError(400, "badRequest", f"The requested conversion is not supported: {mime}")
        data = file.exports[mime]
        if len(data) > EXPORT_LIMIT_BYTES:
            raise DriveError(403, "exportSizeLimitExceeded", "This file is too large to be exported.")
        return 200, {"Content-Type": mime}, data

    def _permissions(self, file_id: str, params: dict[str, str]) -> dict[str, Any]:
        if file_id in self.permission_errors:
            raise self.permission_errors[file_id]
        if file_id in self.drives and _flag(params, "supportsAllDrives"):
            permissions = [dict(m, permissionDetails=[{"permissionType": "member", "role": m["role"],
                                                      "inherited": False}]) for m in self.drives[file_id].members]
        else:
            file = self._file(file_id, params)
            permissions = [dict(p, permissionDetails=[{"permissionType": "file", "role": p["role"], "inherited": False}])
                           if file.drive_id else dict(p) for p in file.permissions]
            if file.drive_id:
                permissions += [
                    dict(m, permissionDetails=[{"permissionType": "member", "role": m["role"], "inherited": True,
                                                "inheritedFrom": file.drive_id}])
                    for m in self.drives[file.drive_id].members
                ]
            elif file.owner:
                permissions.insert(0, self.user(file.owner, "owner"))
        size = min(int(params.get("pageSize", 100)), 100, self.permissions_page_size)
        start = int(params.get("pageToken") or 0)
        body: dict[str, Any] = {"kind": "drive#permissionList", "permissions": permissions[start : start + size]}
        if start + size < len(permissions):
            body["nextPageToken"] = str(start + size)
        return _masked(body, params.get("fields"))

    def _check_drive_param(self, params: dict[str, str]) -> str | None:
        """`driveId` reads that shared drive's change log and needs supportsAllDrives (changes.list reference)."""
        drive_id = params.get("driveId")
        if drive_id is None:
            return None
        if not _flag(params, "supportsAllDrives"):
            raise DriveError(403, "teamDrivesParameterNotSupported",
                             "The driveId parameter is only supported when supportsAllDrives is set to true.")
        if drive_id not in self.drives:
            raise DriveError(404, "notFound", f"Shared drive not found: {drive_id}")
        return drive_id

    def _changes(self, params: dict[str, str]) -> dict[str, Any]:
        token = params.get("pageToken")
        if not token or not token.isdigit() or not self.oldest_token <= int(token) <= len(self.change_log) + 1:
            raise DriveError(400, "invalid", f"Invalid Value: pageToken {token!r}")
        all_drives = _flag(params, "includeItemsFromAllDrives") and _flag(params, "supportsAllDrives")
        drive_id = self._check_drive_param(params)
        page_size = min(int(params.get("pageSize", 100)), 1000, self.changes_page_size)
        start = int(token) - 1
        changes = []
        position = start
        while position < len(self.change_log) and len(changes) < page_size:
            file_id, when = self.change_log[position]
            position += 1
            file = self.files.get(file_id)
            if self.log_of.get(file_id, "") != (drive_id or ""):
                continue  # another change log's event: each shared drive has its own, the user's has My Drive's
            if file is not None and file.drive_id and not all_drives:
                continue
            change: dict[str, Any] = {"kind": "drive#change", "changeType": "file", "fileId": file_id,
                                      "time": when.isoformat().replace("+00:00", "Z")}
            if file is None or file_id in self.hidden:
                if not _flag(params, "includeRemoved", default=True):
                    continue
                change["removed"] = True
            else:
                change["removed"] = False
                change["file"] = file.resource()
                if file.drive_id:
                    change["driveId"] = file.drive_id
            changes.append(change)
        body: dict[str, Any] = {"kind": "drive#changeList", "changes": changes}
        if position < len(self.change_log):
            body["nextPageToken"] = str(position + 1)
        else:
            body["newStartPageToken"] = str(len(self.change_log) + 1)
        return _masked(body, params.get("fields"))


def _sheet_exports(sheets: dict[str, list[list[Any]]]) -> dict[str, bytes]:
    import csv

    import openpyxl

    workbook = openpyxl.Workbook()
    workbook.remove(workbook.active)
    for title, rows in sheets.items():
        sheet = workbook.create_sheet(title)
        for row in rows:
            sheet.append(row)
    buffer = io.BytesIO()
    workbook.save(buffer)
    first = io.StringIO()
    csv.writer(first).writerows(next(iter(sheets.values()), []))
    return {XLSX: buffer.getvalue(), "text/csv": first.getvalue().encode()}


def _flag(params: dict[str, str], name: str, default: bool = False) -> bool:
    value = params.get(name)
    return default if value is None else value.lower() == "true"


_CLAUSE_PARENTS = re.compile(r"^'([^']+)'\s+in\s+parents$")
_CLAUSE_TRASHED = re.compile(r"^trashed\s*=\s*(true|false)$")
_CLAUSE_MIME = re.compile(r"^mimeType\s*(=|!=)\s*'([^']+)'$")


def _parse_query(q: str) -> list[Any]:
    """The `q` forms ragbot sends, joined by `and`. Anything else is a 400, as Drive answers a bad query."""
    matches = []
    for clause in (c.strip() for c in re.split(r"\s+and\s+", q.strip()) if c.strip()):
        if m := _CLAUSE_PARENTS.match(clause):
            matches.append(lambda f, parent=m.group(1): parent in f.parents)  # noqa: B008 (a default bound on purpose, evaluated once per call site)
        elif m := _CLAUSE_TRASHED.match(clause):
            matches.append(lambda f, value=m.group(1) == "true": f.trashed == value)  # noqa: B008 (a default bound on purpose, evaluated once per call site)
        elif m := _CLAUSE_MIME.match(clause):
            matches.append(lambda f, op=m.group(1), mime=m.group(2): (f.mime_type == mime) == (op == "="))  # noqa: B008 (a default bound on purpose, evaluated once per call site)
        else:
            raise DriveError(400, "invalid", f"Invalid Value: q clause {clause!r}")
    return matches


def _parse_fields(mask: str) -> dict[str, Any]:
    """`nextPageToken, files(id, name, owners(emailAddress))` -> {"nextPageToken": {}, "files": {"id": {}, …}}."""
    tree: dict[str, Any] = {}
    stack = [tree]
    name = ""
    for ch in mask + ",":
        if ch == "(":
            node: dict[str, Any] = {}
            stack[-1][name.strip()] = node
            stack.append(node)
            name = ""
        elif ch in ",)":
            if name.strip():
                stack[-1].setdefault(name.strip(), {})
            name = ""
            if ch == ")":
                stack.pop()
        else:
            name += ch
    return tree


def _apply_mask(value: Any, tree: dict[str, Any]) -> Any:
    if not tree or "*" in tree:
        return value
    if isinstance(value, list):
        return [_apply_mask(v, tree) for v in value]
    if isinstance(value, dict):
        return {k: _apply_mask(v, tree[k]) for k, v in value.items() if k in tree}
    return value


def _masked(body: dict[str, Any], fields: str | None) -> dict[str, Any]:
    return _apply_mask(body, _parse_fields(fields)) if fields else body


def _json(body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json; charset=UTF-8"}, json.dumps(body).encode()


class _Handler(BaseHTTPRequestHandler):
    drive: FakeDrive
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def _serve(self, method: str) -> None:
        split = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            body = self.rfile.read(length).decode()
            params.update({k: v[-1] for k, v in parse_qs(body).items()})
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.drive.latency_seconds and split.path != "/token":
            time.sleep(self.drive.latency_seconds)
        try:
            status, extra, payload = self.drive.handle(method, split.path, params, headers)
        except DriveError as error:
            status, extra, payload = error.status, {"Content-Type": "application/json; charset=UTF-8",
                                                    **error.headers}, json.dumps(error.body()).encode()
        self.send_response(status)
        for key, value in extra.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")
