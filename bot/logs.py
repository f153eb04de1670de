"""How ragbot's log lines look: LOG_FORMAT=text (the default, for a terminal) or json (one JSON object per line,
for a log collector: time, level, logger, message, and the traceback as `exception` when there is one).

Both formats pass every record through `RedactSecrets` first: the values of the secret settings (tokens, API keys,
the database password) and anything shaped like a Slack token, an Anthropic key or a URL's password become `***`,
so a library that logs a request or a URL never writes a credential to the log.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import IO

# Slack tokens (xoxb-, xoxp-, xapp-...), Anthropic keys, and the password in scheme://user:password@host.
_TOKEN_SHAPES = re.compile(r"\b(?:xox[abposr]|xapp)-[A-Za-z0-9-]+|\bsk-ant-[A-Za-z0-9_-]+")
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]+:)[^@\s]+@", re.IGNORECASE)
REDACTED = "***"


class RedactSecrets(logging.Filter):
    """Rewrites each record's message with known secret values and secret-shaped strings replaced by ***."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Longest first, so a secret that contains another is replaced whole; very short values would hide words.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        text = _TOKEN_SHAPES.sub(REDACTED, text)
        return _URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self.redact(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if redacted != message or record.args:
            record.msg, record.args = redacted, None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: {"time", "level", "logger", "message"[, "exception"]}."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"


class _RagbotHandler(logging.StreamHandler[IO[str]]):
    """The handler configure_logging installed, so that the next call knows it for its own and replaces it."""

    _ragbot_handler = True


def configure_logging(
    level: str, log_format: str, secrets: Iterable[str] = (), *, stream: IO[str] | None = None,
    root: logging.Logger | None = None,
) -> logging.Handler | None:
    """Log to stderr (or `stream`) in the chosen format, as logging.basicConfig would: a logger that already has a
    handler someone else installed (a test runner's, an embedding application's) is left alone. Calling it again
    replaces the handler it installed before. Returns the new handler, or None when it left things alone."""
    root = root or logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_ragbot_handler", False)]:
        root.removeHandler(old)
    if root.handlers:
        return None
    handler = _RagbotHandler(stream)
    handler.addFilter(RedactSecrets(secrets))
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler


def secret_values(*settings: object) -> list[str]:
    """The plain values of every SecretStr field, and the password of any *_url field, of these settings objects."""
    from urllib.parse import urlsplit

    from pydantic import SecretStr

    values: list[str] = []
    for item in settings:
        for name, value in vars(item).items():
            if isinstance(value, SecretStr):
                values.append(value.get_secret_value())
            elif isinstance(value, str) and name.endswith("_url") and "://" in value:
                try:
                    password = urlsplit(value).password
                except ValueError:
                    password = None
                if password:
                    values.append(password)
    return values
