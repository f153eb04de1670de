"""A fake Confluence (Cloud or Data Center): a real HTTP server on 127.0.0.1 speaking REST v1 JSON shapes.

It serves what the Confluence source calls, with the real paging rules, each shape taken from Atlassian's
documented examples (the page is named next to each shape below):
- v1 CQL search (Cloud): ignores `start`, pages by an opaque cursor in `_links.next`, which is relative to
  `_links.base` (`https://SITE/wiki`) - "Upcoming changes to Confluence Cloud REST APIs to modernize search"
  (developer.atlassian.com/cloud/confluence/change-notice-moderize-search-rest-apis/) and the REST v1 reference,
  "Search content by CQL".
- v1 on Data Center: pages by `start`/`limit`, `_links.next` relative to `_links.base` under a context path
  (`/confluence`) - Confluence Data Center REST API, "Pagination" (developer.atlassian.com/server/confluence/pagination-in-the-rest-api/).
- v2 (Cloud): `_links.next` relative to the SITE (it starts with `/wiki/api/v2/`), the same URL in a
  `Link: <...>; rel="next"` header, and `_links.base` = `https://SITE/wiki` - REST v2 reference, "Using the REST
  API: Pagination" (developer.atlassian.com/cloud/confluence/rest/v2/intro/#about) and "Space Permissions: Get
  space permissions assignments" (developer.atlassian.com/cloud/confluence/rest/v2/api-group-space-permissions/).
- Errors: v1 `{"statusCode", "data": {...}, "message"}`; v2 `{"errors": [{"status", "code", "title", "detail"}]}`
  - REST v1 / v2 reference, "Status codes" of each operation.
The smallest page size of every listing is `page_size` (3 by default), whatever `limit` asks for. Auth is checked like the real thing (Cloud: Basic email:token; Data Center:
Bearer PAT) and answered with 401. Tests script 429/503 storms with Retry-After, and can hold a request until
released (to kill a sync midway).

    with FakeConfluence(edition="cloud") as wiki:
        wiki.add_space("ENG", "Engineering")
        root = wiki.add_page("ENG", "Handbook", "<p>Hello</p>")
        wiki.add_page("ENG", "Child", "<p>...</p>", parent=root)
        wiki.restrict(root, groups=["hr"])
        wiki.base_url  # http://127.0.0.1:PORT/wiki  (Data Center: http://127.0.0.1:PORT/confluence)
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from fakes.server import HTTPServerThread


@dataclass
class Page:
    id: str
    space: str
    title: str
    body: str
    type: str = "page"
    parent: str | None = None
    labels: list[str] = field(default_factory=list)
    version: int = 1
    when: datetime = field(default_factory=lambda: datetime.now(UTC))
    read_users: list[str] = field(default_factory=list)  # account ids (Cloud) / usernames (DC)
    read_groups: list[str] = field(default_factory=list)


@dataclass
class Attachment:
    id: str
    page: str
    filename: str
    data: bytes
    media_type: str
    version: int = 1
    when: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class User:
    id: str  # accountId (Cloud) / username (DC)
    display_name: str
    email: str | None


class FakeConfluence(HTTPServerThread):
    daemon_threads = False  # stop() waits for the requests still being answered (a held search is let go first)

    def __init__(self, edition: str = "cloud", email: str = "bot@acme.example", token: str = "good-token",
                 page_size: int = 3) -> None:
        self.edition = edition
        self.email = email
        self.token = token
        self.page_size = page_size
        self.spaces: dict[str, dict[str, Any]] = {}
        self.pages: dict[str, Page] = {}
        self.attachments: dict[str, Attachment] = {}
        self.users: dict[str, User] = {}
        self.groups: dict[str, str] = {}  # id -> name
        self.group_members: dict[str, list[str]] = {}  # group name -> user ids (accountId / username)
        self.member_requests: list[tuple[str, dict[str, str]]] = []  # (path, query) of every group-member listing
        self.requests: list[str] = []
        self.v2_pages = 0  # v2 permission pages served
        self.restriction_requests: list[tuple[str, bool, int]] = []  # (page id, paged form?, start)
        self.scripted: deque[tuple[int, dict[str, str]]] = deque()
        self.broken: dict[str, int] = {}  # regex on the path (after the context path) -> status it always answers
        self.hold: threading.Event | None = None  # when set up, a search request with a cursor/start waits for it
        self.held = threading.Event()
        self.search_delay = 0.0  # seconds each CQL search request takes (a slow wiki)
        self._ids = itertools.count(1001)
        self._clock = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
        self._lock = threading.Lock()
        super().__init__()

    # -- lifecycle --

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        super().stop()

    @property
    def context(self) -> str:
        return "/wiki" if self.edition == "cloud" else "/confluence"

    @property
    def base_url(self) -> str:
        return f"{self.url}{self.context}"

    # -- content --

    def tick(self) -> datetime:
        self._clock += timedelta(minutes=7)
        return self._clock

    def add_space(self, key: str, name: str, readers: list[tuple[str, str]] | None = None) -> None:
        """readers: ("group", name) / ("user", id) / ("anonymous", "") with read permission (default: all users)."""
        group_ids = {name: gid for gid, name in self.groups.items()}
        readers = readers if readers is not None else [("group", "confluence-users")]
        for kind, ident in readers:
            if kind == "group" and ident not in group_ids:
                gid = f"g-{len(self.groups) + 1}"
                self.groups[gid] = ident
                group_ids[ident] = gid
        self.spaces[key] = {"id": 98000 + len(self.spaces), "key": key, "name": name, "readers": readers}

    def add_user(self, ident: str, display_name: str, email: str | None) -> None:
        self.users[ident] = User(ident, display_name, email)

    def set_group_members(self, name: str, members: list[str]) -> None:
        """Create the group if needed and make `members` (user ids) exactly its members."""
        with self._lock:
            if name not in self.groups.values():
                self.groups[f"g-{len(self.groups) + 1}"] = name
            self.group_members[name] = list(members)

    def add_page(self, space: str, title: str, body: str, parent: str | None = None, labels: list[str] | None = None,
                 type: str = "page") -> str:
        with self._lock:
            page_id = str(next(self._ids))
            self.pages[page_id] = Page(page_id, space, title, body, type, parent, list(labels or []), when=self.tick())
        return page_id

    def edit_page(self, page_id: str, body: str | None = None, title: str | None = None,
                  labels: list[str] | None = None) -> None:
        with self._lock:
            page = self.pages[page_id]
            page.body = body if body is not None else page.body
            page.title = title if title is not None else page.title
            page.labels = labels if labels is not None else page.labels
            page.version += 1
            page.when = self.tick()

    def delete_page(self, page_id: str) -> None:
        with self._lock:
            del self.pages[page_id]
            for att in [a for a in self.attachments.values() if a.page == page_id]:
                del self.attachments[att.id]

    def restrict(self, page_id: str, users: list[str] | None = None, groups: list[str] | None = None) -> None:
        """Read restrictions; they do not bump the page's version (as in Confluence)."""
        self.pages[page_id].read_users = list(users or [])
        self.pages[page_id].read_groups = list(groups or [])

    def add_attachment(self, page_id: str, filename: str, data: bytes, media_type: str = "application/octet-stream") -> str:
        with self._lock:
            att_id = f"att{next(self._ids)}"
            self.attachments[att_id] = Attachment(att_id, page_id, filename, data, media_type, when=self.tick())
        return att_id

    def fail_next(self, count: int, status: int = 429, retry_after: str | None = "0") -> None:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        for _ in range(count):
            self.scripted.append((status, headers))

    def hold_next_pages(self) -> None:
        """Search requests for a second or later results page wait until `release()` (a sync stuck mid-way)."""
        self.hold = threading.Event()
        self.held.clear()

    def release(self) -> None:
        if self.hold is not None:
            self.hold.set()
            self.hold = None

    # -- JSON shapes --

    def _user_json(self, ident: str) -> dict[str, Any]:
        user = self.users.get(ident) or User(ident, ident, None)
        if self.edition == "cloud":
            data: dict[str, Any] = {"type": "known", "accountId": user.id, "accountType": "atlassian",
                                    "publicName": user.display_name, "displayName": user.display_name}
            if user.email:
                data["email"] = user.email
            return data
        return {"type": "known", "username": user.id, "userKey": f"key-{user.id}", "displayName": user.display_name}

    def _space_json(self, key: str) -> dict[str, Any]:
        space = self.spaces[key]
        return {"id": space["id"], "key": key, "name": space["name"], "type": "global",
                "_links": {"webui": f"/spaces/{key}"}}

    def _ancestors(self, page: Page) -> list[Page]:
        chain = []
        parent = page.parent
        while parent is not None and parent in self.pages:
            chain.append(self.pages[parent])
            parent = self.pages[parent].parent
        return list(reversed(chain))

    def _content_json(self, page: Page, expand: set[str]) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": page.id, "type": page.type, "status": "current", "title": page.title,
            "_links": {"webui": f"/spaces/{page.space}/pages/{page.id}/{quote(page.title).replace('%20', '+')}",
                       "self": f"{self.base_url}/rest/api/content/{page.id}", "tinyui": f"/x/{page.id}"},
            "_expandable": {},
        }
        version = {"number": page.version, "when": page.when.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "minorEdit": False,
                   "by": self._user_json("editor")}
        if "version" in expand:
            data["version"] = version
        if "space" in expand:
            data["space"] = self._space_json(page.space)
        if "ancestors" in expand:
            data["ancestors"] = [{"id": a.id, "type": a.type, "status": "current", "title": a.title}
                                 for a in self._ancestors(page)]
        if "body.storage" in expand:
            data["body"] = {"storage": {"value": page.body, "representation": "storage"}}
        if "metadata.labels" in expand:
            data["metadata"] = {"labels": {"results": [{"prefix": "global", "name": n, "id": str(i)}
                                                       for i, n in enumerate(page.labels)],
                                           "start": 0, "limit": 200, "size": len(page.labels)}}
        if "history" in expand:
            data["history"] = {"latest": True, "createdBy": self._user_json("author"),
                               "createdDate": page.when.strftime("%Y-%m-%dT%H:%M:%S.000Z")}
        return data

    def _attachment_json(self, att: Attachment, expand: set[str]) -> dict[str, Any]:
        page = self.pages[att.page]
        data: dict[str, Any] = {
            "id": att.id, "type": "attachment", "status": "current", "title": att.filename,
            "metadata": {"mediaType": att.media_type},
            "extensions": {"mediaType": att.media_type, "fileSize": len(att.data)},
            "_links": {"webui": f"/pages/viewpageattachments.action?pageId={page.id}&preview={quote(att.filename)}",
                       "download": f"/download/attachments/{page.id}/{quote(att.filename)}?version={att.version}&api=v2"},
        }
        if "version" in expand:
            data["version"] = {"number": att.version, "when": att.when.strftime("%Y-%m-%dT%H:%M:%S.000Z")}
        if "container" in expand:
            data["container"] = {"id": page.id, "type": page.type, "title": page.title, "status": "current"}
        if "space" in expand:
            data["space"] = self._space_json(page.space)
        return data

    # -- CQL --

    def _search(self, cql: str) -> list[tuple[datetime, Any]]:
        spaces = re.search(r"space in \(([^)]*)\)", cql)
        keys = {k.strip().strip('"') for k in spaces.group(1).split(",")} if spaces else set(self.spaces)
        types_match = re.search(r"type in \(([^)]*)\)", cql)
        types = {t.strip() for t in types_match.group(1).split(",")} if types_match else {"page"}
        since_match = re.search(r'lastmodified >= "(\d{4}-\d\d-\d\d \d\d:\d\d)"', cql)
        since = (datetime.strptime(since_match.group(1), "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
                 if since_match else None)
        label_match = re.search(r'label = "([^"]+)"', cql)
        found: list[tuple[datetime, Any]] = []
        for page in self.pages.values():
            if page.space in keys and page.type in types and (since is None or page.when >= since):
                if label_match and label_match.group(1) not in page.labels:
                    continue
                found.append((page.when, page))
        if "attachment" in types:
            for att in self.attachments.values():
                if self.pages[att.page].space in keys and (since is None or att.when >= since):
                    found.append((att.when, att))
        found.sort(key=lambda pair: (pair[0], pair[1].id))
        return found

    # -- HTTP --

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                fake.requests.append(self.path)
                if fake.scripted:
                    status, headers = fake.scripted.popleft()
                    return self._send(status, {"statusCode": status, "message": "Rate limit exceeded"}, headers)
                if not self._authorised():
                    return self._send(401, error_body(401, "Client must be authenticated to access this resource.", v2=False))
                parts = urlsplit(self.path)
                path = parts.path
                if not path.startswith(fake.context):
                    return self._send(404, error_body(404, f"null for uri: {path}", v2=False))
                path = path[len(fake.context):]
                v2 = path.startswith("/api/v2/")
                for pattern, status in fake.broken.items():
                    if re.fullmatch(pattern, path):
                        return self._send(status, error_body(status, "scripted failure", v2=v2))
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                try:
                    fake_route(fake, self, path, query)
                except (KeyError, StopIteration) as exc:
                    self._send(404, error_body(404, f"No content found with id: {exc}", v2=v2))

            def _authorised(self) -> bool:
                header = self.headers.get("Authorization", "")
                if fake.edition == "cloud":
                    expected = base64.b64encode(f"{fake.email}:{fake.token}".encode()).decode()
                    return header == f"Basic {expected}"
                return header == f"Bearer {fake.token}"

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            def send_json(self, body: Any, headers: dict[str, str] | None = None) -> None:
                self._send(200, body, headers)

            def send_bytes(self, data: bytes, media_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", media_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def redirect(self, location: str) -> None:
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler


_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 429: "Too Many Requests",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


def error_body(status: int, message: str, *, v2: bool) -> dict[str, Any]:
    """Confluence's documented error bodies: v1 `{"statusCode", "data", "message"}` (REST v1 reference, e.g. "Get
    content by ID" → 404); v2 `{"errors": [{"status", "code", "title", "detail"}]}` (REST v2 reference, e.g. "Get
    space permissions assignments" → 404)."""
    title = _TITLES.get(status, "Error")
    if v2:
        return {"errors": [{"status": status, "code": title.upper().replace(" ", "_"), "title": title,
                            "detail": message}]}
    return {"statusCode": status, "data": {"authorized": status not in (401, 403), "valid": True, "errors": [],
                                           "successful": False}, "message": message}


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode()


def _decode_cursor(cursor: str) -> int:
    return int(base64.urlsafe_b64decode(cursor.encode()).decode().split(":", 1)[1])


def fake_route(fake: FakeConfluence, handler: Any, path: str, query: dict[str, str]) -> None:
    expand = set((query.get("expand") or "").split(","))
    if path == "/rest/api/content/search":
        # REST v1 "Search content by CQL": {"results": [content], "start", "limit", "size", "totalSize" (Cloud),
        # "_links": {"base": "https://SITE/wiki", "context": "/wiki", "next": "/rest/api/content/search?...cursor=...",
        # "self"}}; Cloud pages only by the cursor (change notice "modernize search REST APIs"), Data Center by
        # `start` (Data Center REST API, "Pagination"): `next` is relative to `_links.base` in both.
        if fake.search_delay:
            time.sleep(fake.search_delay)
        cql = query["cql"]
        limit = min(int(query.get("limit", 25)), fake.page_size)
        if fake.edition == "cloud":  # Cloud ignores start: only the cursor pages
            offset = int(base64.urlsafe_b64decode(query["cursor"]).decode()) if "cursor" in query else 0
        else:
            offset = int(query.get("start", 0))
        if offset and fake.hold is not None:
            fake.held.set()
            fake.hold.wait(30)
        with fake._lock:
            found = fake._search(cql)
            window = found[offset : offset + limit]
            results = [fake._attachment_json(obj, expand) if isinstance(obj, Attachment)
                       else fake._content_json(obj, expand) for _, obj in window]
        links: dict[str, str] = {"base": fake.base_url, "context": fake.context,
                                 "self": f"{fake.base_url}/rest/api/content/search"}
        if offset + limit < len(found):
            params = {"cql": cql, "limit": limit, "expand": query.get("expand", "")}
            if fake.edition == "cloud":
                params["cursor"] = base64.urlsafe_b64encode(str(offset + limit).encode()).decode()
            else:
                params["start"] = offset + limit
            links["next"] = "/rest/api/content/search?" + urlencode(params)
        body: dict[str, Any] = {"results": results, "start": offset, "limit": limit, "size": len(results),
                                "_links": links}
        if fake.edition == "cloud":
            body["totalSize"] = len(found)
        return handler.send_json(body)
    match = re.fullmatch(r"/rest/api/space/([^/]+)", path)
    if match:
        return handler.send_json(fake._space_json(fake.spaces[match.group(1)]["key"]))
    match = re.fullmatch(r"/rest/api/space/([^/]+)/permissions", path)
    if match and fake.edition != "cloud":
        space = fake.spaces[match.group(1)]
        out = []
        for kind, ident in space["readers"]:
            subject = ({"type": "group", "name": ident} if kind == "group" else
                       {"type": "user", "userKey": f"key-{ident}"} if kind == "user" else {"type": "anonymous"})
            out.append({"operation": {"targetType": "space", "operationKey": "read"}, "subject": subject,
                        "spaceKey": space["key"], "spaceId": space["id"]})
        out.append({"operation": {"targetType": "page", "operationKey": "create"},
                    "subject": {"type": "group", "name": "confluence-administrators"}})
        return handler.send_json(out)
    match = re.fullmatch(r"/api/v2/spaces/(\d+)/permissions", path)
    if match and fake.edition == "cloud":
        # REST v2 "Get space permissions assignments": MultiEntityResult<SpacePermissionAssignment> =
        # {"results": [{"id", "principal": {"type": "user"|"group"|"role", "id"}, "operation": {"key",
        # "targetType"}}], "_links": {"next": "/wiki/api/v2/...?cursor=...", "base": "https://SITE/wiki"}}, and
        # the next page also in `Link: </wiki/api/v2/...>; rel="next"` (REST v2 intro, "Pagination").
        space = next(s for s in fake.spaces.values() if s["id"] == int(match.group(1)))
        group_ids = {name: gid for gid, name in fake.groups.items()}
        results = []
        for i, (kind, ident) in enumerate(space["readers"]):
            principal = {"type": kind, "id": group_ids[ident] if kind == "group" else ident}
            results.append({"id": str(i), "principal": principal, "operation": {"key": "read", "targetType": "space"}})
        results.append({"id": "99", "principal": {"type": "group", "id": "g-admins"},
                        "operation": {"key": "administer", "targetType": "space"}})
        limit = min(int(query.get("limit", 25)), fake.page_size)
        start = _decode_cursor(query["cursor"]) if "cursor" in query else 0
        body: dict[str, Any] = {"results": results[start : start + limit], "_links": {"base": fake.base_url}}
        headers = {}
        if start + limit < len(results):
            following = (f"{fake.context}/api/v2/spaces/{space['id']}/permissions?"
                         + urlencode({"limit": limit, "cursor": _encode_cursor(start + limit)}))
            body["_links"]["next"] = following
            headers["Link"] = f'<{following}>; rel="next"'
        fake.v2_pages += 1
        return handler.send_json(body, headers)
    # Group members, paged by start/limit with `_links.next` relative to `_links.base`; results are User objects
    # (UserArray: results, start, limit, size, _links). Only what Atlassian's references document:
    # - Cloud (Confluence Cloud REST API v1 reference, developer.atlassian.com/cloud/confluence/rest/v1/api-group-group/):
    #   "Get group members" by id, GET /wiki/rest/api/group/{groupId}/membersByGroupId?start=&limit=
    #   (&shouldReturnTotalSize, &expand), `limit` at most 200 (a larger one is a 400); the deprecated
    #   GET /wiki/rest/api/group/member?name= takes a group NAME (a `groupId` there is not a parameter of it: 400);
    #   "Get group" GET /wiki/rest/api/group/by-name?name= and /group/by-id?id=.
    # - Data Center (Confluence Data Center REST API, Group, "Get members of group"):
    #   GET /rest/api/group/{groupName}/member?start=&limit= (Cloud no longer documents this path).
    if path == "/rest/api/group/by-name" and fake.edition == "cloud":
        name = query["name"]
        gid = next(g for g, n in fake.groups.items() if n == name)
        return handler.send_json({"type": "group", "name": name, "id": gid,
                                  "_links": {"self": f"{fake.base_url}/rest/api/group/by-id?id={gid}"}})
    member_path = None
    by_id = re.fullmatch(r"/rest/api/group/([^/]+)/membersByGroupId", path)
    if by_id and fake.edition == "cloud":
        gid = unquote(by_id.group(1))
        if int(query.get("limit", 200)) > 200:
            return handler._send(400, error_body(400, "limit must be at most 200", v2=False))
        if gid not in fake.groups:
            raise KeyError(gid)
        name = fake.groups[gid]
        member_path = f"/rest/api/group/{quote(gid, safe='')}/membersByGroupId?"
    elif path == "/rest/api/group/member" and fake.edition == "cloud":
        if "name" not in query:  # e.g. ?groupId=…: not a parameter of this (deprecated, by-name) operation
            return handler._send(400, error_body(400, "Parameter 'name' is required", v2=False))
        name = query["name"]
        member_path = f"/rest/api/group/member?name={quote(name, safe='')}"
    elif fake.edition == "datacenter":
        match = re.fullmatch(r"/rest/api/group/([^/]+)/member", path)
        if match:
            name = unquote(match.group(1))
            member_path = f"/rest/api/group/{quote(name, safe='')}/member?"
    if member_path is not None:
        fake.member_requests.append((path, dict(query)))
        if name not in fake.group_members:
            raise KeyError(name)
        members = fake.group_members[name]
        start, limit = int(query.get("start", 0)), min(int(query.get("limit", 200)), fake.page_size)
        window = members[start : start + limit]
        links = {"base": fake.base_url, "context": fake.context, "self": f"{fake.base_url}{member_path}"}
        if start + limit < len(members):
            joiner = "&" if not member_path.endswith("?") else ""
            links["next"] = f"{member_path}{joiner}start={start + limit}&limit={limit}"
        return handler.send_json({"results": [fake._user_json(m) for m in window], "start": start, "limit": limit,
                                  "size": len(window), "_links": links})
    if path == "/rest/api/group/by-id":
        gid = query["id"]
        return handler.send_json({"type": "group", "name": fake.groups[gid], "id": gid})
    if path == "/rest/api/user":
        ident = query.get("accountId") or query.get("username") or (query.get("key") or "").removeprefix("key-")
        if ident not in fake.users:
            raise KeyError(ident)
        return handler.send_json(fake._user_json(ident))
    match = re.fullmatch(r"/rest/api/content/([^/]+)/restriction/byOperation(/read)?", path)
    if match:
        # REST v1 "Content restrictions": Get restrictions by operation → {"read": {"operation": "read",
        # "restrictions": {"user": {"results", "start", "limit", "size"}, "group": {...}}, "_links"}, "update": {...}};
        # each list holds at most `limit` subjects. Get restrictions for operation (`.../byOperation/read`) pages
        # users and groups together with `start`/`limit` and answers {"operation", "restrictions": {...}}.
        page = fake.pages[match.group(1)]
        start = int(query.get("start", 0)) if match.group(2) else 0
        limit = min(int(query.get("limit", 100)), fake.page_size)
        users = [fake._user_json(u) for u in page.read_users][start : start + limit]
        groups = [{"type": "group", "name": g, "id": f"id-{g}"} for g in page.read_groups][start : start + limit]
        fake.restriction_requests.append((page.id, bool(match.group(2)), start))
        read = {"operation": "read", "restrictions": {
            "user": {"results": users, "start": start, "limit": limit, "size": len(users)},
            "group": {"results": groups, "start": start, "limit": limit, "size": len(groups)}},
            "_links": {"self": f"{fake.base_url}/rest/api/content/{page.id}/restriction/byOperation/read"}}
        if match.group(2):
            return handler.send_json(read)
        return handler.send_json({
            "read": read,
            "update": {"operation": "update", "restrictions": {"user": {"results": [], "start": 0, "limit": limit, "size": 0},
                                                               "group": {"results": [], "start": 0, "limit": limit, "size": 0}}},
            "_links": {"base": fake.base_url, "context": fake.context},
        })
    match = re.fullmatch(r"/rest/api/content/([^/]+)/child/attachment/([^/]+)/download", path)
    if match:
        att = fake.attachments[match.group(2)]
        return handler.redirect(f"{fake.context}/download/attachments/{att.page}/{quote(att.filename)}"
                                f"?version={att.version}&api=v2")
    match = re.fullmatch(r"/download/attachments/([^/]+)/(.+)", path)
    if match:
        att = next(a for a in fake.attachments.values()
                   if a.page == match.group(1) and a.filename == unquote(match.group(2)))
        return handler.send_bytes(att.data, att.media_type)
    match = re.fullmatch(r"/rest/api/content/([^/]+)", path)
    if match:
        return handler.send_json(fake._content_json(fake.pages[match.group(1)], expand))
    raise KeyError(path)
