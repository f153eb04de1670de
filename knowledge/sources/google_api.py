"""What the Google sources share: google-api-python-client made async, bounded, and patient with rate limits.

google-api-python-client is synchronous: every request runs in a worker thread with its own httplib2 connection
(which is not thread-safe), under a semaphore. Rate limits (429, and 403 `rateLimitExceeded` /
`userRateLimitExceeded`) and 5xx back off exponentially, honouring Retry-After, a bounded number of times. What a
failure means is each API's to say (Drive: a failed sync or one skipped file; the Admin SDK Directory: group
membership kept until it expires), so a client subclass words the four ways a request can fail.

Imported only by the Google sources, which load only when a Google source is used: the client libraries are
imported at the top.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from collections.abc import Callable
from typing import Any, Protocol

import google_auth_httplib2
import httplib2
from google.auth.exceptions import RefreshError, TransportError
from googleapiclient.discovery import build
from googleapiclient.errors import HttpError

logger = logging.getLogger(__name__)

RATE_LIMIT_REASONS = {"rateLimitExceeded", "userRateLimitExceeded"}


class ApiSettings(Protocol):
    """The settings every Google client reads (GoogleDriveSettings, GoogleDirectorySettings)."""

    api_endpoint: str | None  # another API root (a proxy, or a local fake in tests); None: Google's
    concurrency: int  # requests in flight at once
    max_retries: int  # rate limits and server errors: retries per request,
    backoff_seconds: float  # the first wait,
    max_backoff_seconds: float  # and the longest


class GoogleApiClient:
    """One Google API through google-api-python-client, async, with bounded concurrency and rate-limit backoff.
    `credentials=None` talks without authentication (only useful against a local fake).

    Subclasses say what each failure means: `exhausted` (still rate limited or failing after every retry),
    `refused` (any other HTTP error; None lets the HttpError through to the caller), `token_refused` (Google
    would not issue a token for the credentials) and `unreachable` (network)."""

    api_name = "Google API"  # in the retry log lines

    def __init__(self, service: str, version: str, credentials: Any, settings: ApiSettings) -> None:
        self.settings = settings
        self.credentials = credentials
        options = {"api_endpoint": settings.api_endpoint} if settings.api_endpoint else None
        # The discovery document ships with the library (static_discovery): no network here. Requests are executed
        # with a per-thread http below, so the one given here is never used for requests.
        self.service = build(service, version, http=httplib2.Http(), static_discovery=True, client_options=options,
                             cache_discovery=False)
        self._local = threading.local()
        self._semaphore = asyncio.Semaphore(settings.concurrency)
        self.calls = 0  # requests made so far
        self.retries = 0  # rate-limit / server-error retries so far (reported by the sync)

    def _http(self) -> Any:
        http = getattr(self._local, "http", None)
        if http is None:
            http = httplib2.Http(timeout=120)
            if self.credentials is not None:
                http = google_auth_httplib2.AuthorizedHttp(self.credentials, http=http)
            self._local.http = http
        return http

    def _execute(self, make_request: Callable[[Any], Any]) -> Any:
        return make_request(self.service).execute(http=self._http(), num_retries=0)

    async def call(self, make_request: Callable[..., Any]) -> Any:
        """Run one API request in a worker thread; back off on rate limits and server errors."""
        attempt = 0
        while True:
            try:
                async with self._semaphore:
                    self.calls += 1
                    return await asyncio.to_thread(self._execute, make_request)
            except HttpError as error:
                if retryable(error) and attempt < self.settings.max_retries:
                    delay = retry_after(error)
                    if delay is None:
                        delay = min(self.settings.max_backoff_seconds, self.settings.backoff_seconds * 2**attempt)
                        delay *= 0.5 + random.random() / 2
                    attempt += 1
                    self.retries += 1
                    logger.info("%s %s; retry %d in %.2f s", self.api_name, http_reason(error), attempt, delay)
                    await asyncio.sleep(delay)
                    continue
                failure = self.exhausted(error, attempt) if retryable(error) else self.refused(error)
                if failure is None:
                    raise
                raise failure from None
            except RefreshError as error:
                raise self.token_refused(error) from None
            except (TransportError, OSError, httplib2.HttpLib2Error) as error:
                raise self.unreachable(error) from None

    def exhausted(self, error: Any, retries: int) -> Exception:
        raise NotImplementedError

    def refused(self, error: Any) -> Exception | None:
        raise NotImplementedError

    def token_refused(self, error: BaseException) -> Exception:
        raise NotImplementedError

    def unreachable(self, error: BaseException) -> Exception:
        raise NotImplementedError


def error_reason(error: Any) -> str | None:
    """The reason of a Google API error body (`{"error": {"errors": [{"reason": ...}]}}`), if it has one."""
    try:
        data = json.loads(error.content.decode("utf-8"))
        reason: str | None = data["error"]["errors"][0]["reason"]
        return reason
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def retryable(error: Any) -> bool:
    status = error.status_code
    return status == 429 or status >= 500 or (status == 403 and error_reason(error) in RATE_LIMIT_REASONS)


def retry_after(error: Any) -> float | None:
    value = error.resp.get("retry-after") if error.resp is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def http_reason(error: Any) -> str:
    """"429 rateLimitExceeded", "404 notFound": the status and the reason, as people read them in a message."""
    return f"{error.status_code} {error_reason(error) or error.reason or ''}".strip()


def short_message(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:200]
