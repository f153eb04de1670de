"""Discord's settings: read as part of `bot.settings.BotSettings` (no prefix), which mixes in every registered
platform's settings class (bot.platforms)."""

from __future__ import annotations

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class DiscordSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

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
