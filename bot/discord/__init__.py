"""The Discord adapter: Discord interactions in, Discord messages out; everything else is in bot/chat.

`PLATFORM` registers it (bot.platforms): started by `ragbot run` when DISCORD_TOKEN is set."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bot.discord.settings import DiscordSettings
from bot.platforms import PlatformSpec

if TYPE_CHECKING:
    from bot.context import BotContext


def _configured(settings: Any) -> bool:
    token = settings.discord_bot_token
    return bool(token and token.get_secret_value())


def _adapter(context: BotContext) -> Any:
    from bot.discord.adapter import DiscordAdapter  # discord.py is loaded only when Discord is configured

    return DiscordAdapter(context)


PLATFORM = PlatformSpec("discord", DiscordSettings, _configured, _adapter)
