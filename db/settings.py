"""Where the database lives. Read from the environment or `.env` (see `.env.example`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    # Any Postgres with pgvector >= 0.8. Unset: an embedded Postgres is started under RAGBOT_HOME.
    database_url: str | None = None
    # Folder for ragbot's own state (the embedded database's data lives in RAGBOT_HOME/pgdata).
    ragbot_home: Path = Path("~/.ragbot")
    # Hot standbys of DATABASE_URL, comma-separated: searches, status, insights and the admin page read from one;
    # writes and reads that must see their own write stay on the primary (db.replicas).
    database_replica_urls: str = ""
    # A standby further behind the primary than this (or not answering) is skipped until it catches up.
    replica_max_lag_seconds: float = 30.0
    # "transaction" when a pooler in transaction mode (PgBouncer's pool_mode = transaction) is in front of the
    # database: no prepared statements and no session settings or session locks (db.engine, db.leases).
    database_pooler: Literal["", "none", "session", "transaction"] = ""

    @property
    def replica_urls(self) -> list[str]:
        return [url.strip() for url in self.database_replica_urls.split(",") if url.strip()]

    @property
    def transaction_pooler(self) -> bool:
        return self.database_pooler == "transaction"

    @property
    def home(self) -> Path:
        return self.ragbot_home.expanduser()


def redact_url(url: str) -> str:
    """A database URL with its password replaced by ***. The credentials end at the last `@` before the path, so a
    password that was not URL-encoded (`p@ss`) is still hidden: a typo in DATABASE_URL never prints the secret."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    authority, slash, tail = rest.partition("/")
    credentials, at, host = authority.rpartition("@")
    if not at:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{tail}"
