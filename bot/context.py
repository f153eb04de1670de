"""What every chat adapter is built from: the knowledge base, the settings, the metrics and the bot's own state
(`bot.chat.state.BotState`), built once by the composition root (`bot/app.py`) and shared. Its own module so
adapters need not import the app that starts them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.chat.state import BotState
from bot.server import BotMetrics
from bot.settings import BotSettings

if TYPE_CHECKING:
    from knowledge import KnowledgeBase


@dataclass
class BotContext:
    """What every adapter gets: built once, shared."""

    kb: KnowledgeBase
    settings: BotSettings
    metrics: BotMetrics
    state: BotState  # the bot tables, over kb.engine
