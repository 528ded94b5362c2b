"""A small bounded TTL cache for positive authentication results."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class TtlCache(Generic[V]):
    """LRU-bounded mapping whose entries expire ``ttl_s`` after they were put.

    Not thread-safe: the store only touches it from the trio thread.
    """

    def __init__(self, *, ttl_s: float, max_size: int, clock: Callable[[], float]) -> None:
        self._ttl_s = ttl_s
        self._max_size = max_size
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def get(self, key: str) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, value = entry
        if self._clock() >= expires_at:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: str, value: V) -> None:
        if self._max_size <= 0 or self._ttl_s <= 0:
            return
        self._entries[key] = (self._clock() + self._ttl_s, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_size:
            self._entries.popitem(last=False)

    def discard(self, key: str) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
