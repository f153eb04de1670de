"""Driving a real discord.py client without a gateway: raw Discord payloads in, the fake REST API records what
came out.

A live bot receives GUILD_CREATE, MESSAGE_CREATE, THREAD_CREATE and INTERACTION_CREATE over the gateway websocket
and discord.py's `ConnectionState.parse_<event>` turns each into objects and dispatches them (to `on_message`, to
the `CommandTree`, to persistent views and dynamic items). The harness calls those same parsers with payloads shaped
like Discord's, after `client.login()` has run `static_login` against the fake (which creates the HTTP session the
interaction responses need), so everything from the payload onwards is discord.py's own code path.

Payload shapes: https://discord.com/developers/docs/interactions/receiving-and-responding#interaction-object and
https://discord.com/developers/docs/resources/message#message-object.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import Any

import discord

from fakes.discord_api import APPLICATION_ID, FakeDiscordAPI, now_iso, user_payload

MANAGE_GUILD = 1 << 5
# What an ordinary member may do in a channel: view, send messages, read history, use application commands...
MEMBER_PERMISSIONS = (1 << 10) | (1 << 11) | (1 << 16) | (1 << 31) | (1 << 38)

_ids = itertools.count(1_200_000_000_000_000_000)

# Tasks discord.py schedules for events, commands, views and dynamic items (their names, see client.py / ui/view.py
# / app_commands/tree.py); the harness waits for them, and for the bot's own background jobs, to finish.
_DISCORD_TASK_PREFIXES = ("CommandTree-invoker", "discord.py: ", "discord-ui-view-dispatch", "discord-ui-dynamic-item")


def new_id() -> int:
    return next(_ids)


def guild_payload(guild_id: int, channel_ids: list[int]) -> dict[str, Any]:
    """GUILD_CREATE for a server with these text channels (what the gateway sends after READY)."""
    channels = [
        {"id": str(c), "type": 0, "guild_id": str(guild_id), "name": f"channel-{i}", "position": i,
         "permission_overwrites": [], "nsfw": False, "topic": None, "last_message_id": None,
         "rate_limit_per_user": 0, "parent_id": None}
        for i, c in enumerate(channel_ids)
    ]
    return {
        "id": str(guild_id), "name": "Northwind", "icon": None, "owner_id": "1", "splash": None,
        "discovery_splash": None, "afk_channel_id": None, "afk_timeout": 300, "verification_level": 0,
        "default_message_notifications": 0, "explicit_content_filter": 0, "features": [], "mfa_level": 0,
        "system_channel_id": None, "system_channel_flags": 0, "rules_channel_id": None, "vanity_url_code": None,
        "description": None, "banner": None, "premium_tier": 0, "preferred_locale": "en-US",
        "public_updates_channel_id": None, "nsfw_level": 0, "premium_progress_bar_enabled": False,
        "roles": [{"id": str(guild_id), "name": "@everyone", "permissions": str(MEMBER_PERMISSIONS),
                   "position": 0, "color": 0, "hoist": False, "managed": False, "mentionable": False, "flags": 0}],
        "emojis": [], "stickers": [], "member_count": 2, "large": False, "unavailable": False,
        "channels": channels, "threads": [], "members": [], "voice_states": [], "presences": [],
        "stage_instances": [], "guild_scheduled_events": [], "soundboard_sounds": [], "joined_at": now_iso(),
    }


def message_payload(fake: FakeDiscordAPI, content: str, *, channel_id: int, guild_id: int | None, author_id: int,
                    author_name: str = "alice", mention_bot: bool = False,
                    roles: list[int] | None = None) -> dict[str, Any]:
    """MESSAGE_CREATE for a user's message (with `<@bot>` in front and the bot in `mentions` when it mentions it)."""
    bot = fake.bot_user
    if mention_bot:
        content = f"<@{bot['id']}> {content}"
    payload: dict[str, Any] = {
        "id": str(fake.next_id()), "channel_id": str(channel_id), "author": user_payload(author_id, author_name),
        "content": content, "timestamp": now_iso(), "edited_timestamp": None, "tts": False,
        "mention_everyone": False, "mentions": [bot] if mention_bot else [], "mention_roles": [],
        "attachments": [], "embeds": [], "pinned": False, "type": 0, "flags": 0, "components": [],
    }
    if guild_id is not None:
        payload["guild_id"] = str(guild_id)
        # Guild member object (https://discord.com/developers/docs/resources/guild#guild-member-object): `roles`
        # holds role ids (never @everyone's).
        payload["member"] = {"roles": [str(r) for r in roles or ()], "joined_at": now_iso(), "deaf": False,
                             "mute": False, "flags": 0}
    return payload


class DiscordHarness:
    def __init__(self, client: discord.Client, fake: FakeDiscordAPI) -> None:
        self.client = client
        self.fake = fake

    @property
    def state(self) -> Any:
        return self.client._connection  # the ConnectionState the gateway would feed

    # ---- gateway events -----------------------------------------------------------------------------------------

    def guild_create(self, guild_id: int, channel_ids: list[int]) -> None:
        for channel in channel_ids:
            self.fake.add_channel(channel, guild_id)
        self.state.parse_guild_create(guild_payload(guild_id, channel_ids))

    def sync_threads(self) -> None:
        """Discord sends THREAD_CREATE for a thread the bot started; replay it for threads the fake created."""
        for thread in list(self.fake.threads.values()):
            if not thread.get("_announced"):
                thread["_announced"] = True
                self.state.parse_thread_create({k: v for k, v in thread.items() if not k.startswith("_")})

    async def message(self, content: str, *, channel_id: int, guild_id: int | None, author_id: int,
                      author_name: str = "alice", mention_bot: bool = False,
                      roles: list[int] | None = None) -> dict[str, Any]:
        """A user posts a message: MESSAGE_CREATE, then wait until the bot has handled it."""
        payload = message_payload(self.fake, content, channel_id=channel_id, guild_id=guild_id, author_id=author_id,
                                  author_name=author_name, mention_bot=mention_bot, roles=roles)
        self.fake.record_user_message(payload)
        self.state.parse_message_create(payload)
        await self.settle()
        self.sync_threads()
        return payload

    # ---- interactions -------------------------------------------------------------------------------------------

    def _interaction_base(self, kind: int, *, guild_id: int | None, channel_id: int, user_id: int,
                          permissions: int) -> dict[str, Any]:
        token = "itok_" + secrets.token_urlsafe(24)
        base: dict[str, Any] = {
            "id": str(new_id()), "application_id": str(APPLICATION_ID), "type": kind, "token": token, "version": 1,
            "app_permissions": str(MEMBER_PERMISSIONS | (1 << 34) | (1 << 35)), "locale": "en-US",
            "entitlements": [], "authorizing_integration_owners": {"0": str(guild_id or 0)},
            "attachment_size_limit": 8 * 1024 * 1024,
        }
        if guild_id is not None:
            base.update({
                "guild_id": str(guild_id), "guild_locale": "en-US", "context": 0,
                "guild": {"id": str(guild_id), "locale": "en-US", "features": []},
                "channel": {"id": str(channel_id), "type": 0, "guild_id": str(guild_id), "name": "general",
                            "position": 0, "permission_overwrites": [], "nsfw": False, "parent_id": None},
                "channel_id": str(channel_id),
                "member": {"user": user_payload(user_id, f"user{user_id}"), "roles": [], "joined_at": now_iso(),
                           "deaf": False, "mute": False, "flags": 0, "pending": False,
                           "permissions": str(permissions), "nick": None, "avatar": None},
            })
        else:
            base.update({
                "context": 1, "channel_id": str(channel_id),
                "channel": {"id": str(channel_id), "type": 1, "recipients": [user_payload(user_id, f"user{user_id}")]},
                "user": user_payload(user_id, f"user{user_id}"),
            })
        self.fake.add_channel(channel_id, guild_id)
        self.fake.bind_interaction(token, channel_id)
        return base

    async def slash(self, name: str, options: list[dict[str, Any]] | None = None, *, guild_id: int | None,
                    channel_id: int, user_id: int, permissions: int = MEMBER_PERMISSIONS,
                    resolved: dict[str, Any] | None = None) -> dict[str, Any]:
        """A user runs a slash command (`name` may be "kb reindex" or "kb channel-access add" for subcommands;
        user options need their user in `resolved`, as Discord sends it)."""
        payload = self._interaction_base(2, guild_id=guild_id, channel_id=channel_id, user_id=user_id,
                                         permissions=permissions)
        words = name.split()
        opts: list[dict[str, Any]] = list(options or [])
        for depth, word in enumerate(reversed(words[1:])):
            opts = [{"type": 1 if depth == 0 else 2, "name": word, "options": opts}]
        command = self._registered_command(words[0], guild_id)
        payload["data"] = {"id": command["id"], "name": words[0], "type": 1, "options": opts}
        if resolved:
            payload["data"]["resolved"] = resolved
        if guild_id is not None:
            payload["data"]["guild_id"] = command.get("guild_id")
        self.state.parse_interaction_create(payload)
        await self.settle()
        return payload

    async def click(self, message: dict[str, Any], custom_id: str, *, guild_id: int | None, channel_id: int,
                    user_id: int) -> dict[str, Any]:
        """A user clicks a button on a message the bot posted (MESSAGE_COMPONENT, component type 2)."""
        payload = self._interaction_base(3, guild_id=guild_id, channel_id=channel_id, user_id=user_id,
                                         permissions=MEMBER_PERMISSIONS)
        payload["message"] = {k: v for k, v in message.items() if k not in ("edits", "allowed_mentions")}
        payload["data"] = {"custom_id": custom_id, "component_type": 2}
        self.state.parse_interaction_create(payload)
        await self.settle()
        return payload

    def _registered_command(self, name: str, guild_id: int | None) -> dict[str, Any]:
        scopes = [str(guild_id), "global"] if guild_id else ["global"]
        for scope in scopes:
            for command in self.fake.commands.get(scope, []):
                if command["name"] == name:
                    return command
        raise AssertionError(f"/{name} was never synced to Discord (synced: {self.fake.commands})")

    # ---- waiting ------------------------------------------------------------------------------------------------

    async def settle(self, timeout: float = 60.0) -> None:
        """Wait until every task discord.py scheduled for the events, and the bot's background jobs, are done."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        current = asyncio.current_task()
        while True:
            pending = [
                t for t in asyncio.all_tasks()
                if t is not current and not t.done()
                and (t.get_name().startswith(_DISCORD_TASK_PREFIXES) or t in getattr(self.client, "background", ()))
            ]
            if not pending:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"bot still busy: {[t.get_name() for t in pending]}")
            await asyncio.wait(pending, timeout=remaining)
