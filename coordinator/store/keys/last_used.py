"""``UseRecorder``: when each API key was last used, written in batches off the request path.

A request only notes the time in a dict (no I/O); the instance flushes the notes every few
seconds in one transaction, and writes a key at most once per ``min_interval_s`` (a minute),
however busy it is. ``gemmanet keys list`` is therefore up to a minute (plus a flush) behind.
"""

from __future__ import annotations

from collections.abc import Callable

#: the least time between two writes of one key's "last used" by one instance
MIN_WRITE_INTERVAL_S = 60.0


class UseRecorder:
    """Notes uses (``touch``) and hands out the ones due for writing (``due`` / ``written``).
    Touched only from the trio thread."""

    def __init__(
        self,
        *,
        wall_clock: Callable[[], float],
        min_interval_s: float = MIN_WRITE_INTERVAL_S,
    ) -> None:
        self._wall_clock = wall_clock
        self._min_interval_s = min_interval_s
        #: key id -> the newest use not yet written
        self._pending: dict[str, float] = {}
        #: key id -> when its last use was written (entries older than the interval go)
        self._written: dict[str, float] = {}

    def touch(self, key_id: str) -> None:
        self._pending[key_id] = self._wall_clock()

    def due(self, *, final: bool = False) -> dict[str, float]:
        """The uses to write now: each pending key not written in the last interval (every
        pending key when ``final``, at a stop)."""
        now = self._wall_clock()
        self._written = {
            k: at for k, at in self._written.items() if now - at < self._min_interval_s
        }
        if final:
            return dict(self._pending)
        return {k: at for k, at in self._pending.items() if k not in self._written}

    def written(self, uses: dict[str, float]) -> None:
        """``uses`` (from ``due``) reached the database: forget them unless used since."""
        now = self._wall_clock()
        for key_id, at in uses.items():
            self._written[key_id] = now
            if self._pending.get(key_id) == at:
                del self._pending[key_id]

    def __len__(self) -> int:
        return len(self._pending)
