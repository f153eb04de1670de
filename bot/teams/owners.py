"""Team owners, read from Microsoft Graph: in a team's channel, a team owner is a `kb` admin (issue 42).

The Bot Connector's roster does not say who owns a team; Microsoft Graph does:

- "List members of team" (learn.microsoft.com/graph/api/team-list-members): `GET /v1.0/teams/{team-id}/members`
  returns conversationMember objects, paged by `@odata.nextLink` (default page 100, `$top` up to 999); an owner has
  `"roles": ["owner"]`, and an aadUserConversationMember's `userId` is the user's Entra object id (the activity's
  `from.aadObjectId`). The team id is the team's Microsoft 365 group id: the activity's `channelData.team.aadGroupId`
  (`channelData.team.id` is the 19:… thread id, which Graph does not take).
- The app reads it with an app-only token: "Microsoft identity platform and the OAuth 2.0 client credentials flow"
  (learn.microsoft.com/entra/identity-platform/v2-oauth2-client-creds-grant-flow): `POST
  {login}/{tenant}/oauth2/v2.0/token` with client_id, client_secret, scope `https://graph.microsoft.com/.default`
  and grant_type client_credentials, for the tenant the team is in.
- Permission: the resource-specific consent (RSC) application permission `TeamMember.Read.Group`, declared in
  teams-manifest/manifest.json and granted per team when the app is installed there ("Resource-specific consent",
  learn.microsoft.com/microsoftteams/platform/graph-api/rsc/resource-specific-consent). Without it Graph answers
  403: nobody is a team owner then (fail closed), one warning says how to fix it, and ADMIN_USER_IDS still works.

The owner set of each team is cached for `ttl_seconds` (a team owner added or removed is seen within that time).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx

from bot.chat.cache import BoundedCache

logger = logging.getLogger(__name__)

GRAPH_SCOPE = "https://graph.microsoft.com/.default"
PAGE_SIZE = 999  # "List members of team": the largest page `$top` may ask for
MAX_PAGES = 100  # a team holds at most 25,000 members: 26 pages of 999; more means a loop
TOKEN_MARGIN_SECONDS = 300  # a token is renewed this long before it expires
FIX = ("grant the app's TeamMember.Read.Group consent: reinstall the Teams app in that team (its manifest asks "
       "for it; see docs/teams.md)")


class GraphError(Exception):
    """Microsoft Graph or the token endpoint refused or failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class TeamOwners:
    """Who owns a team, by the team's group id: a set of Entra object ids, cached; an empty set when Graph cannot
    tell (fail closed), with one warning per team and cache period naming the fix."""

    def __init__(self, *, app_id: str, app_password: str, default_tenant: str | None, graph_base_url: str,
                 login_base_url: str, ttl_seconds: float, max_teams: int = 1_000, timeout: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app_id = app_id
        self._password = app_password
        self.default_tenant = default_tenant
        self.graph = graph_base_url.rstrip("/")
        self.login = login_base_url.rstrip("/")
        self.timeout = timeout
        self._clock = clock
        self._owners: BoundedCache[tuple[str, str], frozenset[str]] = BoundedCache(max_teams, ttl_seconds)
        self._tokens: dict[str, tuple[str, float]] = {}  # tenant -> (access token, expires at)
        # One Graph read at a time (kb commands are rare): two commands at once in a team read its owners once.
        self._reading = asyncio.Lock()

    async def is_owner(self, team_group_id: str, user_object_id: str, tenant_id: str | None) -> bool:
        """Is this Entra user an owner of this team? False when Graph refuses or fails (logged, not raised)."""
        tenant = tenant_id or self.default_tenant
        if not tenant or tenant == "common":
            logger.warning("Teams: cannot tell team owners without the team's tenant id: set TEAMS_TENANT_ID")
            return False
        return user_object_id in await self.owners(team_group_id, tenant)

    async def owners(self, team_group_id: str, tenant: str) -> frozenset[str]:
        """The team's owners, from the cache or from Graph. A 403 (no consent) is cached too, as an empty set for
        the TTL: a team without the consent costs one request and one warning per period, not one per command;
        another failure (Graph unreachable, 5xx) is not cached: the next command asks again."""
        key = (tenant, team_group_id)
        cached = self._owners.get(key)
        if cached is not None:
            return cached
        async with self._reading:
            cached = self._owners.get(key)
            if cached is not None:
                return cached
            try:
                found = await self._read_owners(team_group_id, tenant)
            except GraphError as exc:
                if exc.status != 403:
                    logger.warning("Teams: could not read the owners of team %s from Microsoft Graph (%s), so they "
                                   "are not admins for now; ADMIN_USER_IDS still applies", team_group_id, exc)
                    return frozenset()
                logger.warning("Teams: Microsoft Graph refused to list the members of team %s (403 %s), so its "
                               "owners are not admins; to fix, %s", team_group_id, exc, FIX)
                found = frozenset()
            self._owners.put(key, found)
            return found

    async def _read_owners(self, team_group_id: str, tenant: str) -> frozenset[str]:
        token = await self._token(tenant)
        owners: set[str] = set()
        url: str | None = f"{self.graph}/v1.0/teams/{team_group_id}/members"
        params: dict[str, str] | None = {"$top": str(PAGE_SIZE)}
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            for _ in range(MAX_PAGES):
                if url is None:
                    return frozenset(owners)
                try:
                    response = await client.get(url, params=params, headers={"Authorization": f"Bearer {token}"})
                except httpx.HTTPError as exc:
                    raise GraphError(0, f"{type(exc).__name__}: {exc}") from exc
                if response.status_code != 200:
                    raise GraphError(response.status_code, _graph_error(response))
                page = response.json()
                for member in page.get("value") or []:
                    roles = [str(r).lower() for r in member.get("roles") or []]
                    if "owner" in roles and member.get("userId"):
                        owners.add(str(member["userId"]))
                url, params = page.get("@odata.nextLink"), None  # the next link carries its own query
        raise GraphError(0, f"more than {MAX_PAGES} pages of members")

    async def _token(self, tenant: str) -> str:
        """An app-only Graph token for `tenant` (client credentials), reused until shortly before it expires."""
        held = self._tokens.get(tenant)
        if held is not None and held[1] > self._clock():
            return held[0]
        form = {"client_id": self.app_id, "client_secret": self._password, "scope": GRAPH_SCOPE,
                "grant_type": "client_credentials"}
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await client.post(f"{self.login}/{tenant}/oauth2/v2.0/token", data=form)
        except httpx.HTTPError as exc:
            raise GraphError(0, f"token request failed: {type(exc).__name__}") from exc
        if response.status_code != 200:
            try:
                error = response.json().get("error") or "error"
            except ValueError:
                error = "error"
            raise GraphError(response.status_code, f"token request refused: {error}")  # never the secret
        body = response.json()
        token = str(body["access_token"])
        lifetime = float(body.get("expires_in") or 0)
        self._tokens[tenant] = (token, self._clock() + max(lifetime - TOKEN_MARGIN_SECONDS, 0))
        return token


def _graph_error(response: httpx.Response) -> str:
    """Graph's error, `{"error": {"code", "message"}}` ("Microsoft Graph error responses and resource types")."""
    try:
        error = response.json().get("error") or {}
        return f"{error.get('code') or response.status_code}: {error.get('message') or ''}".strip(": ")
    except ValueError:
        return str(response.status_code)
