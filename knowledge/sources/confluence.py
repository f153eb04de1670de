"""Confluence (Cloud and Data Center) as a source, over REST API v1 with a small async client of our own (httpx).

What is synced: pages and blog posts of the configured spaces (optionally narrowed by extra CQL), as Markdown
converted from the storage format (headings, lists, tables, code blocks and the text of info/note/warning/tip
panels, expand and code macros survive), and their attachments of supported types (pdf, docx, txt, md, html) as
documents of their own, linked to their page. Pages carrying an excluded label are left out (and removed if they
were indexed).

Incremental: CQL `lastmodified >= "<checkpoint minus a day>"` ordered by lastmodified, so each results page ends
at a time the checkpoint can safely move to. CQL dates have minute precision in the API user's time zone, which
we cannot know; the one-day overlap covers any time zone, and re-listed items cost nothing because their version
is unchanged. Cloud pages the results by the cursor in `_links.next` (relative to `_links.base`); Data Center by
`start`: following `_links.next` serves both.

Deletions: Confluence has no delete feed. `inventory()` lists every page id in scope (no bodies) and, with
`visibility="permissions"`, re-reads permissions, because restrictions change without a new version.

Permissions: a page is readable by (space read permission) ∩ (its read restrictions) ∩ (the read restrictions of
each ancestor). Space permissions come from Cloud's `/wiki/api/v2/spaces/{id}/permissions` or Data Center's
`/rest/api/space/{KEY}/permissions`; restrictions from `/rest/api/content/{id}/restriction/byOperation`. A space
readable anonymously or by the all-users group (`everyone_group`) is `everyone`. Users become `user:<email>` when
Confluence shows the email, else `user:confluence:<accountId>` (Cloud) or `user:confluence:<username>` (Data
Center); map chat identities to those with the bot's user map. Intersections are exact and fail closed: a principal
must appear at every restricted level (group membership is not expanded), so a page restricted to individual
users inside a space readable only by some groups is visible to those users only if they also hold space access
directly or the space is open to everyone.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import os
import random
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import PurePosixPath
from typing import Any, AsyncIterator, Literal, Mapping, Sequence
from urllib.parse import urljoin, urlsplit

import httpx
from bs4 import BeautifulSoup, NavigableString
from markdownify import markdownify

from knowledge.errors import ItemUnavailable, SourceAuthError, SourceConfigError, SourceUnavailable
from knowledge.access import EVERYONE
from knowledge.sources.base import ChangeBatch, ItemRef, SourceItem, SourceSpec, register_source

logger = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "CONFLUENCE_API_TOKEN"
DEFAULT_EVERYONE_GROUP = "confluence-users"
PAGE_SIZE = 25
CONTENT_EXPAND = "body.storage,version,ancestors,space,metadata.labels,history,container"
INVENTORY_EXPAND = "version,ancestors,space,metadata.labels,container"
CHECKPOINT_OVERLAP = timedelta(days=1)
ATTACHMENT_SUFFIXES = (".pdf", ".docx", ".txt", ".md", ".markdown", ".html", ".htm")
PANEL_MACROS = {"info": "Info", "note": "Note", "warning": "Warning", "tip": "Tip", "panel": "Panel"}

Visibility = Literal["permissions", "everyone"]


# --- settings ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfluenceConfig:
    """What is stored for a Confluence source (never the token itself: only the name of its variable)."""

    url: str
    spaces: tuple[str, ...]
    cql: str | None = None
    email: str | None = None  # set: Cloud (Basic email:token); unset: Data Center (Bearer personal access token)
    token_env: str = DEFAULT_TOKEN_ENV
    exclude_labels: tuple[str, ...] = ()
    everyone_group: str = DEFAULT_EVERYONE_GROUP
    visibility: Visibility = "permissions"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ConfluenceConfig":
        url = str(data["url"]).rstrip("/")
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise SourceConfigError(f"--url must be the wiki's base URL, e.g. https://acme.atlassian.net/wiki (got {url!r})")
        spaces = tuple(str(s) for s in data.get("spaces") or ())
        if not spaces:
            raise SourceConfigError("give at least one --space KEY")
        visibility = data.get("visibility", "permissions")
        if visibility not in ("permissions", "everyone"):
            raise SourceConfigError("--visibility must be permissions or everyone")
        token_env = str(data.get("token_env") or DEFAULT_TOKEN_ENV)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token_env):
            raise SourceConfigError(f"--token-env takes the NAME of an environment variable, not a token (got {token_env[:4]}…)")
        return cls(url=url, spaces=spaces, cql=data.get("cql") or None, email=data.get("email") or None,
                   token_env=token_env, exclude_labels=tuple(data.get("exclude_labels") or ()),
                   everyone_group=str(data.get("everyone_group") or DEFAULT_EVERYONE_GROUP), visibility=visibility)

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "spaces": list(self.spaces), "cql": self.cql, "email": self.email,
                "token_env": self.token_env, "exclude_labels": list(self.exclude_labels),
                "everyone_group": self.everyone_group, "visibility": self.visibility}

    @property
    def cloud(self) -> bool:
        return self.email is not None


# --- the HTTP client -------------------------------------------------------------------------------------------


@dataclass
class RetryPolicy:
    """429 and 503: wait what Retry-After says (else exponential backoff), each wait at most `max_wait` seconds,
    at most `attempts` tries per request; past that the run fails and the next interval retries."""

    attempts: int = 6
    base_wait: float = 1.0
    max_wait: float = 60.0

    def wait_for(self, response: httpx.Response, attempt: int) -> float:
        header = response.headers.get("retry-after")
        wait: float | None = None
        if header:
            try:
                wait = float(header)
            except ValueError:
                parsed = email.utils.parsedate_to_datetime(header) if header else None
                if parsed is not None:
                    wait = (parsed - datetime.now(timezone.utc)).total_seconds()
        if wait is None:
            wait = self.base_wait * (2 ** attempt) * (0.5 + random.random() / 2)
        return min(max(wait, 0.0), self.max_wait)


class ConfluenceClient:
    """The handful of REST v1 (and Cloud v2) calls the source needs. Errors become typed `SourceError`s whose
    messages name the source and the fix."""

    def __init__(self, source_name: str, config: ConfluenceConfig, token: str, *,
                 retry: RetryPolicy | None = None, max_connections: int = 4) -> None:
        self.name = source_name
        self.config = config
        self.base = config.url
        self.retry = retry or RetryPolicy()
        auth: httpx.Auth | None = None
        headers = {"Accept": "application/json", "User-Agent": "ragbot"}
        if config.cloud:
            auth = httpx.BasicAuth(config.email or "", token)
        else:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.AsyncClient(
            auth=auth, headers=headers, timeout=httpx.Timeout(30.0), follow_redirects=True,
            limits=httpx.Limits(max_connections=max_connections),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base + path

    async def get(self, path: str, params: Mapping[str, Any] | None = None, *, raw: bool = False) -> Any:
        url = self.url(path)
        for attempt in range(self.retry.attempts):
            try:
                response = await self.http.get(url, params=params)
            except httpx.TransportError as exc:
                raise SourceUnavailable(
                    f"source {self.name!r}: cannot reach Confluence at {self.base} ({type(exc).__name__}: {exc}); "
                    "check --url and the network; the next sync retries"
                ) from exc
            if response.status_code in (429, 503):
                if attempt + 1 < self.retry.attempts:
                    wait = self.retry.wait_for(response, attempt)
                    logger.info("%s: Confluence answered %s; retrying in %.1fs", self.name, response.status_code, wait)
                    await asyncio.sleep(wait)
                    continue
                raise SourceUnavailable(
                    f"source {self.name!r}: Confluence kept answering {response.status_code} (rate limited or "
                    f"unavailable) after {self.retry.attempts} attempts; the next sync retries"
                )
            if response.status_code in (401, 403) and not raw:
                raise SourceAuthError(self._auth_message(response.status_code))
            if response.status_code == 404:
                raise _NotFound(url)
            if response.status_code >= 400:
                raise SourceUnavailable(
                    f"source {self.name!r}: Confluence answered {response.status_code} for {urlsplit(url).path}"
                )
            return response if raw else response.json()
        raise AssertionError("unreachable")

    def _auth_message(self, status: int) -> str:
        if self.config.cloud:
            fix = (f"check that {self.config.token_env} holds a current API token of {self.config.email} "
                   "(id.atlassian.com → Security → API tokens)")
        else:
            fix = (f"check that {self.config.token_env} holds a valid personal access token "
                   "(Profile → Personal Access Tokens); for Cloud, add --email")
        what = "refused the credentials" if status == 401 else "denied access"
        return f"source {self.name!r}: Confluence {what} ({status}); {fix}"

    async def paged(self, path: str, params: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Follow `_links.next` (v1: relative to `_links.base`; v2: relative to the site) until there is none.
        A short page is not the end: only a missing `next` is."""
        data = await self.get(path, params)
        while True:
            yield data
            links = data.get("_links") or {}
            following = links.get("next")
            if not following:
                return
            if following.startswith("/") and links.get("base"):
                following = links["base"].rstrip("/") + following
            else:
                following = urljoin(self.base + "/", following)
            data = await self.get(following)

    async def search(self, cql: str, expand: str, limit: int = PAGE_SIZE) -> AsyncIterator[dict[str, Any]]:
        async for page in self.paged("/rest/api/content/search", {"cql": cql, "expand": expand, "limit": limit}):
            yield page

    async def space(self, key: str) -> dict[str, Any]:
        return await self.get(f"/rest/api/space/{key}")

    async def content(self, content_id: str, expand: str) -> dict[str, Any]:
        return await self.get(f"/rest/api/content/{content_id}", {"expand": expand})

    async def read_restrictions(self, content_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        data = await self.get(f"/rest/api/content/{content_id}/restriction/byOperation",
                              {"expand": "read.restrictions.user,read.restrictions.group"})
        restrictions = (data.get("read") or {}).get("restrictions") or {}
        users = (restrictions.get("user") or {}).get("results") or []
        groups = (restrictions.get("group") or {}).get("results") or []
        return users, groups

    async def download(self, path: str) -> bytes:
        response = await self.get(path, raw=True)
        if response.status_code in (401, 403):
            raise ItemUnavailable(f"download refused ({response.status_code})")
        return response.content


class _NotFound(Exception):
    pass


# --- storage format → Markdown -------------------------------------------------------------------------------


def storage_to_markdown(storage: str) -> str:
    """Confluence storage XHTML → Markdown. Macros become plain HTML first (code → <pre>, panels → a quoted
    block with its kind, expand → its title and body), links and images keep their text, then markdownify."""
    soup = BeautifulSoup(storage, "html.parser")
    for macro in reversed(soup.find_all("ac:structured-macro")):
        name = (macro.get("ac:name") or "").lower()
        params = {p.get("ac:name"): p.get_text() for p in macro.find_all("ac:parameter", recursive=False)}
        plain = macro.find("ac:plain-text-body", recursive=False)
        rich = macro.find("ac:rich-text-body", recursive=False)
        if name in ("code", "noformat") and plain is not None:
            pre = soup.new_tag("pre")
            code = soup.new_tag("code")
            if params.get("language"):
                code["class"] = f"language-{params['language']}"
            code.string = plain.get_text()
            pre.append(code)
            macro.replace_with(pre)
            continue
        container = soup.new_tag("div")
        title = params.get("title")
        if name in PANEL_MACROS:
            label = soup.new_tag("p")
            label.string = f"{PANEL_MACROS[name]}: {title}" if title else f"{PANEL_MACROS[name]}:"
            quote = soup.new_tag("blockquote")
            quote.append(label)
            if rich is not None:
                quote.extend(list(rich.contents))
            container.append(quote)
        else:  # expand and anything else: keep its title and body text
            if title:
                heading = soup.new_tag("p")
                strong = soup.new_tag("strong")
                strong.string = title
                heading.append(strong)
                container.append(heading)
            if rich is not None:
                container.extend(list(rich.contents))
            elif plain is not None:
                container.append(NavigableString(plain.get_text()))
        macro.replace_with(container)
    for link in soup.find_all("ac:link"):
        body = link.find(["ac:plain-text-link-body", "ac:link-body"])
        target = link.find(["ri:page", "ri:attachment", "ri:user"])
        text = body.get_text() if body is not None else (
            (target.get("ri:content-title") or target.get("ri:filename") or "") if target is not None else "")
        link.replace_with(NavigableString(text))
    for tag in soup.find_all(["ac:image", "ac:emoticon", "ac:placeholder"]):
        tag.decompose()
    for tag in soup.find_all(re.compile(r"^(ac|ri):")):
        tag.unwrap()
    return markdownify(str(soup), heading_style="ATX", bullets="-", code_language_callback=_code_language).strip() + "\n"


def _code_language(element: Any) -> str | None:
    for cls in element.get("class") or (element.code.get("class") if element.code else None) or []:
        if cls.startswith("language-"):
            return cls[len("language-"):]
    return None


# --- the source ----------------------------------------------------------------------------------------------


@dataclass
class _RunCache:
    space_access: dict[str, tuple[str, ...]] = field(default_factory=dict)
    restrictions: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    users: dict[str, str] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)


class ConfluenceSource:
    prune_on_every_sync = False
    listing_prefix = ""

    def __init__(self, name: str, config: ConfluenceConfig, *, retry: RetryPolicy | None = None) -> None:
        self.config = config
        self.spec = SourceSpec(name=name, kind="confluence", location=config.url)
        self.retry = retry
        self._client: ConfluenceClient | None = None
        self._cache = _RunCache()

    @property
    def client(self) -> ConfluenceClient:
        if self._client is None:
            token = os.environ.get(self.config.token_env, "").strip()
            if not token:
                raise SourceAuthError(
                    f"source {self.spec.name!r}: the environment variable {self.config.token_env} is not set; "
                    f"put the Confluence {'API token' if self.config.cloud else 'personal access token'} in it"
                )
            self._client = ConfluenceClient(self.spec.name, self.config, token, retry=self.retry)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def check(self) -> None:
        """Credentials work and every space exists and is visible to the account."""
        for key in self.config.spaces:
            try:
                await self.client.space(key)
            except _NotFound:
                raise SourceConfigError(
                    f"source {self.spec.name!r}: space {key!r} was not found at {self.config.url} or this account "
                    "cannot see it; check --space (the space KEY, not its name) and the account's permissions"
                ) from None

    # -- changes --

    def _cql(self, since: datetime | None) -> str:
        spaces = ", ".join(f'"{key}"' for key in self.config.spaces)
        parts = [f"space in ({spaces})", "type in (page, blogpost, attachment)"]
        if self.config.cql:
            parts.insert(0, f"({self.config.cql})")
        if since is not None:
            parts.append(f'lastmodified >= "{since.strftime("%Y-%m-%d %H:%M")}"')
        return " AND ".join(parts) + " ORDER BY lastmodified ASC"

    async def changes(self, checkpoint: str | None, *, full: bool = False) -> AsyncIterator[ChangeBatch]:
        self._cache = _RunCache()
        since = None if full or not checkpoint else datetime.fromisoformat(checkpoint) - CHECKPOINT_OVERLAP
        latest = datetime.fromisoformat(checkpoint) if checkpoint and not full else None
        first = True
        async for page in self.client.search(self._cql(since), CONTENT_EXPAND):
            base = ((page.get("_links") or {}).get("base") or self.config.url).rstrip("/")
            batch = ChangeBatch(total=page.get("totalSize") if first else None)
            first = False
            for content in page.get("results") or []:
                when = _when(content)
                if when is not None and (latest is None or when > latest):
                    latest = when
                if content.get("type") == "attachment":
                    item = await self._attachment_item(content, base)
                    if item is not None:
                        batch.items.append(item)
                    continue
                if self._excluded(content):
                    batch.deleted.append(str(content["id"]))
                    continue
                batch.items.append(self._page_item(content, base))
            batch.checkpoint = latest.isoformat() if latest else None
            yield batch

    def _excluded(self, content: Mapping[str, Any]) -> bool:
        if not self.config.exclude_labels:
            return False
        labels = {label.get("name", "").lower() for label in _labels(content)}
        return bool(labels & {label.lower() for label in self.config.exclude_labels})

    def _page_item(self, content: Mapping[str, Any], base: str) -> SourceItem:
        body = ((content.get("body") or {}).get("storage") or {}).get("value") or ""
        title = content.get("title") or str(content["id"])
        markdown = f"# {title}\n\n" + storage_to_markdown(body)
        return SourceItem(
            external_id=str(content["id"]),
            filename=f"{content['id']}.md",
            read=lambda data=markdown.encode("utf-8"): data,
            title=title,
            url=_web_url(base, content),
            path=self._breadcrumb(content),
            author=_author(content),
            updated_at=_when(content),
            access=(),
            resolve_access=lambda: self.access_for(content),
            version=str((content.get("version") or {}).get("number", "")) or None,
        )

    async def _attachment_item(self, content: Mapping[str, Any], base: str) -> SourceItem | None:
        filename = content.get("title") or ""
        if PurePosixPath(filename).suffix.lower() not in ATTACHMENT_SUFFIXES:
            return None
        page = await self._container(content)
        if page is None or self._excluded(page):
            return None
        attachment_id = str(content["id"])
        page_id = str(page["id"])
        download = f"/rest/api/content/{page_id}/child/attachment/{attachment_id}/download"
        client = self.client

        async def fetch() -> bytes:
            try:
                return await client.download(download)
            except _NotFound:
                raise ItemUnavailable("the attachment was deleted during the sync") from None

        return SourceItem(
            external_id=attachment_id,
            filename=filename,
            read=fetch,
            title=filename,
            url=_web_url(base, content) or _web_url(base, page),
            path=f"{self._breadcrumb(page)} > {filename}",
            author=_author(content),
            updated_at=_when(content),
            access=(),
            resolve_access=lambda: self.access_for(page),
            version=str((content.get("version") or {}).get("number", "")) or None,
            parent_id=page_id,
        )

    async def _container(self, attachment: Mapping[str, Any]) -> dict[str, Any] | None:
        container = attachment.get("container") or {}
        page_id = str(container.get("id") or "")
        if not page_id:
            return None
        if page_id not in self._cache.containers:
            try:
                self._cache.containers[page_id] = await self.client.content(
                    page_id, "ancestors,space,metadata.labels,version")
            except _NotFound:
                return None
        return self._cache.containers[page_id]

    def _breadcrumb(self, content: Mapping[str, Any]) -> str:
        space = content.get("space") or {}
        parts = [space.get("name") or space.get("key") or ""]
        parts += [a.get("title", "") for a in content.get("ancestors") or []]
        parts.append(content.get("title") or "")
        return " > ".join(p for p in parts if p)

    # -- inventory (prune + permission re-check) --

    async def inventory(self) -> list[ItemRef] | None:
        self._cache = _RunCache()
        refs: list[ItemRef] = []
        attachments: list[dict[str, Any]] = []
        pages: dict[str, dict[str, Any]] = {}
        async for page in self.client.search(self._cql(None), INVENTORY_EXPAND, limit=100):
            for content in page.get("results") or []:
                if content.get("type") == "attachment":
                    if PurePosixPath(content.get("title") or "").suffix.lower() in ATTACHMENT_SUFFIXES:
                        attachments.append(content)
                elif not self._excluded(content):
                    pages[str(content["id"])] = content
        for page_id, content in pages.items():
            refs.append(ItemRef(page_id, await self.access_for(content) if self._checks_permissions else None))
        for content in attachments:
            container_id = str((content.get("container") or {}).get("id") or "")
            page = pages.get(container_id)
            if page is None:
                continue  # its page is out of scope or excluded: the attachment goes too
            refs.append(ItemRef(str(content["id"]), await self.access_for(page) if self._checks_permissions else None))
        return refs

    # -- permissions --

    @property
    def _checks_permissions(self) -> bool:
        return self.config.visibility == "permissions"

    async def access_for(self, content: Mapping[str, Any]) -> tuple[str, ...]:
        if not self._checks_permissions:
            return (EVERYONE,)
        space_key = (content.get("space") or {}).get("key") or ""
        access = await self._space_access(space_key)
        for ancestor in [*(content.get("ancestors") or []), content]:
            restricted = await self._restrictions(str(ancestor["id"]))
            if restricted is not None:
                access = _intersect(access, restricted)
        return access

    async def _restrictions(self, content_id: str) -> tuple[str, ...] | None:
        if content_id not in self._cache.restrictions:
            try:
                users, groups = await self.client.read_restrictions(content_id)
            except _NotFound:  # gone mid-sync: restricted to nobody until the next run settles it
                self._cache.restrictions[content_id] = ()
                return ()
            if not users and not groups:
                self._cache.restrictions[content_id] = None
            else:
                principals = [await self._user_principal(u) for u in users]
                principals += [self._group_principal(g.get("name") or "") for g in groups]
                self._cache.restrictions[content_id] = tuple(sorted(set(principals)))
        return self._cache.restrictions[content_id]

    async def _space_access(self, key: str) -> tuple[str, ...]:
        if key not in self._cache.space_access:
            principals: set[str] = set()
            if self.config.cloud:
                space = await self.client.space(key)
                async for page in self.client.paged(f"/api/v2/spaces/{space['id']}/permissions", {"limit": 250}):
                    for permission in page.get("results") or []:
                        operation = permission.get("operation") or {}
                        if operation.get("key") != "read" or operation.get("targetType") not in (None, "space"):
                            continue
                        principal = permission.get("principal") or {}
                        kind, ident = principal.get("type"), str(principal.get("id") or "")
                        if kind == "group":
                            principals.add(self._group_principal(await self._group_name(ident)))
                        elif kind == "user":
                            principals.add(await self._user_principal({"accountId": ident}))
                        elif kind == "anonymous":
                            principals.add(EVERYONE)
            else:
                for permission in await self.client.get(f"/rest/api/space/{key}/permissions"):
                    operation = permission.get("operation") or {}
                    if operation.get("operationKey") != "read" or operation.get("targetType") not in (None, "space"):
                        continue
                    subject = permission.get("subject") or {}
                    if subject.get("type") == "group":
                        principals.add(self._group_principal(subject.get("name") or ""))
                    elif subject.get("type") == "user":
                        principals.add(await self._user_principal(subject))
                    elif subject.get("type") == "anonymous":
                        principals.add(EVERYONE)
            self._cache.space_access[key] = (EVERYONE,) if EVERYONE in principals else tuple(sorted(principals))
        return self._cache.space_access[key]

    def _group_principal(self, name: str) -> str:
        if name.lower() == self.config.everyone_group.lower():
            return EVERYONE
        return f"group:{name}"

    async def _group_name(self, group_id: str) -> str:
        if group_id not in self._cache.groups:
            data = await self.client.get("/rest/api/group/by-id", {"id": group_id})
            self._cache.groups[group_id] = data.get("name") or group_id
        return self._cache.groups[group_id]

    async def _user_principal(self, user: Mapping[str, Any]) -> str:
        """`user:<email>` when Confluence shows it, else `user:confluence:<accountId|username>`."""
        if user.get("email"):
            return f"user:{str(user['email']).lower()}"
        key = str(user.get("accountId") or user.get("userKey") or user.get("username") or "")
        if key not in self._cache.users:
            params = {"accountId": key} if self.config.cloud else (
                {"key": key} if user.get("userKey") else {"username": key})
            try:
                found = await self.client.get("/rest/api/user", params)
            except _NotFound:
                found = {}
            if found.get("email"):
                self._cache.users[key] = f"user:{str(found['email']).lower()}"
            else:
                ident = found.get("accountId") or found.get("username") or user.get("username") or key
                self._cache.users[key] = f"user:confluence:{ident}"
        return self._cache.users[key]


def _intersect(allowed: Sequence[str], restricted: Sequence[str]) -> tuple[str, ...]:
    """Both must allow: `everyone` on one side yields the other side; otherwise exact principals in both."""
    if EVERYONE in allowed:
        return tuple(sorted(set(restricted)))
    if EVERYONE in restricted:
        return tuple(sorted(set(allowed)))
    return tuple(sorted(set(allowed) & set(restricted)))


def _labels(content: Mapping[str, Any]) -> list[dict[str, Any]]:
    return ((content.get("metadata") or {}).get("labels") or {}).get("results") or []


def _when(content: Mapping[str, Any]) -> datetime | None:
    value = (content.get("version") or {}).get("when")
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _author(content: Mapping[str, Any]) -> str | None:
    creator = (content.get("history") or {}).get("createdBy") or (content.get("version") or {}).get("by") or {}
    return creator.get("displayName") or creator.get("publicName") or None


def _web_url(base: str, content: Mapping[str, Any]) -> str | None:
    webui = (content.get("_links") or {}).get("webui")
    return base.rstrip("/") + webui if webui else None


@register_source("confluence")
def build_confluence_source(name: str, config: Mapping[str, Any]) -> ConfluenceSource:
    return ConfluenceSource(name, ConfluenceConfig.from_dict(config))


def describe(config: Mapping[str, Any]) -> str:
    """One line for `ragbot source list`."""
    parsed = ConfluenceConfig.from_dict(config)
    edition = "Cloud" if parsed.cloud else "Data Center"
    return f"{parsed.url} ({edition}) spaces {', '.join(parsed.spaces)}; visibility {parsed.visibility}"


__all__ = ["ConfluenceConfig", "ConfluenceClient", "ConfluenceSource", "RetryPolicy", "storage_to_markdown",
           "build_confluence_source"]
