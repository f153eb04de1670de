"""A fake Microsoft Graph "List members of team", on a plain-HTTP server on 127.0.0.1 (the bot's
TEAMS_GRAPH_BASE_URL points at `url`), served from a thread with its own event loop (tests/fakes/server.py).

Its app-only tokens come from the Microsoft identity platform, which the fake Bot Connector serves
(tests/fakes/teams_connector.py: the SDK's MSAL reaches it through HTTPS_PROXY, for the bot's own token as for this
one): a token is valid here if that identity platform issued it for scope `https://graph.microsoft.com/.default`
(`tokens`: access token -> the tenant it was issued for), as Graph accepts only a token whose audience is Graph.

Built from Microsoft's references only:

- "List members of team" (learn.microsoft.com/graph/api/team-list-members): `GET /v1.0/teams/{team-id}/members`
  with `Authorization: Bearer`; the only query parameters it supports are `$filter`, `$select` and `$top` (default
  page 100, at most 999), and a next page is `@odata.nextLink`, an opaque URL the client calls as it is. A
  member is an aadUserConversationMember ("aadUserConversationMember resource type": id, roles, displayName,
  visibleHistoryStartDateTime, userId, email, tenantId); an owner has `roles: ["owner"]`, a member `[]`, a guest
  `["guest"]`. The permission is TeamMember.Read.Group (resource-specific consent, per team): a team whose
  consent was not given (`add_team(..., consented=False)`) answers 403, a team id that is not a team 404, a
  missing or foreign token 401, in Graph's error shape `{"error": {"code", "message"}}` ("Microsoft Graph error
  responses and resource types").

This fake does not implement `$filter` and `$select` (the bot does not send them): they are answered 400 so that a
change that starts sending them fails here rather than passing untested; any other parameter is 400 too, as Graph
answers an unknown OData option. Pages hold `page_size` members (default 2, below `$top`: the server may always
send fewer), so paging is always exercised.

    with FakeGraph(connector.tenant_id, connector.graph_tokens) as graph:
        graph.add_team(group_id, owners=[OWNER], members=[ANN, ADMIN])
        ... TeamsSettings(graph_base_url=graph.url) ...
        graph.requests       # (method, path, query) of every call
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode

from aiohttp import web

from fakes.server import AiohttpServer

MAX_TOP = 999


class Person(Protocol):
    aad_object_id: str
    name: str
    email: str | None


@dataclass
class Team:
    group_id: str
    tenant_id: str
    members: list[tuple[Person, list[str]]] = field(default_factory=list)  # (person, roles)
    consented: bool = True


class FakeGraph(AiohttpServer):
    def __init__(self, tenant_id: str, tokens: Mapping[str, str], *, page_size: int = 2) -> None:
        super().__init__()
        self.tenant_id = tenant_id
        self.tokens = tokens  # the identity platform's Graph tokens, read live: access token -> tenant
        self.page_size = page_size
        self.teams: dict[str, Team] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    def add_team(self, group_id: str, *, owners: list[Any] = (), members: list[Any] = (),  # type: ignore[assignment]
                 guests: list[Any] = (), consented: bool = True) -> Team:  # type: ignore[assignment]
        """A team: its owners, members and guests, in that order (so owners come first, and with `page_size` 2 a
        later member is on a later page: put the person a test looks for last to make it follow nextLink)."""
        team = Team(group_id, self.tenant_id, [(p, ["owner"]) for p in owners] + [(p, []) for p in members]
                    + [(p, ["guest"]) for p in guests], consented)
        self.teams[group_id] = team
        return team

    def member_calls(self, group_id: str) -> int:
        return sum(1 for _, path, _ in self.requests if path == f"/v1.0/teams/{group_id}/members")

    # ---- Microsoft Graph -----------------------------------------------------------------------------------------

    async def _members(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.requests.append((request.method, request.path, query))
        header = request.headers.get("Authorization", "")
        tenant = self.tokens.get(header[7:]) if header.startswith("Bearer ") else None
        if tenant is None:
            return _graph_error(401, "InvalidAuthenticationToken", "Access token is empty or invalid.")
        # $skiptoken is this fake's own, inside the nextLink it hands out (opaque to the client).
        unknown = set(query) - {"$top", "$skiptoken"}
        if unknown:
            return _graph_error(400, "BadRequest", f"Query option(s) {sorted(unknown)} not supported by this fake")
        try:
            top = int(query.get("$top", "100"))
            start = int(query.get("$skiptoken", "0"))
        except ValueError:
            return _graph_error(400, "BadRequest", "Invalid $top or $skiptoken")
        if not 1 <= top <= MAX_TOP:
            return _graph_error(400, "BadRequest", f"$top must be between 1 and {MAX_TOP}")
        team = self.teams.get(request.match_info["team"])
        if team is None or team.tenant_id != tenant:
            return _graph_error(404, "NotFound", "No team found with Group Id " + request.match_info["team"])
        if not team.consented:
            return _graph_error(403, "Forbidden", "Missing role permissions on the request. API requires one of "
                                "'TeamMember.Read.Group, TeamMember.Read.All, TeamMember.ReadWrite.All'. Roles on "
                                "the request ''. Resource specific consent grants on the request ''.")
        size = min(top, self.page_size)
        window = team.members[start:start + size]
        body: dict[str, Any] = {
            "@odata.context": f"https://graph.microsoft.com/v1.0/$metadata#teams('{team.group_id}')/members",
            "value": [self._member(team, person, roles) for person, roles in window],
        }
        if start + size < len(team.members):
            body["@odata.nextLink"] = (f"{self.url}{request.path}?"
                                       + urlencode({"$top": str(top), "$skiptoken": str(start + size)}))
        return web.json_response(body)

    @staticmethod
    def _member(team: Team, person: Person, roles: list[str]) -> dict[str, Any]:
        return {"@odata.type": "#microsoft.graph.aadUserConversationMember",
                "id": f"MCMjMSMj{team.group_id}##{person.aad_object_id}", "roles": list(roles),
                "displayName": person.name, "visibleHistoryStartDateTime": "0001-01-01T00:00:00Z",
                "userId": person.aad_object_id, "email": person.email, "tenantId": team.tenant_id}

    # ---- lifecycle -------------------------------------------------------------------------------------------------

    async def _start_servers(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/v1.0/teams/{team}/members", self._members)])
        self.port = await self.serve(app)


def _graph_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)
