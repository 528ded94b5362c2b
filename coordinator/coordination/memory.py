"""The embedded coordination backend: one process, no Redis.

Two layers:

* ``MemoryState`` — plain synchronous state. Every decision reads the injected clock, never wall
  time, randomness or hash order, so the simulator can drive it on virtual time and get the same
  trace for the same seed. Expired keys are removed before every call (a heap of deadlines), so
  memory stays flat even for keys nobody reads again.
* ``MemoryCoordination`` — the async ``Coordination`` facade over one ``MemoryState``. Each call
  checkpoints once, then runs the state method synchronously, which is what makes it atomic.

Pub/sub is at-most-once like Redis: a subscriber whose buffer is full loses the message (counted
in ``dropped``), and ``publish`` never blocks.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Self

import trio

from coordinator.coordination.base import (
    Coordination,
    CoordinationUnavailable,
    PresenceView,
    RateDecision,
    Subscription,
)
from coordinator.coordination.memory_presence import PresenceRegistries

__all__ = ["MemoryCoordination", "MemoryState", "MemorySubscription", "Sink"]

#: A subscriber as the state sees it: offered each payload, returns False when it had to drop it.
Sink = Callable[[bytes], bool]

DEFAULT_SUBSCRIBER_BUFFER = 10_000


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
        self._rate_heap: list[tuple[float, str]] = []
        self._channels: dict[str, _Channel] = {}
        self._next_sink_id = 0
        self.presence = PresenceRegistries()
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

    def rate_limit(self, key: str, *, limit: int, period_s: float) -> RateDecision:
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
        if len(log) < limit:
            log.append(now)
            heapq.heappush(self._rate_heap, (now + period_s, key))
            return RateDecision(allowed=True, retry_after_s=0.0, remaining=limit - len(log))
        if not log:  # pragma: no cover - limit >= 1 makes this unreachable
            return RateDecision(allowed=False, retry_after_s=period_s, remaining=0)
        # The oldest counted calls leave the window one by one; we need len - limit + 1 of them.
        releasing = log[len(log) - limit]
        retry_after = max(releasing + period_s - now, 0.0)
        return RateDecision(allowed=False, retry_after_s=retry_after, remaining=0)

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
        }


class MemorySubscription(Subscription):
    """One subscriber's bounded buffer. Iteration ends when the block or the backend closes."""

    def __init__(self, receive: trio.MemoryReceiveChannel[bytes]) -> None:
        self._receive = receive
        #: messages this subscriber lost because its buffer was full
        self.dropped = 0

    def __aiter__(self) -> MemorySubscription:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None


class MemoryCoordination(Coordination):
    """The ``Coordination`` interface over a ``MemoryState`` (single process)."""

    kind = "memory"

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        state: MemoryState | None = None,
        subscriber_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
    ) -> None:
        # Passing one ``state`` to several facades models several instances sharing a backend.
        self.state = state if state is not None else MemoryState(clock)
        self._subscriber_buffer = subscriber_buffer
        self._closed = False
        # send side of each open subscription -> (channel, token), to unregister on aclose
        self._open: dict[trio.MemorySendChannel[bytes], tuple[str, int]] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _enter(self) -> MemoryState:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise CoordinationUnavailable("the memory coordination backend is closed")
        return self.state

    # -- keys ---------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        return (await self._enter()).get(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return (await self._enter()).get_many(keys)

    async def set(
        self, key: str, value: bytes, *, ttl_s: float | None = None, only_if_absent: bool = False
    ) -> bool:
        return (await self._enter()).set(key, value, ttl_s=ttl_s, only_if_absent=only_if_absent)

    async def swap(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bytes | None:
        return (await self._enter()).swap(key, value, ttl_s=ttl_s)

    async def compare_and_set(
        self,
        key: str,
        expected: bytes | None,
        value: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        return (await self._enter()).compare_and_set(key, expected, value, ttl_s=ttl_s)

    async def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        return (await self._enter()).refresh_if(key, expected, ttl_s)

    async def delete(self, key: str) -> None:
        (await self._enter()).delete(key)

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        return (await self._enter()).incr(key, amount, ttl_s=ttl_s)

    async def keys_with_prefix(self, prefix: str) -> list[str]:
        return (await self._enter()).keys_with_prefix(prefix)

    async def rate_limit(self, key: str, *, limit: int, period_s: float) -> RateDecision:
        return (await self._enter()).rate_limit(key, limit=limit, period_s=period_s)

    async def presence_beat(
        self,
        registry: str,
        member: str,
        data: bytes,
        *,
        stall_after_s: float,
        forget_after_s: float,
    ) -> PresenceView:
        return (await self._enter()).presence_beat(
            registry, member, data, stall_after_s=stall_after_s, forget_after_s=forget_after_s
        )

    async def presence_read(self, registry: str, *, stall_after_s: float) -> PresenceView:
        state = await self._enter()
        return state.presence.read(registry, now=state._tick(), stall_after_s=stall_after_s)

    async def presence_leave(self, registry: str, member: str) -> None:
        (await self._enter()).presence.leave(registry, member)

    # -- bus ----------------------------------------------------------------------------------

    async def publish(self, channel: str, payload: bytes) -> int:
        return (await self._enter()).publish(channel, payload)

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        return self._subscribe(channel)

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[MemorySubscription]:
        state = await self._enter()
        send, receive = trio.open_memory_channel[bytes](self._subscriber_buffer)
        subscription = MemorySubscription(receive)

        def offer(payload: bytes) -> bool:
            try:
                send.send_nowait(payload)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                subscription.dropped += 1
                return False
            return True

        token = state.add_subscriber(channel, offer)
        self._open[send] = (channel, token)
        try:
            yield subscription
        finally:
            state.remove_subscriber(channel, token)
            self._open.pop(send, None)
            send.close()
            receive.close()

    async def subscriber_count(self, channel: str) -> int:
        return (await self._enter()).subscriber_count(channel)

    # -- lifecycle ----------------------------------------------------------------------------

    async def ping(self) -> None:
        await self._enter()

    async def aclose(self) -> None:
        self._closed = True
        # Like a closed Redis connection: the subscriptions leave the (possibly shared) state,
        # and their iteration ends (shutdown, not an error).
        for send, (channel, token) in list(self._open.items()):
            self.state.remove_subscriber(channel, token)
            send.close()
        self._open.clear()
