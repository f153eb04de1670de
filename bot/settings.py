"""Chat platform settings (the adapters that use them come in their own modules)."""

from __future__ import annotations

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class BotSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    slack_bot_token: SecretStr | None = None
    slack_app_token: SecretStr | None = None
    slack_signing_secret: SecretStr | None = None
    log_level: str = "WARNING"

    # Discord. DISCORD_TOKEN is the bot token from the Developer Portal (DISCORD_BOT_TOKEN is accepted too).
    discord_bot_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("DISCORD_TOKEN", "DISCORD_BOT_TOKEN", "discord_bot_token")
    )
    # Sync the slash commands to this server only (they appear at once); unset: globally (can take up to an hour).
    discord_guild_id: int | None = None
    # Another base URL for Discord's REST API (tests point it at a local fake), e.g. http://127.0.0.1:8080/api/v10.
    discord_api_url: str | None = None
    # Read the text of thread replies that do not mention the bot (the privileged Message Content intent, to be
    # switched on in the Developer Portal). Off: follow-ups in a thread need an @mention.
    discord_message_content: bool = True
    # Seconds between edits of a message while an answer streams in (Discord allows about 5 edits per 5 s).
    discord_edit_interval_seconds: float = Field(default=1.2, ge=0.0)

    # Chat users who may run the /kb admin commands besides platform admins: comma-separated platform user ids
    # (Slack `U…` ids, Discord numeric ids).
    admin_user_ids: str = ""

    @property
    def admin_ids(self) -> frozenset[str]:
        return frozenset(part.strip() for part in self.admin_user_ids.split(",") if part.strip())

    @property
    def chat_platforms(self) -> list[str]:
        platforms = []
        if self.slack_bot_token:
            platforms.append("slack")
        if self.discord_bot_token:
            platforms.append("discord")
        return platforms
