"""Per-channel settings an admin sets with `/kb channel …` (Slack, Discord) or `ragbot channel …`, and their SQL
(table `bot_channel_settings`, migration 0012_admin).

- `sources`: only these sources answer in the channel (None: every source the channel's audience may see). The
  search applies it in SQL beside the access filter (`SearchFilters.sources`), never by dropping hits afterwards.
- `auto`: a help channel: top-level questions are answered without a mention, but only when the outcome is an
  answer (the bot never posts "I couldn't find this" unasked).
- `mode`: public | private. Stored and shown here; private (ephemeral) delivery is built by the permissions work.

The chat flow reads a channel's settings through `channel_settings` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

Mode = Literal["public", "private"]
MODES: tuple[Mode, ...] = ("public", "private")


@dataclass(frozen=True)
class ChannelSettings:
    channel_key: str
    sources: tuple[str, ...] | None = None  # None: every source the audience may see
    auto: bool = False
    mode: Mode = "public"

    def to_dict(self) -> dict[str, object]:
        return {"channel": self.channel_key, "sources": list(self.sources) if self.sources is not None else None,
                "auto": self.auto, "mode": self.mode}


class HasEngine(Protocol):
    engine: AsyncEngine


async def channel_settings(kb: HasEngine, channel_key: str | None) -> ChannelSettings:
    """THE way the chat flow reads a channel's settings; defaults for a channel nobody configured (or a DM)."""
    if not channel_key:
        return ChannelSettings("")
    async with kb.engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT sources, auto, mode FROM bot_channel_settings WHERE channel_key = :c"), {"c": channel_key}
            )
        ).first()
    if row is None:
        return ChannelSettings(channel_key)
    sources = tuple(row.sources) if row.sources is not None else None
    return ChannelSettings(channel_key, sources or None, bool(row.auto), row.mode)


async def _upsert(kb: HasEngine, channel_key: str, by: str | None, column: str, value: object) -> None:
    assert column in ("sources", "auto", "mode")
    cast = {"sources": "CAST(:v AS text[])", "auto": "CAST(:v AS boolean)", "mode": "CAST(:v AS text)"}[column]
    async with kb.engine.begin() as conn:
        await conn.execute(
            text(
                f"INSERT INTO bot_channel_settings (channel_key, {column}, updated_by) VALUES (:c, {cast}, :by) "
                f"ON CONFLICT (channel_key) DO UPDATE SET {column} = EXCLUDED.{column}, "
                "updated_by = EXCLUDED.updated_by, updated_at = now()"
            ),
            {"c": channel_key, "v": value, "by": by},
        )


async def set_sources(kb: HasEngine, channel_key: str, sources: Sequence[str] | None, by: str | None) -> None:
    """None or empty: back to every source."""
    await _upsert(kb, channel_key, by, "sources", sorted(set(sources)) if sources else None)


async def set_auto(kb: HasEngine, channel_key: str, auto: bool, by: str | None) -> None:
    await _upsert(kb, channel_key, by, "auto", auto)


def parse_mode(value: str) -> Mode | None:
    """A channel's answer mode as typed (`public` or `private`), or None for anything else."""
    return value if value in MODES else None


async def set_mode(kb: HasEngine, channel_key: str, mode: Mode, by: str | None) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be public or private, not {mode!r}")
    await _upsert(kb, channel_key, by, "mode", mode)


async def configured_channels(kb: HasEngine) -> list[ChannelSettings]:
    async with kb.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT channel_key, sources, auto, mode FROM bot_channel_settings ORDER BY channel_key")
        )
        return [ChannelSettings(r.channel_key, tuple(r.sources) if r.sources else None, bool(r.auto), r.mode)
                for r in rows]
