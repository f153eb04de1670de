"""Slack's user directory outside a running bot: an email → the Slack user id (`ragbot forget-user`)."""

from __future__ import annotations

import logging

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.settings import BotSettings

logger = logging.getLogger(__name__)


async def slack_identities_for_email(settings: BotSettings, email: str) -> list[str]:
    """["slack:U123"] from users.lookupByEmail (scope users:read.email), or [] when Slack is not configured or knows
    no such user."""
    if not settings.slack_bot_token or not settings.slack_bot_token.get_secret_value():
        return []
    client = AsyncWebClient(token=settings.slack_bot_token.get_secret_value(),
                            base_url=settings.slack_api_url.rstrip("/") + "/")
    try:
        response = await client.users_lookupByEmail(email=email)
    except SlackApiError as exc:
        error = exc.response.get("error") if exc.response else str(exc)
        if error != "users_not_found":
            logger.warning("Slack users.lookupByEmail failed: %s", error)
        return []
    user = response.get("user") or {}
    return [f"slack:{user['id']}"] if user.get("id") else []
