"""Google Workspace groups and their members, from the Admin SDK Directory API (issue 33). No SQL here.

With a service account that has domain-wide delegation and an admin to act as (`source add gdrive …
--admin-email admin@acme.com`), a refresh lists every group of the customer (`groups.list(customer="my_customer")`)
and each group's direct members (`members.list(groupKey)`), following `nextPageToken` to the end (Admin SDK
Directory API reference, "Method: groups.list" and "Method: members.list"). Members are stored as direct edges as
documents carry principals, groups scoped to the source (knowledge.access): `group:<source>/<group email>` ∋
`user:<email>` (type USER), `group:<source>/<email>` (type GROUP: a nested group, expanded by the resolver with
cycle protection) or `customer:` (type CUSTOMER: everyone in the Workspace, i.e. every person with a real address in
one of its domains). Suspended members, and members without an address, grant nothing. Emails fold in ASCII only.

One group whose members the admin may not list (403 `forbidden`, "Not Authorized to access this resource/api",
Admin SDK "Directory API: common errors") does not fail the refresh: it is skipped and reported, and keeps its last
listed members until they expire (GROUP_MEMBERSHIP_TTL_SECONDS after they were listed); a group deleted between
the two listings (404) grants nothing. Only when every group is refused is the whole refresh refused.

Requests go through knowledge.sources.google_api (as Drive's do): each in a worker thread with its own httplib2
connection, under a semaphore; 429, 403 rate-limit reasons and 5xx back off (Retry-After honoured) a bounded number
of times.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from knowledge.access import email_domain, fold_ascii, scoped_group
from knowledge.errors import SourceAuthError, SourceConfigError, SourceError, SourceUnavailable
from knowledge.sources.gdrive import DriveSourceError, load_credentials
from knowledge.sources.google_api import GoogleApiClient, http_reason, short_message

logger = logging.getLogger(__name__)

DIRECTORY_SCOPE = "https://www.googleapis.com/auth/admin.directory.group.readonly"
CUSTOMER = "customer:"  # the member a CUSTOMER-type membership becomes


class GroupUnlisted(SourceError):
    """The members of one group could not be listed (403) or it is gone (404, `gone`): that group alone is skipped."""

    def __init__(self, message: str, *, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


class GoogleDirectorySettings(BaseSettings):
    """Settings of every Google directory refresh (per-source options live in the stored source config)."""

    model_config = SettingsConfigDict(env_prefix="GDRIVE_DIRECTORY_", env_file=".env", extra="ignore")

    # Another API root (a proxy, or a local fake in tests); unset means Google's (https://admin.googleapis.com/).
    api_endpoint: str | None = None
    # Results per groups.list / members.list page (the API allows at most 200).
    page_size: int = Field(default=200, ge=1, le=200)
    # Requests in flight at once.
    concurrency: int = Field(default=4, ge=1, le=32)
    # Rate limits and server errors: retries per request, first wait, longest wait (seconds).
    max_retries: int = Field(default=6, ge=0)
    backoff_seconds: float = Field(default=1.0, ge=0)
    max_backoff_seconds: float = Field(default=64.0, ge=0)


@dataclass
class GoogleDirectory:
    edges: list[tuple[str, str]] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    domains: set[str] = field(default_factory=set)
    skipped: dict[str, str] = field(default_factory=dict)  # group principal -> why its members were not listed
    missing: list[str] = field(default_factory=list)  # groups deleted between the listings (they grant nothing)
    api_calls: int = 0
    retries: int = 0


def directory_credentials(credentials_env: str, admin_email: str) -> Any:
    """The source's service-account key, scoped to read groups, acting as the admin (domain-wide delegation)."""
    try:
        base = load_credentials(credentials_env, None)
    except DriveSourceError as error:
        raise SourceAuthError(str(error)) from None
    return base.with_scopes([DIRECTORY_SCOPE]).with_subject(admin_email)


class DirectoryClient(GoogleApiClient):
    """Admin SDK Directory v1 through google-api-python-client, async, bounded, with rate-limit backoff
    (knowledge.sources.google_api). `credentials=None` talks without authentication (only useful against a local
    fake). Every failure is a SourceError naming the source: its last good group membership is kept."""

    api_name = "Directory API"

    def __init__(self, source_name: str, credentials: Any, settings: GoogleDirectorySettings | None = None) -> None:
        self.name = source_name
        self.settings: GoogleDirectorySettings = settings or GoogleDirectorySettings()
        super().__init__("admin", "directory_v1", credentials, self.settings)

    def exhausted(self, error: Any, retries: int) -> Exception:
        return SourceUnavailable(
            f"source {self.name!r}: the Google Directory API still answers {http_reason(error)} after "
            f"{retries} retries; the last good group membership is kept until it expires")

    def refused(self, error: Any) -> Exception | None:
        if error.status_code in (403, 404) and _is_members_list(error):
            return GroupUnlisted(f"the Google Directory API answered {http_reason(error)}",
                                 gone=error.status_code == 404)
        if error.status_code in (401, 403):
            return SourceAuthError(
                f"source {self.name!r}: the Google Directory API refused to list groups ({http_reason(error)}); "
                f"grant the service account domain-wide delegation of {DIRECTORY_SCOPE} and give an admin "
                "to act as")
        return SourceUnavailable(f"source {self.name!r}: the Google Directory API answered {http_reason(error)}")

    def token_refused(self, error: BaseException) -> Exception:
        return SourceAuthError(
            f"source {self.name!r}: Google refused the service account's token for the Directory API "
            f"({short_message(error)}): check domain-wide delegation of {DIRECTORY_SCOPE} and the admin email")

    def unreachable(self, error: BaseException) -> Exception:
        return SourceUnavailable(f"source {self.name!r}: cannot reach the Google Directory API "
                                 f"({short_message(error)}); check the network")


def _is_members_list(error: Any) -> bool:
    """Whether the refused request was one group's members.list (…/groups/{groupKey}/members)."""
    path = str(getattr(error, "uri", "") or "").split("?", 1)[0]
    return path.rstrip("/").endswith("/members")


def member_principal(member: dict[str, Any], scope: str) -> str | None:
    """A Directory member as documents carry principals (a nested group scoped to the source `scope`); None for
    members that grant nothing: suspended ones, and USER/GROUP members without a real address (an empty local part
    like `@acme.example` would stand for nobody, or for the whole domain)."""
    if (member.get("status") or "ACTIVE").upper() == "SUSPENDED":
        return None
    kind = (member.get("type") or "").upper()
    email = fold_ascii((member.get("email") or "").strip())
    if kind == "CUSTOMER":
        return CUSTOMER
    if not email or email_domain(f"user:{email}") is None:
        return None
    if kind == "USER":
        return f"user:{email}"
    if kind == "GROUP":
        return scoped_group(scope, email)
    return None


async def fetch_directory(client: DirectoryClient, admin_email: str) -> GoogleDirectory:
    """Every group of the customer with its direct members (nesting is expanded by the resolver), its groups scoped
    to the source (`client.name`). A group whose members cannot be listed is skipped (`skipped`, `missing`)."""
    scope = client.name
    admin_domain = email_domain(f"user:{admin_email}")
    found = GoogleDirectory(domains={admin_domain} if admin_domain else set())
    size = client.settings.page_size
    groups: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = await client.call(lambda s, t=token: s.groups().list(customer="my_customer", maxResults=size,
                                                                     pageToken=t))
        groups += page.get("groups") or []
        token = page.get("nextPageToken")
        if not token:
            break
    if not groups:
        logger.info("source %s: the Directory API lists no groups for %s", client.name, admin_email)

    async def members_of(group: dict[str, Any]) -> None:
        email = fold_ascii((group.get("email") or "").strip())
        domain = email_domain(f"user:{email}")
        if domain is None:
            return
        principal = scoped_group(scope, email)
        found.groups.append(principal)
        found.domains.add(domain)
        key = group.get("id") or email
        page_token: str | None = None
        edges: list[tuple[str, str]] = []
        while True:
            try:
                page = await client.call(lambda s, t=page_token: s.members().list(groupKey=key, maxResults=size,
                                                                                  pageToken=t))
            except GroupUnlisted as refused:
                if refused.gone:
                    found.missing.append(principal)
                else:
                    found.skipped[principal] = str(refused)
                logger.warning("source %s: members of %s not listed (%s); %s", client.name, principal, refused,
                               "it grants nothing" if refused.gone else "its last listed members are kept until "
                               "they expire")
                return
            for member in page.get("members") or []:
                member_principal_ = member_principal(member, scope)
                if member_principal_ is not None and member_principal_ != principal:
                    edges.append((principal, member_principal_))
            page_token = page.get("nextPageToken")
            if not page_token:
                found.edges += edges  # only a group listed to the end: a half-listed one would drop members
                return

    await asyncio.gather(*(members_of(group) for group in groups))
    if found.skipped and len(found.skipped) == len(found.groups):
        reason = next(iter(found.skipped.values()))
        raise SourceAuthError(
            f"source {client.name!r}: the Google Directory API refused to list the members of every group "
            f"({reason}); grant the service account domain-wide delegation of {DIRECTORY_SCOPE} and give an admin "
            "who may read the groups")
    found.api_calls = client.calls
    found.retries = client.retries
    return found


def check_admin_email(value: str) -> str:
    value = value.strip()
    if email_domain(f"user:{value}") is None or not value.isascii():
        raise SourceConfigError(f"--admin-email must be a Workspace admin's email address (got {value!r})")
    return fold_ascii(value)
