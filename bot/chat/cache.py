"""A small bounded cache for what an adapter learns per person or per conversation (a roster entry, where a person
was last seen): at most `max_items` entries, the least recently used dropped first, each forgotten after
`ttl_seconds` (None: kept until pushed out). A long-running bot in a big tenant must not grow without bound.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    def __init__(self, max_items: int, ttl_seconds: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_items < 1:
            raise ValueError("a cache holds at least one entry")
        self.max_items = max_items
        self.ttl = ttl_seconds
        self._clock = clock
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value, or None when absent or expired (an expired entry is dropped)."""
        entry = self._items.get(key)
        if entry is None:
            return None
        if self.ttl is not None and self._clock() - entry[0] >= self.ttl:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return entry[1]

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]

    def put(self, key: K, value: V) -> None:
        self._items[key] = (self._clock(), value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def drop(self, predicate: Callable[[K], bool]) -> None:
        """Forget every entry whose key matches (a conversation's roster after a membership change)."""
        for key in [k for k in self._items if predicate(k)]:
            del self._items[key]

    def __len__(self) -> int:
        return len(self._items)
