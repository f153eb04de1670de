"""Slack's settings: read as part of `bot.settings.BotSettings` (no prefix: SLACK_BOT_TOKEN is `slack_bot_token`),
which mixes in every registered platform's settings class (bot.platforms)."""

from __future__ import annotations

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class SlackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    slack_bot_token: SecretStr | None = None
    slack_app_token: SecretStr | None = None  # set: Socket Mode; unset: HTTP mode on PORT
    slack_signing_secret: SecretStr | None = None
    # The Slack Web API base URL in slack_sdk's form (a test or proxy can point it elsewhere).
    slack_api_url: str = "https://slack.com/api/"
    # Answer replies in a thread the bot already answered in without a new @mention.
    slack_thread_followups: bool = True
    # Stream Claude's answers into Slack as they are written (falls back to a placeholder + update if refused).
    slack_stream_answers: bool = True
