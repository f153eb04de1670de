"""Chat platform settings (the adapters that use them come in their own modules)."""

from __future__ import annotations

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class BotSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    slack_bot_token: SecretStr | None = None
    slack_app_token: SecretStr | None = None
    slack_signing_secret: SecretStr | None = None
    discord_bot_token: SecretStr | None = None
    log_level: str = "WARNING"

    @property
    def chat_platforms(self) -> list[str]:
        platforms = []
        if self.slack_bot_token:
            platforms.append("slack")
        if self.discord_bot_token:
            platforms.append("discord")
        return platforms
