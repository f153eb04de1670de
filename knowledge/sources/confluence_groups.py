"""Confluence group membership (Cloud and Data Center) for the access resolver (issue 33). No SQL here.

Which groups: every group that appears in a read permission of a synced space, plus every group principal the
source's indexed documents carry (page restrictions included: a restriction group that survived the intersection
with the space's readers is on the document). The caller passes the latter in.

Members, paged to the end through the source's own HTTP client (`ConfluenceClient.paged`, which follows
`_links.next`; a short page is not the end):
- Cloud: `GET /wiki/rest/api/group/{groupId}/membersByGroupId?start=&limit=` (Atlassian's Confluence Cloud REST
  v1 reference, Group → "Get group members", by group id; `limit` at most 200, a larger one is a 400); a group
  known only by name is looked up first with `GET /wiki/rest/api/group/by-name?name=…` ("Get group"). The older
  `GET /wiki/rest/api/group/member` takes a group `name`, not a `groupId`, and is deprecated: not used.
- Data Center: `GET /rest/api/group/{groupName}/member?start=&limit=` (Confluence Data Center REST API, Group →
  "Get members of group").
Groups are scoped to the source (`group:<source>/<name>`, knowledge.access), as the source writes them on its
documents: a Confluence group only ever grants what this site shared with it. A member becomes `user:<email>` when
Confluence shows the email (folded in ASCII), else `user:confluence:<accountId>` (Cloud) or
`user:confluence:<username>` (Data Center): the same strings the source writes into document access. The all-users
group (`everyone_group`) is `everyone` on documents, so its members are never fetched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from knowledge.access import fold_ascii, group_scope, scoped_group
from knowledge.sources.confluence import ConfluenceNotFound, ConfluenceSource

logger = logging.getLogger(__name__)

MEMBER_PAGE_SIZE = 200  # the most Cloud's membersByGroupId accepts (more is a 400)


@dataclass
class ConfluenceDirectory:
    """What one refresh found: (group principal, member principal) edges and how many API calls it took."""

    edges: list[tuple[str, str]] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # groups Confluence no longer knows (they grant nothing)
    api_calls: int = 0


def member_principal(member: Mapping[str, Any]) -> str | None:
    """A group member as documents carry users. Anonymous or app users without an id are skipped."""
    email = member.get("email")
    if email:
        return f"user:{fold_ascii(str(email).strip())}"
    ident = member.get("accountId") or member.get("username")
    return f"user:confluence:{ident}" if ident else None


async def group_members(source: ConfluenceSource, extra_group_principals: Sequence[str] = (),
                        page_size: int = MEMBER_PAGE_SIZE) -> ConfluenceDirectory:
    """Members of every group that grants something in the source's spaces (`extra_group_principals`: the group
    principals its documents carry; only this source's own scope counts). Raises the source's typed errors
    (SourceUnavailable after the client's retries, SourceAuthError) so a failed refresh keeps the last good one."""
    client = source.client
    found = ConfluenceDirectory()
    page_size = min(page_size, MEMBER_PAGE_SIZE)
    names: dict[str, str | None] = {}  # group name -> Cloud group id when known
    for key in source.config.spaces:
        for name, group_id in (await source.space_groups(key)).items():
            names.setdefault(name, group_id)
    for principal in extra_group_principals:
        scope, name = group_scope(principal)
        if principal.startswith("group:") and scope == source.spec.name and name:
            names.setdefault(name, None)
    everyone = source.config.everyone_group.lower()
    for name in sorted(names):
        if name.lower() == everyone:
            continue
        group = scoped_group(source.spec.name, name)
        found.groups.append(group)
        params: dict[str, Any] = {"start": 0, "limit": page_size}
        try:
            if source.config.cloud:
                group_id = names[name]
                if not group_id:
                    found.api_calls += 1
                    group_id = str((await client.get("/rest/api/group/by-name", {"name": name})).get("id") or "")
                if not group_id:
                    found.missing.append(group)
                    continue
                path = f"/rest/api/group/{quote(group_id, safe='')}/membersByGroupId"
            else:
                path = f"/rest/api/group/{quote(name, safe='')}/member"
            async for page in client.paged(path, params):
                found.api_calls += 1
                for member in page.get("results") or []:
                    who = member_principal(member)
                    if who is not None:
                        found.edges.append((group, who))
        except ConfluenceNotFound:
            logger.info("source %s: group %s no longer exists in Confluence; it grants nothing", source.spec.name, name)
            found.missing.append(group)
    return found
