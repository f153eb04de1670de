"""Microsoft Teams: the platform primitives (bot.teams.platform) on the Microsoft 365 Agents SDK; docs/teams.md.

`PLATFORM` registers it (bot.platforms): its settings (TEAMS_*) are read on their own (`TeamsSettings`); `ragbot run`
starts it when TEAMS_APP_ID and TEAMS_APP_PASSWORD are set and its adapter (bot.teams.adapter) is installed."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from bot.platforms import PlatformSpec
from bot.teams.settings import TeamsSettings

if TYPE_CHECKING:
    from bot.context import BotContext


def _configured(settings: Any) -> bool:
    return TeamsSettings().configured and importlib.util.find_spec("bot.teams.adapter") is not None


def _adapter(context: BotContext) -> Any:
    # Imported only when configured: the Agents SDK loads with it.
    return importlib.import_module("bot.teams.adapter").TeamsAdapter(context)


PLATFORM = PlatformSpec("teams", TeamsSettings, _configured, _adapter)
