"""Where the database lives. Read from the environment or `.env` (see `.env.example`)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    # Any Postgres with pgvector >= 0.8. Unset: an embedded Postgres is started under RAGBOT_HOME.
    database_url: str | None = None
    # Folder for ragbot's own state (the embedded database's data lives in RAGBOT_HOME/pgdata).
    ragbot_home: Path = Path("~/.ragbot")

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
