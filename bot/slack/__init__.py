"""The Slack adapter: Slack events in, Slack messages out; everything else is in bot/chat.

`PLATFORM` registers it (bot.platforms): started by `ragbot run` when SLACK_BOT_TOKEN is set."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bot.platforms import PlatformSpec
from bot.slack.settings import SlackSettings

if TYPE_CHECKING:
    from bot.context import BotContext


def _configured(settings: Any) -> bool:
    token = settings.slack_bot_token
    return bool(token and token.get_secret_value())


def _adapter(context: BotContext) -> Any:
    from bot.slack.adapter import SlackAdapter  # slack-bolt is loaded only when Slack is configured

    return SlackAdapter(context)


PLATFORM = PlatformSpec("slack", SlackSettings, _configured, _adapter)
