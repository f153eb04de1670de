"""A fake Admin SDK Directory API v1 (groups and members), served by the fake Drive's HTTP server (so the same
service-account token endpoint signs both) under `/admin/directory/v1/`, for the real google-api-python-client
(`build("admin", "directory_v1", static_discovery=True, client_options={"api_endpoint": drive.base_url + "/"})`).

Shapes from Google's Admin SDK Directory API reference: "Method: groups.list" (`{kind: "admin#directory#groups",
etag, groups: [Group], nextPageToken}`; Group = `{kind: "admin#directory#group", id, etag, email, name,
directMembersCount, description, adminCreated}`) and "Method: members.list" (`{kind: "admin#directory#members",
etag, members: [Member], nextPageToken}`; Member = `{kind: "admin#directory#member", etag, id, email, role, type:
USER|GROUP|CUSTOMER, status}`; a CUSTOMER member carries the customer id and no email). Errors use Google's JSON
error shape (`{"error": {"code", "message", "errors": [{"domain", "reason", "message"}]}}`). Pages are small
(`page_size`, default 2) so every list is followed by its `nextPageToken`; `rate_limit(n)` answers the next n
directory calls with 429. `forbid(email)` makes members.list of that group answer 403 `forbidden` "Not Authorized
to access this resource/api" (Admin SDK, "Directory API: common errors"), as it does for a group the acting admin
may not manage.

    drive.directory.add_group("eng@acme.example", ["alice@acme.example", ("group", "platform@acme.example")])
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from fakes.drive_api import DriveError

CUSTOMER_ID = "C03az79cb"


@dataclass
class FakeGroup:
    id: str
    email: str
    name: str
    members: list[tuple[str, str]] = field(default_factory=list)  # (type USER|GROUP|CUSTOMER, email or id)


class FakeDirectory:
    def __init__(self, page_size: int = 2) -> None:
        self.groups: dict[str, FakeGroup] = {}  # email -> group
        self.page_size = page_size
        self.storm: list[DriveError] = []
        self.down = False  # every call answers 503 (an unreachable directory)
        self.calls: list[str] = []
        self.forbidden: set[str] = set()  # group emails whose members.list answers 403

    def add_group(self, email: str, members: list[Any], name: str | None = None) -> FakeGroup:
        """members: "user@x" (a USER), ("group", "g@x"), ("customer", "") or ("user", "u@x")."""
        group = self.groups.get(email) or FakeGroup(f"0{hashlib.md5(email.encode()).hexdigest()[:14]}", email,
                                                    name or email.split("@")[0].title())
        group.members = [("USER", m) if isinstance(m, str) else (m[0].upper(), m[1]) for m in members]
        self.groups[email] = group
        return group

    def remove_member(self, group_email: str, member_email: str) -> None:
        group = self.groups[group_email]
        group.members = [m for m in group.members if m[1] != member_email]

    def forbid(self, group_email: str, forbidden: bool = True) -> None:
        (self.forbidden.add if forbidden else self.forbidden.discard)(group_email)

    def rate_limit(self, count: int) -> None:
        self.storm.extend(DriveError(429, "rateLimitExceeded", "Rate Limit Exceeded", {"Retry-After": "0"})
                          for _ in range(count))

    # -- the API --

    def handle(self, parts: list[str], params: dict[str, str]) -> dict[str, Any]:
        """parts: the path below admin/directory/v1 (["groups"], ["groups", KEY, "members"])."""
        self.calls.append("/".join(parts))
        if self.down:
            raise DriveError(503, "backendError", "The service is currently unavailable.")
        if self.storm:
            raise self.storm.pop(0)
        if parts == ["groups"]:
            if params.get("customer") != "my_customer" and not params.get("domain"):
                raise DriveError(400, "invalid", "Bad Request")
            items = [self._group_json(g) for g in sorted(self.groups.values(), key=lambda g: g.email)]
            return self._page("admin#directory#groups", "groups", items, params)
        if len(parts) == 3 and parts[0] == "groups" and parts[2] == "members":
            key = parts[1]
            group = next((g for g in self.groups.values() if key in (g.id, g.email)), None)
            if group is None:
                raise DriveError(404, "notFound", "Resource Not Found: groupKey")
            if group.email in self.forbidden:
                raise DriveError(403, "forbidden", "Not Authorized to access this resource/api")
            items = [self._member_json(kind, ident) for kind, ident in group.members]
            return self._page("admin#directory#members", "members", items, params)
        raise DriveError(404, "notFound", "Not Found")

    def _page(self, kind: str, key: str, items: list[dict[str, Any]], params: dict[str, str]) -> dict[str, Any]:
        start = int(params.get("pageToken") or 0)
        size = min(int(params.get("maxResults") or 200), self.page_size)
        body: dict[str, Any] = {"kind": kind, "etag": f'"etag-{start}"'}
        window = items[start : start + size]
        if window:
            body[key] = window  # an empty list is left out, as Google does
        if start + size < len(items):
            body["nextPageToken"] = str(start + size)
        return body

    def _group_json(self, group: FakeGroup) -> dict[str, Any]:
        return {"kind": "admin#directory#group", "id": group.id, "etag": f'"g-{group.id}"', "email": group.email,
                "name": group.name, "directMembersCount": str(len(group.members)), "description": "",
                "adminCreated": True}

    def _member_json(self, kind: str, ident: str) -> dict[str, Any]:
        if kind == "CUSTOMER":
            return {"kind": "admin#directory#member", "etag": '"c"', "id": CUSTOMER_ID, "role": "MEMBER",
                    "type": "CUSTOMER", "status": "ACTIVE"}
        member_id = next((g.id for g in self.groups.values() if g.email == ident), None) if kind == "GROUP" else None
        return {"kind": "admin#directory#member", "etag": f'"m-{ident}"',
                "id": member_id or str(int(hashlib.md5(ident.encode()).hexdigest()[:12], 16)), "email": ident,
                "role": "MEMBER", "type": kind, "status": "ACTIVE"}
