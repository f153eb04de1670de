"""The chat platform registry: which platforms exist, which are configured, and how to build each one's adapter.

A platform is a package exposing `PLATFORM = PlatformSpec(...)` in its `__init__` (kept light: the adapter, with its
client library, is imported only when the platform is configured). The built-in ones are found by module path
(`BUILTIN_MODULES`); third-party ones through the `ragbot.platforms` entry-point group, as `llm` finds its plugins:

    [project.entry-points."ragbot.platforms"]
    mattermost = "ragbot_mattermost:PLATFORM"

This module is the only place outside the platform packages that names them: the composition root
(`bot/app.py`), the settings (`bot/settings.py`) and the chat core (`bot/chat`) iterate the registry.
Registering a platform also registers its name as a chat identity kind (`slack:U1`), so `ragbot ask --as slack:U1`
and the identity map accept it (`knowledge.register_identity_kind`: knowledge may not import bot).
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from knowledge import register_identity_kind

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

    from bot.context import BotContext

logger = logging.getLogger(__name__)

BUILTIN_MODULES = ("bot.slack", "bot.discord", "bot.teams")
ENTRY_POINT_GROUP = "ragbot.platforms"
_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True)
class PlatformSpec:
    """One chat platform. `name` prefixes its identities and channel keys ("slack" → "slack:U1"); `settings` is
    its pydantic-settings class (fields without an env prefix are read as part of `BotSettings`; a class with its
    own prefix is read on its own), listed by `known_settings`; `configured(settings)` says whether `ragbot run`
    starts it (its token is set); `adapter(context)` builds it, importing its client library only then."""

    name: str
    settings: type[BaseSettings] | None
    configured: Callable[[Any], bool]  # (BotSettings) -> bool
    adapter: Callable[[BotContext], Any]  # (BotContext) -> bot.app.Adapter
    title: str = ""  # how people write its name ("Slack"); the name capitalised by default

    @property
    def display_name(self) -> str:
        return self.title or self.name.capitalize()


_registry: dict[str, PlatformSpec] = {}
_discovered = False


def register(spec: PlatformSpec) -> PlatformSpec:
    """Add a platform (idempotent for the same spec). A name that is not a lowercase word, or one already taken by
    another spec, is an error: two platforms would share identities."""
    if not _NAME.match(spec.name):
        raise ValueError(f"platform name {spec.name!r}: use a lowercase word (letters, digits, - or _)")
    known = _registry.get(spec.name)
    if known is not None and known is not spec:
        raise ValueError(f"two chat platforms are named {spec.name!r}: rename one of them")
    _registry[spec.name] = spec
    register_identity_kind(spec.name)
    return spec


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for path in BUILTIN_MODULES:
        spec = getattr(importlib.import_module(path), "PLATFORM", None)
        if isinstance(spec, PlatformSpec):
            register(spec)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = entry.load()
        except Exception:  # a broken plugin must not stop the built-in platforms
            logger.exception("could not load the chat platform %s (entry point %s)", entry.name, entry.value)
            continue
        if isinstance(spec, PlatformSpec):
            register(spec)
        else:
            logger.error("entry point %s = %s is not a PlatformSpec; ignored", entry.name, entry.value)


def platforms() -> list[PlatformSpec]:
    """Every registered platform, the built-in ones first."""
    _discover()
    return list(_registry.values())


def platform(name: str) -> PlatformSpec:
    """The platform named `name`; an error naming the known ones otherwise."""
    _discover()
    try:
        return _registry[name]
    except KeyError:
        raise KeyError(f"no chat platform named {name!r}: the known ones are {', '.join(_registry) or 'none'}") \
            from None


def names() -> list[str]:
    return [spec.name for spec in platforms()]


def display_names() -> list[str]:
    """The platforms as people write them ("Slack", "Discord"), for pages and messages."""
    return [spec.display_name for spec in platforms()]
