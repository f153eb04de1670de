"""Microsoft Teams (docs/teams.md): registered as a chat platform; `ragbot run` starts it when TEAMS_APP_ID and
TEAMS_APP_PASSWORD are set. The SDK is imported only when the adapter is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.platforms import PlatformSpec, register
from bot.teams.settings import TeamsSettings

if TYPE_CHECKING:
    from bot.app import Adapter
    from bot.context import BotContext
    from bot.settings import BotSettings


def _configured(settings: BotSettings) -> bool:
    """TEAMS_APP_ID and TEAMS_APP_PASSWORD are set (read from the environment or .env, as BotSettings is)."""
    return TeamsSettings().configured


def _adapter(context: BotContext) -> Adapter:
    from bot.teams.adapter import TeamsAdapter  # the Agents SDK loads only for a configured Teams

    return TeamsAdapter(context)


PLATFORM = register(PlatformSpec(name="teams", settings=TeamsSettings, configured=_configured, adapter=_adapter))
