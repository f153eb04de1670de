"""Microsoft Teams settings (read from the environment or .env, like `bot.settings.BotSettings`).

The Teams platform owns its settings class (registered in `bot.teams.PLATFORM`, bot/platforms.py): `ragbot run`
starts Teams when TEAMS_APP_ID and TEAMS_APP_PASSWORD are set.

The SDK needs no test hook: it reaches Microsoft's sign-in hosts through the standard HTTPS_PROXY and trusts
the CA named by SSL_CERT_FILE / REQUESTS_CA_BUNDLE, which is how the tests point it at their fake (and how a
company proxy would be configured). Our own Microsoft Graph calls (team owners) go to TEAMS_GRAPH_BASE_URL, with a
token the SDK fetches from TEAMS_LOGIN_BASE_URL (an https host MSAL knows: the tests reach theirs by the proxy too).
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class TeamsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", env_prefix="TEAMS_", extra="ignore")

    # The Azure Bot's Microsoft App ID (its Entra ID app registration): the audience every incoming token must have.
    app_id: str | None = None
    # That app registration's client secret: the bot signs in with it (OAuth 2.0 client credentials) to reply.
    app_password: SecretStr | None = None
    # The Entra ID tenant of a single-tenant bot (the Azure Bot's "Type of App": Single Tenant), or "common"/unset
    # for a multi-tenant one. Also the home tenant: a member from another tenant is a guest.
    tenant_id: str | None = None
    # Members read per request when listing a chat's or private channel's members (Teams allows 50 to 500).
    members_page_size: int = Field(default=100, ge=50, le=500)
    # Stream answers into personal (1:1) chats as they are written; Teams streams nowhere else.
    stream_personal: bool = True
    # Where team owners are read (bot.teams.owners: a team owner is a kb admin in the team's channels): Microsoft
    # Graph, and the Microsoft identity platform that issues the app's Graph token (through the SDK's MSAL). Change
    # them only for a national cloud (e.g. https://graph.microsoft.us, https://login.microsoftonline.us); tests
    # point graph_base_url at their fake.
    graph_base_url: str = "https://graph.microsoft.com"
    login_base_url: str = "https://login.microsoftonline.com"

    @property
    def configured(self) -> bool:
        """Both the app id and its secret are set (a bot without them cannot authenticate either way)."""
        return bool(self.app_id and self.app_password and self.app_password.get_secret_value())

    def require(self) -> tuple[str, str]:
        """The app id and secret, or one clear error naming what to set."""
        if not self.configured:
            raise ValueError("Teams needs TEAMS_APP_ID and TEAMS_APP_PASSWORD (the Azure Bot's app registration); "
                             "see docs/teams.md")
        assert self.app_id is not None and self.app_password is not None
        return self.app_id, self.app_password.get_secret_value()
