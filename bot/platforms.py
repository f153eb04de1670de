"""The chat platform registry: each platform module declares itself once (`PLATFORM = PlatformSpec(...)`) and
`ragbot run` starts every platform whose settings are set, without a core file naming it.

A spec is plain data: its name (the prefix of identities and channel keys, "teams:…"), its settings class (read
from the environment; `tests/test_settings_docs.py` checks each is documented), whether the deployment configured
it (its tokens are set), and a factory building its adapter from the shared `BotContext`. The factory imports the
platform's client library only when called, so an unconfigured platform costs nothing at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic_settings import BaseSettings

if TYPE_CHECKING:
    from bot.app import Adapter
    from bot.context import BotContext
    from bot.settings import BotSettings


@dataclass(frozen=True)
class PlatformSpec:
    name: str
    settings: type[BaseSettings] | None
    configured: Callable[[BotSettings], bool]
    adapter: Callable[[BotContext], Adapter]


_REGISTRY: dict[str, PlatformSpec] = {}


def register(spec: PlatformSpec) -> PlatformSpec:
    """Add a platform (a second registration of the same name replaces the first: a module reloaded in tests)."""
    _REGISTRY[spec.name] = spec
    return spec


def platforms() -> list[PlatformSpec]:
    """Every registered platform, in registration order."""
    return list(_REGISTRY.values())


def platform(name: str) -> PlatformSpec:
    """One platform by name; KeyError naming the known ones if it is not registered."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no chat platform {name!r} is registered (known: {', '.join(_REGISTRY) or 'none'})") from None
