"""Chat platform settings, read once by the composition root (`bot/app.py`) and handed to every adapter."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class BotSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    slack_bot_token: SecretStr | None = None
    slack_app_token: SecretStr | None = None  # set: Socket Mode; unset: HTTP mode on PORT
    slack_signing_secret: SecretStr | None = None
    # The Slack Web API base URL in slack_sdk's form (a test or proxy can point it elsewhere).
    slack_api_url: str = "https://slack.com/api/"
    # Answer replies in a thread the bot already answered in without a new @mention.
    slack_thread_followups: bool = True
    # Stream Claude's answers into Slack as they are written (falls back to a placeholder + update if refused).
    slack_stream_answers: bool = True
    discord_bot_token: SecretStr | None = None

    # Comma-separated platform user ids that count as bot admins besides workspace admins/owners
    # ("U012ABC", "slack:U012ABC", "discord:4242").
    admin_user_ids: str = ""
    # How long a user's email and admin flag (users.info) are cached.
    user_cache_seconds: int = Field(default=600, ge=0)

    # Run the sync scheduler inside `ragbot run` (turn off when `ragbot scheduler` runs as its own process).
    run_scheduler: bool = True

    # The HTTP server: Slack events (HTTP mode), /healthz and /metrics.
    host: str = "0.0.0.0"
    port: int = Field(default=3000, ge=0, le=65535)
    log_level: str = "WARNING"

    @property
    def chat_platforms(self) -> list[str]:
        platforms = []
        if self.slack_bot_token and self.slack_bot_token.get_secret_value():
            platforms.append("slack")
        if self.discord_bot_token and self.discord_bot_token.get_secret_value():
            platforms.append("discord")
        return platforms

    def is_listed_admin(self, platform: str, user_id: str) -> bool:
        """Is this user named in ADMIN_USER_IDS, bare ("U1") or platform-qualified ("slack:U1")?"""
        listed = {item.strip() for item in self.admin_user_ids.split(",") if item.strip()}
        return user_id in listed or f"{platform}:{user_id}" in listed
