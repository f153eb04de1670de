"""The identity map as the access resolver reads it: which principals an admin mapped a chat identity
("slack:U1", "discord:42") to. The bot owns the table and writes it (`bot.chat.state.BotState`); knowledge reads it
so `principals_for("slack:U1")` and every answer's access check see the mapping, whoever opened the knowledge base."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def identity_principals(engine: AsyncEngine, identity: str) -> list[str]:
    """The principals mapped to `identity`, sorted; [] when there are none."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT principal FROM bot_identities WHERE identity = :i ORDER BY principal"), {"i": identity}
        )
        return list(rows.scalars())
