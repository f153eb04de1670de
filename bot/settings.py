"""Chat platform settings, read once by the composition root (`bot/app.py`) and handed to every adapter."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class BotSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    slack_bot_token: SecretStr | None = None
    slack_app_token: SecretStr | None = None  # set: Socket Mode; unset: HTTP mode on PORT
    slack_signing_secret: SecretStr | None = None
    # The Slack Web API base URL in slack_sdk's form (a test or proxy can point it elsewhere).
    slack_api_url: str = "https://slack.com/api/"
    # Answer replies in a thread the bot already answered in without a new @mention.
    slack_thread_followups: bool = True
    # Stream Claude's answers into Slack as they are written (falls back to a placeholder + update if refused).
    slack_stream_answers: bool = True

    # Comma-separated platform user ids that count as bot admins besides workspace admins/owners
    # ("U012ABC", "slack:U012ABC", "discord:4242").
    admin_user_ids: str = ""
    # How long a user's email and admin flag (users.info) are cached.
    user_cache_seconds: int = Field(default=600, ge=0)
    # What guests and other organisations' users get (Slack single/multi-channel guests, Slack Connect users of
    # another workspace; on Discord, members without a role when DISCORD_GUEST_WITHOUT_ROLE): `none` (no document,
    # in a DM or in a channel they are a member of) or `everyone` (documents shared with everyone, nothing more).
    # They are never admins. docs/security.md, "Trust model".
    guest_access: Literal["none", "everyone"] = "none"

    # Channel audiences (docs/permissions.md, "In chat"): a private Slack channel or a Discord channel hidden from
    # @everyone answers from what every member may see. Its member list is re-read at least every this many seconds
    # (and at once on a member join/leave event).
    channel_audience_ttl: float = Field(default=600.0, ge=0.0)
    # A restricted channel with more members than this answers from `everyone` + grants (as does one whose members
    # cannot be listed): never from the asker's own access.
    channel_audience_max_members: int = Field(default=200, ge=1)

    # With no chat token set, `ragbot run` starts the terminal chat (true), or (false: a container, a server) serves
    # only /healthz, /metrics and the sync scheduler, until stopped.
    terminal_chat: bool = True

    # Run the sync scheduler inside `ragbot run` (turn off when `ragbot scheduler` runs as its own process).
    run_scheduler: bool = True

    # Questions, answers and feedback older than this many days are deleted (by `ragbot run`'s periodic job).
    retention_days: int = Field(default=90, ge=1)
    # The admin page at /admin is served only when this is set; open it with `Authorization: Bearer <token>` or
    # `/admin?token=<token>` in a browser.
    admin_token: SecretStr | None = None
    # Delivery after a crash (docs/operations.md, "Delivery"): a claimed question whose lease is not renewed for
    # this many seconds (its process died) is taken over by the platform's retry or by the sweeper and answered in
    # the same placeholder. Short, because a live holder renews it (a heartbeat) however long the answer takes.
    answer_lease_seconds: float = Field(default=10.0, gt=0)
    # How often the holder renews its lease while it answers (at most a third of the lease is used).
    answer_heartbeat_seconds: float = Field(default=3.0, gt=0)
    # How often `ragbot run` looks for such questions (and once at start-up); 0: never in this process. A dead
    # holder's question is answered within ANSWER_LEASE_SECONDS + ANSWER_SWEEP_SECONDS (15 s by default).
    answer_sweep_seconds: float = Field(default=5.0, ge=0)

    # The HTTP server: Slack events (HTTP mode), /healthz and /metrics.
    host: str = "0.0.0.0"
    port: int = Field(default=3000, ge=0, le=65535)
    log_level: str = "WARNING"
    # text (for a terminal) or json (one object per line: time, level, logger, message) for a log collector.
    log_format: Literal["text", "json"] = "text"

    # Discord. DISCORD_TOKEN is the bot token from the Developer Portal (DISCORD_BOT_TOKEN is accepted too).
    discord_bot_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("DISCORD_TOKEN", "DISCORD_BOT_TOKEN", "discord_bot_token")
    )
    # Sync the slash commands to this server only (they appear at once); unset: globally (can take up to an hour).
    discord_guild_id: int | None = None
    # Another base URL for Discord's REST API (tests point it at a local fake), e.g. http://127.0.0.1:8080/api/v10.
    discord_api_url: str | None = None
    # Another gateway (websocket) URL, e.g. ws://127.0.0.1:8080/gateway for a local fake; unset: Discord's.
    discord_gateway_url: str | None = None
    # Read the text of thread replies that do not mention the bot (the privileged Message Content intent, to be
    # switched on in the Developer Portal). Off: follow-ups in a thread need an @mention.
    discord_message_content: bool = True
    # Seconds between edits of a message while an answer streams in (Discord allows about 5 edits per 5 s).
    discord_edit_interval_seconds: float = Field(default=1.2, ge=0.0)
    # Discord has no guests: with this on, a server member holding no role besides @everyone is treated as one
    # (GUEST_ACCESS applies to them, and they are never admins).
    discord_guest_without_role: bool = False

    @property
    def chat_platforms(self) -> list[str]:
        platforms = []
        if self.slack_bot_token and self.slack_bot_token.get_secret_value():
            platforms.append("slack")
        if self.discord_bot_token and self.discord_bot_token.get_secret_value():
            platforms.append("discord")
        from bot.teams.settings import TeamsSettings  # pydantic only: the Teams SDK is not imported

        if TeamsSettings().configured:  # TEAMS_APP_ID and TEAMS_APP_PASSWORD
            platforms.append("teams")
        return platforms

    def is_listed_admin(self, platform: str, user_id: str) -> bool:
        """Is this user named in ADMIN_USER_IDS, bare ("U1") or platform-qualified ("slack:U1")?"""
        listed = {item.strip() for item in self.admin_user_ids.split(",") if item.strip()}
        return user_id in listed or f"{platform}:{user_id}" in listed


# The Google settings (knowledge.sources.gdrive.GoogleDriveSettings, prefix GDRIVE_, and
# knowledge.sources.google_directory.GoogleDirectorySettings, prefix GDRIVE_DIRECTORY_), named here because importing
# those modules takes a second (googleapiclient): tests/test_settings_docs.py checks the list against their fields.
GOOGLE_SETTINGS = (
    "GDRIVE_EVERYONE_DOMAINS", "GDRIVE_MAX_FILE_MB", "GDRIVE_CONCURRENCY", "GDRIVE_MAX_RETRIES",
    "GDRIVE_BACKOFF_SECONDS", "GDRIVE_MAX_BACKOFF_SECONDS", "GDRIVE_API_ENDPOINT",
    "GDRIVE_DIRECTORY_API_ENDPOINT", "GDRIVE_DIRECTORY_PAGE_SIZE", "GDRIVE_DIRECTORY_CONCURRENCY",
    "GDRIVE_DIRECTORY_MAX_RETRIES", "GDRIVE_DIRECTORY_BACKOFF_SECONDS", "GDRIVE_DIRECTORY_MAX_BACKOFF_SECONDS",
)
# Variables read by name rather than as settings: the credentials a source names by default (`--token-env`,
# `--credentials-env`; a source may name any other variable) and Google's own key-file variable.
CREDENTIAL_VARIABLES = ("CONFLUENCE_API_TOKEN", "GOOGLE_SERVICE_ACCOUNT_JSON", "GOOGLE_APPLICATION_CREDENTIALS")


def settings_of(model: type[BaseSettings]) -> set[str]:
    """The environment variables a pydantic-settings model reads: each field's name with the model's prefix, and
    its validation aliases (DISCORD_TOKEN / DISCORD_BOT_TOKEN)."""
    prefix = str(model.model_config.get("env_prefix") or "").upper()
    names: set[str] = set()
    for name, info in model.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices if str(choice).isupper())
        else:
            names.add(prefix + name.upper())
    return names


def known_settings() -> set[str]:
    """Every setting ragbot reads (bot, knowledge core, database, Google sources) and the credential variables."""
    from bot.teams.settings import TeamsSettings
    from db.settings import DatabaseSettings
    from knowledge import KnowledgeSettings

    return (settings_of(BotSettings) | settings_of(KnowledgeSettings) | settings_of(DatabaseSettings)
            | settings_of(TeamsSettings) | set(GOOGLE_SETTINGS) | set(CREDENTIAL_VARIABLES))


# Settings ragbot no longer reads, and the one that replaced them: a `.env` still setting one is told so.
RETIRED_SETTINGS = dict.fromkeys(
    ("ANSWER_DECLINE_BELOW_SIMILARITY", "ANSWER_DECLINE_BELOW_COVERAGE", "ANSWER_SUPPORT", "ANSWER_COVERAGE",
     "ANSWER_STRONG_SUPPORT", "ANSWER_STRONG_MARGIN"),
    "ANSWER_CALIBRATION",  # the fitted answer / uncertain / decline decision (docs/answers.md)
)


def unknown_settings(names: Iterable[str]) -> list[tuple[str, str]]:
    """(name, closest real setting) for each name that is not a setting but looks like a misspelt one (difflib):
    a setting that does nothing is found at once instead of being ignored. Names close to no setting (a token
    variable a source names, say WIKI_PAT) are not reported."""
    known = sorted(known_settings())
    found = []
    for name in names:
        if name.upper() in known:
            continue
        if name.upper() in RETIRED_SETTINGS:
            found.append((name, RETIRED_SETTINGS[name.upper()]))
            continue
        close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.6)
        if close:
            found.append((name, close[0]))
    return found


def dotenv_warnings(path: Path = Path(".env")) -> list[str]:
    """One warning line per variable in `.env` that ragbot does not read but that resembles a setting it does."""
    if not path.is_file():
        return []
    from dotenv import dotenv_values  # python-dotenv, which pydantic-settings reads .env with

    return [f"{path} sets {name}, which ragbot does not read: did you mean {closest}? (.env.example lists every "
            "setting)" for name, closest in unknown_settings(dotenv_values(path))]
