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
Center); map chat identities to those with the bot's user map. Groups become `group:<source>/<name>`: a group name
is only unique within its own site, so it is scoped to this source's directory (knowledge.access) and never grants
what another source shared with a same-named group. Intersections are exact and fail closed: a principal
must appear at every restricted level (group membership is not expanded here), so a page restricted to individual
users inside a space readable only by some groups is visible to those users only if they also hold space access
directly or the space is open to everyone.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any, Literal
from urllib.parse import urljoin, urlsplit

import httpx
from bs4 import BeautifulSoup
from bs4.element import NavigableString
from markdownify import markdownify

from knowledge.access import EVERYONE, check_scope_name, fold_ascii, group_scope, scoped_group
from knowledge.errors import ItemUnavailable, SourceAuthError, SourceConfigError, SourceError, SourceUnavailable
from knowledge.sources.base import ChangeBatch, ItemRef, SourceItem, SourceSpec, bytes_read, register_source

logger = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "CONFLUENCE_API_TOKEN"
DEFAULT_EVERYONE_GROUP = "confluence-users"
PAGE_SIZE = 25
RESTRICTION_PAGE = 100
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
    def from_dict(cls, data: Mapping[str, Any]) -> ConfluenceConfig:
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
                    wait = (parsed - datetime.now(UTC)).total_seconds()
        if wait is None:
            wait = self.base_wait * (2 ** attempt) * (0.5 + random.random() / 2)
        return min(max(wait, 0.0), self.max_wait)


class ConfluenceHTTPError(SourceError):
    """An HTTP failure of one request, with its status and URL path. The message is one line naming the source,
    the path and the fix; `status` and `path` let callers decide how far it reaches (`space_scoped`: it concerns
    one space's listings, so the other spaces of the run go on)."""

    def __init__(self, message: str, *, status: int | None, path: str) -> None:
        super().__init__(message)
        self.status = status
        self.path = path

    @property
    def space_scoped(self) -> bool:
        return self.status is not None and self.status != 401


class ConfluenceNotFound(ConfluenceHTTPError, SourceConfigError):
    """404: a space, page or listing that does not exist (or is invisible to the account)."""


class ConfluenceAuthError(ConfluenceHTTPError, SourceAuthError):
    """401 (credentials refused: the whole run stops) or 403 (this listing is forbidden to the account)."""


class ConfluenceUnavailable(ConfluenceHTTPError, SourceUnavailable):
    """Unreachable, 5xx, or 429/503 past the retry bound."""


class ConfluenceBadRequest(ConfluenceHTTPError, SourceConfigError):
    """400 and other 4xx: Confluence refused the request itself (usually the extra CQL)."""


def _error_detail(response: httpx.Response) -> str:
    """The `message` of Confluence's documented error body `{"statusCode", "message", ...}`, first line, short."""
    try:
        body = response.json()
    except ValueError:
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    if not message and isinstance(body, dict) and isinstance(body.get("errors"), list) and body["errors"]:
        first = body["errors"][0]  # v2: {"errors": [{"status", "code", "title", "detail"}]}
        message = isinstance(first, dict) and (first.get("title") or first.get("detail"))
    return str(message or "").splitlines()[0][:200] if message else ""


def _truncated(block: Mapping[str, Any]) -> bool:
    """A restriction list that holds only the first part of its subjects."""
    size, limit = block.get("size"), block.get("limit")
    total = block.get("totalSize")
    return bool((block.get("_links") or {}).get("next")) or (total is not None and size is not None and total > size) \
        or (size is not None and bool(limit) and size >= limit)


_LINK_NEXT = re.compile(r'<([^>]+)>\s*;[^,]*\brel="?next"?')


def next_link(response: httpx.Response, data: Mapping[str, Any], site: str, base: str) -> str | None:
    """The absolute URL of the next page of a paged Confluence answer, or None on the last page.

    - v2 (Cloud, `/wiki/api/v2/...`): the `Link: <...>; rel="next"` header, else `_links.next`; both are relative
      to the SITE and already start with `/wiki` (Atlassian's REST v2 reference, "Pagination"), while the same
      answer's `_links.base` is `https://SITE/wiki`: joining onto the base would ask for `/wiki/wiki/...`.
    - v1 (Cloud and Data Center, `/rest/api/...`): `_links.next` is relative to `_links.base`, which already holds
      the context path (`/wiki`, or Data Center's own such as `/confluence`); Cloud's next carries a cursor, Data
      Center's a `start`.
    An absolute next URL is used as it is. A short page is never taken as the end: only a missing next is.
    `site` is scheme://host[:port]; `base` is the configured wiki URL (site + context path)."""
    header = response.headers.get("link")
    if header:
        match = _LINK_NEXT.search(header)
        if match:
            return urljoin(site + "/", str(match.group(1)))
    links = data.get("_links") if isinstance(data, Mapping) else None
    following: str | None = (links or {}).get("next")
    if not following:
        return None
    if following.startswith(("http://", "https://")):
        return following
    if "/api/v2/" in urlsplit(following).path:
        return site + following if following.startswith("/") else urljoin(site + "/", following)
    root = str((links or {}).get("base") or base).rstrip("/")
    return root + following if following.startswith("/") else root + "/" + following


class ConfluenceClient:
    """The handful of REST v1 (and Cloud v2) calls the source needs. Errors become typed `SourceError`s whose
    messages name the source, the URL path and the fix."""

    def __init__(self, source_name: str, config: ConfluenceConfig, token: str, *,
                 retry: RetryPolicy | None = None, max_connections: int = 4) -> None:
        self.name = source_name
        self.config = config
        self.base = config.url
        parts = urlsplit(config.url)
        self.site = f"{parts.scheme}://{parts.netloc}"
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
        """Absolute URLs as they are; `/api/v2/...` and `/rest/api/...` under the wiki's base URL."""
        return path if path.startswith(("http://", "https://")) else self.base + path

    async def request(self, path: str, params: Mapping[str, Any] | None = None) -> httpx.Response:
        """GET with the retry policy (429/503: Retry-After), every other failure a typed one-line error."""
        url = self.url(path)
        shown = urlsplit(url).path
        for attempt in range(self.retry.attempts):
            try:
                response = await self.http.get(url, params=params)
            except httpx.TransportError as exc:
                raise ConfluenceUnavailable(
                    f"source {self.name!r}: cannot reach Confluence at {self.base} ({type(exc).__name__}); "
                    "check the wiki URL and the network; the next sync retries", status=None, path=shown,
                ) from None
            status = response.status_code
            if status in (429, 503):
                if attempt + 1 < self.retry.attempts:
                    wait = self.retry.wait_for(response, attempt)
                    logger.info("%s: Confluence answered %s; retrying in %.1fs", self.name, status, wait)
                    await asyncio.sleep(wait)
                    continue
                raise ConfluenceUnavailable(
                    f"source {self.name!r}: Confluence kept answering {status} (rate limited or unavailable) for "
                    f"{shown} after {self.retry.attempts} attempts, honouring Retry-After; the next sync retries",
                    status=status, path=shown,
                )
            if status < 400:
                return response
            raise self._error(response, shown)
        raise AssertionError("unreachable")

    def _error(self, response: httpx.Response, path: str) -> ConfluenceHTTPError:
        status = response.status_code
        detail = _error_detail(response)
        said = f" ({detail})" if detail else ""
        if status in (401, 403):
            return ConfluenceAuthError(self._auth_message(status, path), status=status, path=path)
        if status == 404:
            return ConfluenceNotFound(
                f"source {self.name!r}: Confluence answered 404 for {path}; check the space key (the KEY, not its "
                f"name) and the wiki URL, and that the account can see it", status=status, path=path)
        if status >= 500:
            return ConfluenceUnavailable(
                f"source {self.name!r}: Confluence answered {status} (a server error) for {path}{said}; retry "
                f"later (the next sync retries)", status=status, path=path)
        fix = "check the source's extra CQL" if "search" in path and self.config.cql else "check the source's settings"
        return ConfluenceBadRequest(
            f"source {self.name!r}: Confluence refused the request ({status}) for {path}{said}; {fix}",
            status=status, path=path)

    async def get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return (await self.request(path, params)).json()

    def _auth_message(self, status: int, path: str) -> str:
        if status == 403:
            return (f"source {self.name!r}: Confluence denied access (403) to {path}; give the account "
                    f"{self.config.email or 'of the token'} permission to view the space (and its permissions), "
                    "or remove the space from the source")
        if self.config.cloud:
            fix = (f"check that {self.config.token_env} holds a current API token of {self.config.email} "
                   "(id.atlassian.com → Security → API tokens)")
        else:
            fix = (f"check that {self.config.token_env} holds a valid personal access token "
                   "(Profile → Personal Access Tokens); for Cloud, add the account's email")
        return f"source {self.name!r}: Confluence refused the credentials (401); {fix}"

    async def paged(self, path: str, params: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Each page of a paged listing, following the next link (see `next_link`) until there is none."""
        response = await self.request(path, params)
        while True:
            data = response.json()
            yield data
            following = next_link(response, data, self.site, self.base)
            if not following:
                return
            response = await self.request(following)

    async def search(self, cql: str, expand: str, limit: int = PAGE_SIZE) -> AsyncIterator[dict[str, Any]]:
        async for page in self.paged("/rest/api/content/search", {"cql": cql, "expand": expand, "limit": limit}):
            yield page

    async def space(self, key: str) -> dict[str, Any]:
        space: dict[str, Any] = await self.get(f"/rest/api/space/{key}")
        return space

    async def content(self, content_id: str, expand: str) -> dict[str, Any]:
        content: dict[str, Any] = await self.get(f"/rest/api/content/{content_id}", {"expand": expand})
        return content

    async def read_restrictions(self, content_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The read restrictions (users, groups) of one page. `/restriction/byOperation` has no paging of its own;
        when either list there is cut at its `limit` (or `totalSize` says more), the complete lists come from
        `/restriction/byOperation/read`, which pages users and groups together by `start`/`limit` (Atlassian's
        REST v1 reference, "Content restrictions": Get restrictions by operation / for operation)."""
        path = f"/rest/api/content/{content_id}/restriction/byOperation"
        data = await self.get(path, {"expand": "read.restrictions.user,read.restrictions.group"})
        restrictions = (data.get("read") or {}).get("restrictions") or {}
        users = list((restrictions.get("user") or {}).get("results") or [])
        groups = list((restrictions.get("group") or {}).get("results") or [])
        if not any(_truncated(restrictions.get(kind) or {}) for kind in ("user", "group")):
            return users, groups
        users, groups, start = [], [], 0
        while True:
            page = await self.get(f"{path}/read", {"expand": "restrictions.user,restrictions.group",
                                                   "start": start, "limit": RESTRICTION_PAGE})
            blocks = page.get("restrictions") or {}
            got_users = (blocks.get("user") or {}).get("results") or []
            got_groups = (blocks.get("group") or {}).get("results") or []
            users.extend(got_users)
            groups.extend(got_groups)
            step = int((blocks.get("user") or {}).get("limit") or RESTRICTION_PAGE)
            if len(got_users) < step and len(got_groups) < step:
                return users, groups
            start += step

    async def download(self, path: str) -> bytes:
        try:
            return (await self.request(path)).content
        except ConfluenceNotFound:
            raise ItemUnavailable("the attachment was deleted during the sync") from None
        except ConfluenceAuthError as exc:
            if exc.status == 401:
                raise
            raise ItemUnavailable(f"download refused ({exc.status})") from None


# --- storage format → Markdown -------------------------------------------------------------------------------


def storage_to_markdown(storage: str) -> str:
    """Confluence storage XHTML → Markdown. Macros become plain HTML first (code → <pre>, panels → a quoted
    block with its kind, expand → its title and body), links and images keep their text, then markdownify."""
    soup = BeautifulSoup(storage, "html.parser")
    for macro in reversed(soup.find_all("ac:structured-macro")):
        name = str(macro.get("ac:name") or "").lower()
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
        link.replace_with(NavigableString(str(text)))
    for tag in soup.find_all(["ac:image", "ac:emoticon", "ac:placeholder"]):
        tag.decompose()
    for tag in soup.find_all(re.compile(r"^(ac|ri):")):
        tag.unwrap()
    return markdownify(str(soup), heading_style="ATX", bullets="-", code_language_callback=_code_language).strip() + "\n"


def _code_language(element: Any) -> str | None:
    for cls in element.get("class") or (element.code.get("class") if element.code else None) or []:
        if cls.startswith("language-"):
            return str(cls[len("language-"):])
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
            except ConfluenceNotFound:
                raise SourceConfigError(
                    f"source {self.spec.name!r}: space {key!r} was not found at {self.config.url} or this account "
                    "cannot see it; check the source's spaces (each a space KEY, not its name) and the account's permissions"
                ) from None

    # -- parts: a first sync split across workers (knowledge.ingest.split) --

    def parts(self) -> list[str]:
        """The units a first sync can be split into: the source's spaces (each already listed on its own, from its
        own checkpoint). One space is one unit."""
        return list(self.config.spaces)

    def part(self, unit: str) -> ConfluenceSource:
        """The source limited to one space: the same content ids and access (the space's permissions apply)."""
        if unit not in self.config.spaces:
            raise FileNotFoundError(f"space {unit!r} is no longer part of source {self.spec.name!r}")
        return ConfluenceSource(self.spec.name, replace(self.config, spaces=(unit,)), retry=self.retry)

    # -- changes --

    def _cql(self, since: datetime | None, spaces: Sequence[str] | None = None) -> str:
        keys = ", ".join(f'"{key}"' for key in (spaces if spaces is not None else self.config.spaces))
        parts = [f"space in ({keys})", "type in (page, blogpost, attachment)"]
        if self.config.cql:
            parts.insert(0, f"({self.config.cql})")
        if since is not None:
            parts.append(f'lastmodified >= "{since.strftime("%Y-%m-%d %H:%M")}"')
        return " AND ".join(parts) + " ORDER BY lastmodified ASC"

    async def changes(self, checkpoint: str | None, *, full: bool = False) -> AsyncIterator[ChangeBatch]:
        """Space by space, each from its own checkpoint. A space whose listing fails (404, 403, a server error,
        a rate-limit storm past the bound) is reported at the end, in one line naming the source, the space and
        the URL path, after the other spaces are synced; its checkpoint stays where its committed work is. A 401
        or an unreachable host stops the run at once."""
        self._cache = _RunCache()
        marks = {} if full else _space_checkpoints(checkpoint, self.config.spaces)
        failures: list[ConfluenceHTTPError] = []
        single = len(self.config.spaces) == 1
        for key in self.config.spaces:
            try:
                if self._checks_permissions:
                    await self._space_access(key)  # a listing that fails here fails this space only
                async for batch in self._space_changes(key, marks, total=single):
                    yield batch
            except ConfluenceHTTPError as exc:
                if not exc.space_scoped:
                    raise
                failures.append(_for_space(exc, self.spec.name, key))
                logger.warning("%s", failures[-1])
        if failures:
            first = failures[0]
            more = f" (and {len(failures) - 1} more space(s) failed)" \
                if len(failures) > 1 else ""
            raise type(first)(str(first) + more, status=first.status, path=first.path)

    async def _space_changes(self, key: str, marks: dict[str, str], *, total: bool) -> AsyncIterator[ChangeBatch]:
        mark = marks.get(key)
        since = datetime.fromisoformat(mark) - CHECKPOINT_OVERLAP if mark else None
        latest = datetime.fromisoformat(mark) if mark else None
        first = True
        async for page in self.client.search(self._cql(since, [key]), CONTENT_EXPAND):
            base = ((page.get("_links") or {}).get("base") or self.config.url).rstrip("/")
            batch = ChangeBatch(total=page.get("totalSize") if first and total else None)
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
            if latest is not None:
                marks[key] = latest.isoformat()
                batch.checkpoint = json.dumps({"spaces": marks}, sort_keys=True)
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
            read=bytes_read(markdown.encode("utf-8")),
            title=title,
            url=_web_url(base, content),
            path=self._breadcrumb(content),
            author=_author(content),
            updated_at=_when(content),
            access=(),
            resolve_access=lambda: self._item_access(content),
            version=str((content.get("version") or {}).get("number", "")) or None,
        )

    async def _attachment_item(self, content: Mapping[str, Any], base: str) -> SourceItem | None:
        filename = content.get("title") or ""
        if PurePosixPath(filename).suffix.lower() not in ATTACHMENT_SUFFIXES:
            return None
        try:
            page = await self._container(content)
        except ConfluenceNotFound as exc:
            return _unavailable_item(content, f"its page was deleted during the sync (404 for {exc.path})")
        if page is None or self._excluded(page):
            return None
        attachment_id = str(content["id"])
        page_id = str(page["id"])
        download = f"/rest/api/content/{page_id}/child/attachment/{attachment_id}/download"
        client = self.client

        async def fetch() -> bytes:
            return await client.download(download)  # 404 / 403: ItemUnavailable, the item is recorded

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
            resolve_access=lambda: self._item_access(page),
            version=str((content.get("version") or {}).get("number", "")) or None,
            parent_id=page_id,
        )

    async def _container(self, attachment: Mapping[str, Any]) -> dict[str, Any] | None:
        container = attachment.get("container") or {}
        page_id = str(container.get("id") or "")
        if not page_id:
            return None
        if page_id not in self._cache.containers:  # a 404 propagates: the caller records the attachment
            self._cache.containers[page_id] = await self.client.content(
                page_id, "ancestors,space,metadata.labels,version")
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
        if self._checks_permissions:
            for key in self.config.spaces:
                try:
                    await self._space_access(key)
                except ConfluenceHTTPError as exc:  # the run fails and nothing is pruned; the message names the space
                    raise _for_space(exc, self.spec.name, key) from None
        async for page in self.client.search(self._cql(None), INVENTORY_EXPAND, limit=100):
            for content in page.get("results") or []:
                if content.get("type") == "attachment":
                    if PurePosixPath(content.get("title") or "").suffix.lower() in ATTACHMENT_SUFFIXES:
                        attachments.append(content)
                elif not self._excluded(content):
                    pages[str(content["id"])] = content
        access: dict[str, tuple[str, ...] | None] = {}
        for page_id, content in pages.items():
            try:
                access[page_id] = await self.access_for(content) if self._checks_permissions else None
            except ConfluenceNotFound:  # deleted since the listing: left out, so the prune removes it
                continue
            refs.append(ItemRef(page_id, access[page_id]))
        for content in attachments:
            container_id = str((content.get("container") or {}).get("id") or "")
            if container_id not in access:
                continue  # its page is out of scope, excluded or gone: the attachment goes too
            refs.append(ItemRef(str(content["id"]), access[container_id]))
        return refs

    # -- permissions --

    @property
    def _checks_permissions(self) -> bool:
        return self.config.visibility == "permissions"

    async def _item_access(self, content: Mapping[str, Any]) -> tuple[str, ...]:
        """`access_for` for an item being indexed: a 404 on the way means the page went away mid-sync, so the item
        is skipped and recorded (ItemUnavailable), not the run."""
        try:
            return await self.access_for(content)
        except ConfluenceNotFound as exc:
            raise ItemUnavailable(f"deleted during the sync (404 for {exc.path})") from None

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
            users, groups = await self.client.read_restrictions(content_id)  # 404: gone, the caller decides
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

    async def space_groups(self, key: str) -> dict[str, str | None]:
        """The groups with read permission on a space (name → Cloud group id, None on Data Center): whose members
        the group directory fetches (knowledge.sources.confluence_groups)."""
        access = await self._space_access(key)
        ids = {name: group_id for group_id, name in self._cache.groups.items()}
        names = [group_scope(p)[1] for p in access if p.startswith(self.group_prefix)]
        return {name: ids.get(name) for name in names}

    @property
    def group_prefix(self) -> str:
        """What every group principal of this source starts with (`group:<source>/`)."""
        return scoped_group(self.spec.name, "")

    def _group_principal(self, name: str) -> str:
        if name.lower() == self.config.everyone_group.lower():
            return EVERYONE
        return scoped_group(self.spec.name, name)

    async def _group_name(self, group_id: str) -> str:
        if group_id not in self._cache.groups:
            try:
                data = await self.client.get("/rest/api/group/by-id", {"id": group_id})
            except ConfluenceNotFound:  # deleted group: its id matches nobody, so access stays closed
                data = {}
            self._cache.groups[group_id] = data.get("name") or group_id
        return self._cache.groups[group_id]

    async def _user_principal(self, user: Mapping[str, Any]) -> str:
        """`user:<email>` when Confluence shows it, else `user:confluence:<accountId|username>`."""
        if user.get("email"):
            return f"user:{fold_ascii(str(user['email']))}"
        key = str(user.get("accountId") or user.get("userKey") or user.get("username") or "")
        if key not in self._cache.users:
            params = {"accountId": key} if self.config.cloud else (
                {"key": key} if user.get("userKey") else {"username": key})
            try:
                found = await self.client.get("/rest/api/user", params)
            except ConfluenceNotFound:
                found = {}
            if found.get("email"):
                self._cache.users[key] = f"user:{fold_ascii(str(found['email']))}"
            else:
                ident = found.get("accountId") or found.get("username") or user.get("username") or key
                self._cache.users[key] = f"user:confluence:{ident}"
        return self._cache.users[key]


def _unavailable_item(content: Mapping[str, Any], reason: str) -> SourceItem:
    """An item that cannot be indexed this run: the sync records it as failed with `reason` and goes on."""

    async def read() -> bytes:
        raise ItemUnavailable(reason)

    return SourceItem(external_id=str(content["id"]), filename=content.get("title") or f"{content['id']}.txt",
                      read=read, title=content.get("title"), access=(), version=None)


def _space_checkpoints(checkpoint: str | None, spaces: Sequence[str]) -> dict[str, str]:
    """The per-space checkpoints: `{"spaces": {KEY: iso time}}`; an older single time applies to every space."""
    if not checkpoint:
        return {}
    if checkpoint.lstrip().startswith("{"):
        data = json.loads(checkpoint)
        return {str(k): str(v) for k, v in (data.get("spaces") or {}).items() if k in spaces}
    return {key: checkpoint for key in spaces}


def _for_space(exc: ConfluenceHTTPError, source: str, key: str) -> ConfluenceHTTPError:
    """The same error, its message naming the space: "source 'wiki', space 'HR': Confluence answered ..."."""
    message = str(exc)
    prefix = f"source {source!r}: "
    message = (f"source {source!r}, space {key!r}: " + message[len(prefix):]) if message.startswith(prefix) \
        else f"source {source!r}, space {key!r}: {message}"
    return type(exc)(message, status=exc.status, path=exc.path)


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
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _author(content: Mapping[str, Any]) -> str | None:
    creator = (content.get("history") or {}).get("createdBy") or (content.get("version") or {}).get("by") or {}
    return creator.get("displayName") or creator.get("publicName") or None


def _web_url(base: str, content: Mapping[str, Any]) -> str | None:
    webui = (content.get("_links") or {}).get("webui")
    return base.rstrip("/") + webui if webui else None


@register_source("confluence")
def build_confluence_source(name: str, config: Mapping[str, Any]) -> ConfluenceSource:
    if (problem := check_scope_name(name)) is not None:
        raise SourceConfigError(problem)
    return ConfluenceSource(name, ConfluenceConfig.from_dict(config))


def describe(config: Mapping[str, Any]) -> str:
    """One line for `ragbot source list`."""
    parsed = ConfluenceConfig.from_dict(config)
    edition = "Cloud" if parsed.cloud else "Data Center"
    return f"{parsed.url} ({edition}) spaces {', '.join(parsed.spaces)}; visibility {parsed.visibility}"


__all__ = ["ConfluenceConfig", "ConfluenceClient", "ConfluenceSource", "RetryPolicy", "storage_to_markdown",
           "build_confluence_source"]
