"""Team owners, read from Microsoft Graph: in a team's channel, a team owner is a `kb` admin (issue 42).

The Bot Connector's roster does not say who owns a team; Microsoft Graph does:

- "List members of team" (learn.microsoft.com/graph/api/team-list-members): `GET /v1.0/teams/{team-id}/members`
  returns conversationMember objects, paged by `@odata.nextLink` (default page 100, `$top` up to 999); an owner has
  `"roles": ["owner"]`, and an aadUserConversationMember's `userId` is the user's Entra object id (the activity's
  `from.aadObjectId`). The team id is the team's Microsoft 365 group id: the activity's `channelData.team.aadGroupId`
  (`channelData.team.id` is the 19:… thread id, which Graph does not take).
- The app reads it with an app-only token: "Microsoft identity platform and the OAuth 2.0 client credentials flow"
  (learn.microsoft.com/entra/identity-platform/v2-oauth2-client-creds-grant-flow), scope
  `https://graph.microsoft.com/.default`, for the tenant the team is in. The Agents SDK's token provider fetches it
  (`MsalAuth.get_access_token`, the one that signs the bot in to the Bot Connector: MSAL finds the token endpoint in
  the tenant's OpenID configuration at `{login}/{tenant}`, caches the token and renews it before it expires). MSAL
  accepts only an https authority on a host it knows (or an instance-discovery round trip to
  login.microsoftonline.com), so a test reaches its fake identity platform as the SDK's own sign-in does: through
  HTTPS_PROXY with the fake's CA trusted (tests/fakes/teams_connector.py), not through TEAMS_LOGIN_BASE_URL.
- Permission: the resource-specific consent (RSC) application permission `TeamMember.Read.Group`, declared in
  teams-manifest/manifest.json and granted per team when the app is installed there ("Resource-specific consent",
  learn.microsoft.com/microsoftteams/platform/graph-api/rsc/resource-specific-consent). Without it Graph answers
  403: nobody is a team owner then (fail closed), one warning says how to fix it, and ADMIN_USER_IDS still works.

The owner set of each team is cached for `ttl_seconds` (a team owner added or removed is seen within that time).
"""

from __future__ import annotations

import asyncio
import logging

import httpx
from microsoft_agents.authentication.msal import MsalAuth
from microsoft_agents.hosting.core import AgentAuthConfiguration
from microsoft_agents.hosting.core.authorization import AuthTypes

from bot.chat.cache import BoundedCache

logger = logging.getLogger(__name__)

GRAPH_RESOURCE = "https://graph.microsoft.com"
GRAPH_SCOPE = f"{GRAPH_RESOURCE}/.default"
PAGE_SIZE = 999  # "List members of team": the largest page `$top` may ask for
MAX_PAGES = 100  # a team holds at most 25,000 members: 26 pages of 999; more means a loop
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
                 login_base_url: str, ttl_seconds: float, max_teams: int = 1_000, timeout: float = 10.0) -> None:
        self.app_id = app_id
        self._password = app_password
        self.default_tenant = default_tenant
        self.graph = graph_base_url.rstrip("/")
        self.login = login_base_url.rstrip("/")
        self.timeout = timeout
        self._owners: BoundedCache[tuple[str, str], frozenset[str]] = BoundedCache(max_teams, ttl_seconds)
        self._auth: BoundedCache[str, MsalAuth] = BoundedCache(max_teams)  # tenant -> its token provider
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
        """An app-only Graph token for `tenant`, from the SDK's token provider for that tenant (MSAL reuses a token
        until shortly before it expires). MSAL blocks (it reads the tenant's OpenID configuration when its client is
        made, then posts to the token endpoint), so it runs in a worker thread with its own loop, bounded by
        `timeout`: a slow sign-in host never stalls the bot's loop. What fails is raised as GraphError, whatever
        raised it: MsalAuth's ValueError carries the endpoint's refusal (never the secret), and after a refusal MSAL
        may raise its own MsalServiceError from a follow-up call (its instance-discovery lookup of host aliases)."""
        auth = self._auth.get(tenant)
        if auth is None:
            auth = MsalAuth(AgentAuthConfiguration(auth_type=AuthTypes.client_secret, client_id=self.app_id,
                                                   client_secret=self._password, tenant_id=tenant,
                                                   authority=f"{self.login}/{tenant}"))
            self._auth.put(tenant, auth)

        def fetch() -> str:
            return asyncio.run(auth.get_access_token(GRAPH_RESOURCE, [GRAPH_SCOPE]))

        try:
            return await asyncio.wait_for(asyncio.to_thread(fetch), self.timeout)
        except TimeoutError as exc:
            raise GraphError(0, f"no token from {self.login} within {self.timeout:g} s") from exc
        except Exception as exc:  # noqa: BLE001 - any failure of the SDK, MSAL or requests: fail closed (no secret)
            raise GraphError(0, f"token request failed: {_first_line(exc)}") from exc


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def _graph_error(response: httpx.Response) -> str:
    """Graph's error, `{"error": {"code", "message"}}` ("Microsoft Graph error responses and resource types")."""
    try:
        error = response.json().get("error") or {}
        return f"{error.get('code') or response.status_code}: {error.get('message') or ''}".strip(": ")
    except ValueError:
        return str(response.status_code)
