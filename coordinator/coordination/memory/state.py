"""The embedded backend's state: plain synchronous keys with TTLs, counters, sliding-window
rate logs, presence registries, capacity leases and channel fan-out, on one injected clock.

Every decision reads the injected clock, never wall time, randomness or hash order, so the
simulator can drive it on virtual time and get the same trace for the same seed. Expired keys are
removed before every call (a heap of deadlines), so memory stays flat even for keys nobody reads
again. The role objects (``roles.py``, ``pubsub.py``) are the async facades over it.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from coordinator.coordination.base import PresenceView, RateDecision
from coordinator.coordination.memory.affinity import PrefixTables
from coordinator.coordination.memory.leases import LeaseTables
from coordinator.coordination.memory.monitor import MonitorTables
from coordinator.coordination.memory.presence import PresenceRegistries
from coordinator.coordination.memory.telemetry import TelemetryHistories

__all__ = ["MemoryState", "Sink"]

#: A subscriber as the state sees it: offered each payload, returns False when it had to drop it.
Sink = Callable[[bytes], bool]


def _check_ttl(ttl_s: float | None) -> None:
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive or None, got {ttl_s!r}")


@dataclass(slots=True)
class _Channel:
    # Insertion-ordered, so delivery order across subscribers is deterministic.
    sinks: dict[int, Sink] = field(default_factory=dict)


class MemoryState:
    """Keys with TTLs, counters, sliding-window rate logs and channel fan-out, on one clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._values: dict[str, bytes] = {}
        self._deadlines: dict[str, float] = {}
        # (deadline, key) pairs; entries whose key got a new deadline are skipped when popped.
        self._expiry_heap: list[tuple[float, str]] = []
        self._rate_logs: dict[str, deque[float]] = {}
        self._rate_periods: dict[str, float] = {}
        # per key: the tokens of allowed calls -> when they were counted
        self._rate_tokens: dict[str, dict[str, float]] = {}
        self._rate_heap: list[tuple[float, str]] = []
        self._channels: dict[str, _Channel] = {}
        self._next_sink_id = 0
        self.presence = PresenceRegistries()
        #: capacity leases and admission queues (callers pass ``now()``)
        self.leases = LeaseTables(self.presence.alive)
        #: host telemetry histories per node (callers pass ``now()``)
        self.telemetry = TelemetryHistories()
        #: the monitor election and its fenced host facts (``memory_monitor``)
        self.monitor = MonitorTables(self)
        #: which nodes served which prefix blocks (callers pass ``now()``)
        self.affinity = PrefixTables()
        #: payloads lost because a subscriber's buffer was full
        self.dropped = 0

    # -- time ---------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def _tick(self) -> float:
        """Read the clock once for this call and forget everything that expired by then."""
        now = self._clock()
        heap = self._expiry_heap
        while heap and heap[0][0] <= now:
            deadline, key = heapq.heappop(heap)
            if self._deadlines.get(key) == deadline:
                del self._deadlines[key]
                del self._values[key]
        rate_heap = self._rate_heap
        while rate_heap and rate_heap[0][0] <= now:
            _, key = heapq.heappop(rate_heap)
            log = self._rate_logs.get(key)
            if log is not None and (not log or log[-1] + self._rate_periods[key] <= now):
                del self._rate_logs[key]
                del self._rate_periods[key]
                self._rate_tokens.pop(key, None)
        return now

    def _store(self, key: str, value: bytes, ttl_s: float | None, now: float) -> None:
        self._values[key] = value
        if ttl_s is None:
            self._deadlines.pop(key, None)
        else:
            self._expire_at(key, now + ttl_s)

    def _expire_at(self, key: str, deadline: float) -> None:
        self._deadlines[key] = deadline
        heapq.heappush(self._expiry_heap, (deadline, key))

    def _remove(self, key: str) -> None:
        self._values.pop(key, None)
        self._deadlines.pop(key, None)

    # -- keys ---------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        self._tick()
        return self._values.get(key)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self._tick()
        return [self._values.get(key) for key in keys]

    def set(
        self, key: str, value: bytes, *, ttl_s: float | None = None, only_if_absent: bool = False
    ) -> bool:
        _check_ttl(ttl_s)
        now = self._tick()
        if only_if_absent and key in self._values:
            return False
        self._store(key, bytes(value), ttl_s, now)
        return True

    def swap(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bytes | None:
        _check_ttl(ttl_s)
        now = self._tick()
        previous = self._values.get(key)
        self._store(key, bytes(value), ttl_s, now)
        return previous

    def compare_and_set(
        self,
        key: str,
        expected: bytes | None,
        value: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        _check_ttl(ttl_s)
        now = self._tick()
        if self._values.get(key) != expected:
            return False
        if value is None:
            self._remove(key)
        else:
            self._store(key, bytes(value), ttl_s, now)
        return True

    def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        _check_ttl(ttl_s)
        now = self._tick()
        if key not in self._values or self._values[key] != expected:
            return False
        self._expire_at(key, now + ttl_s)
        return True

    def delete(self, key: str) -> None:
        self._tick()
        self._remove(key)

    def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        _check_ttl(ttl_s)
        now = self._tick()
        current = self._values.get(key)
        if current is None:
            new = amount
            self._store(key, str(new).encode(), ttl_s, now)
        else:
            # Like INCRBY: the value must be a decimal integer, and the TTL is left alone.
            new = int(current) + amount
            self._values[key] = str(new).encode()
        return new

    def keys_with_prefix(self, prefix: str) -> list[str]:
        self._tick()
        return sorted(key for key in self._values if key.startswith(prefix))

    def ttl(self, key: str) -> float | None:
        """Seconds left before ``key`` expires (None: absent or no expiry). For tests and tools."""
        now = self._tick()
        deadline = self._deadlines.get(key)
        return None if deadline is None else deadline - now

    def rate_limit(
        self, key: str, *, limit: int, period_s: float, token: str | None = None
    ) -> RateDecision:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, got {period_s!r}")
        now = self._tick()
        log = self._rate_logs.get(key)
        if log is None:
            log = self._rate_logs[key] = deque()
        self._rate_periods[key] = period_s
        # The window is (now - period, now]: a call exactly one period old no longer counts.
        horizon = now - period_s
        while log and log[0] <= horizon:
            log.popleft()
        tokens = self._rate_tokens.setdefault(key, {})
        if token is not None:
            counted_at = tokens.get(token)
            if counted_at is not None and counted_at > horizon:  # asked again: counted once
                return RateDecision(allowed=True, retry_after_s=0.0, remaining=limit - len(log))
        if len(log) < limit:
            log.append(now)
            heapq.heappush(self._rate_heap, (now + period_s, key))
            if token is not None:
                if len(tokens) >= 2 * limit:  # bounded: only the window's tokens can matter
                    self._rate_tokens[key] = tokens = {
                        t: at for t, at in tokens.items() if at > horizon
                    }
                tokens[token] = now
            return RateDecision(allowed=True, retry_after_s=0.0, remaining=limit - len(log))
        if not log:  # pragma: no cover - limit >= 1 makes this unreachable
            return RateDecision(allowed=False, retry_after_s=period_s, remaining=0)
        # The oldest counted calls leave the window one by one; we need len - limit + 1 of them.
        releasing = log[len(log) - limit]
        retry_after = max(releasing + period_s - now, 0.0)
        return RateDecision(allowed=False, retry_after_s=retry_after, remaining=0)

    def presence_read(self, registry: str, *, stall_after_s: float) -> PresenceView:
        return self.presence.read(registry, now=self._tick(), stall_after_s=stall_after_s)

    def presence_beat(
        self,
        registry: str,
        member: str,
        data: bytes,
        *,
        stall_after_s: float,
        forget_after_s: float,
    ) -> PresenceView:
        now = self._tick()
        return self.presence.beat(
            registry,
            member,
            data,
            now=now,
            stall_after_s=stall_after_s,
            forget_after_s=forget_after_s,
        )

    # -- bus ----------------------------------------------------------------------------------

    def add_subscriber(self, channel: str, sink: Sink) -> int:
        """Register ``sink`` for ``channel``; returns a token for ``remove_subscriber``."""
        token = self._next_sink_id
        self._next_sink_id += 1
        self._channels.setdefault(channel, _Channel()).sinks[token] = sink
        return token

    def remove_subscriber(self, channel: str, token: int) -> None:
        entry = self._channels.get(channel)
        if entry is None:
            return
        entry.sinks.pop(token, None)
        if not entry.sinks:
            del self._channels[channel]

    def publish(self, channel: str, payload: bytes) -> int:
        """Offer ``payload`` to every subscriber; returns how many subscribers there were.

        A subscriber that cannot take the message (full buffer) still counts, as with Redis
        PUBLISH: it is alive, just slow. The loss is counted in ``dropped``.
        """
        self._tick()
        entry = self._channels.get(channel)
        if entry is None:
            return 0
        payload = bytes(payload)
        sinks = list(entry.sinks.values())
        for sink in sinks:
            if not sink(payload):
                self.dropped += 1
        return len(sinks)

    def subscriber_count(self, channel: str) -> int:
        entry = self._channels.get(channel)
        return 0 if entry is None else len(entry.sinks)

    # -- introspection ------------------------------------------------------------------------

    def size(self) -> dict[str, int]:
        """Entry counts, to check that memory stays flat."""
        return {
            "keys": len(self._values),
            "expiry_heap": len(self._expiry_heap),
            "rate_logs": len(self._rate_logs),
            "rate_heap": len(self._rate_heap),
            "channels": len(self._channels),
            "presence": self.presence.size(),
            "leases": self.leases.size(),
        }
