"""Microsoft Teams (docs/teams.md) on the Microsoft 365 Agents SDK.

`PLATFORM` registers it (bot.platforms): its settings (TEAMS_*) are read on their own (`TeamsSettings`); `ragbot run`
starts it when TEAMS_APP_ID and TEAMS_APP_PASSWORD are set. The SDK is imported only when the adapter is built."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bot.platforms import PlatformSpec
from bot.teams.settings import TeamsSettings

if TYPE_CHECKING:
    from bot.context import BotContext


def _configured(settings: Any) -> bool:
    """TEAMS_APP_ID and TEAMS_APP_PASSWORD are set (read from the environment or .env, as BotSettings is)."""
    return TeamsSettings().configured


def _adapter(context: BotContext) -> Any:
    from bot.teams.adapter import TeamsAdapter  # the Agents SDK loads only for a configured Teams

    return TeamsAdapter(context)


PLATFORM = PlatformSpec("teams", TeamsSettings, _configured, _adapter)
