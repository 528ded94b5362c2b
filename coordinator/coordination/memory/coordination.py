"""The embedded coordination backend: one process, no Redis.

Two layers:

* ``MemoryState`` (``memory_state.py``) — plain synchronous state. Every decision reads the injected clock, never wall
  time, randomness or hash order, so the simulator can drive it on virtual time and get the same
  trace for the same seed. Expired keys are removed before every call (a heap of deadlines), so
  memory stays flat even for keys nobody reads again.
* ``MemoryCoordination`` — the async ``Coordination`` facade over one ``MemoryState``. Each call
  checkpoints once, then runs the state method synchronously, which is what makes it atomic.

Pub/sub is at-most-once like Redis: a subscriber whose buffer is full loses the message (counted
in ``dropped``), and ``publish`` never blocks.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Self

import trio

from coordinator.coordination.base import (
    Coordination,
    CoordinationUnavailable,
    PresenceView,
    RateDecision,
    Subscription,
)
from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    LeaseUsage,
    NodeFacts,
)
from coordinator.coordination.memory.state import MemoryState, Sink
from coordinator.coordination.monitor_types import HostFacts, MonitorClaim, MonitorStatus

__all__ = ["MemoryCoordination", "MemoryState", "MemorySubscription", "Sink"]


DEFAULT_SUBSCRIBER_BUFFER = 10_000


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

    async def swap_many(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        ttl_s: float | None = None,
        bump: str | None = None,
    ) -> list[bytes | None]:
        state = await self._enter()  # one step: nothing runs between the swaps and the bump
        previous = [state.swap(key, value, ttl_s=ttl_s) for key, value in items]
        if bump is not None and items:
            state.incr(bump)
        return previous

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
        return (await self._enter()).presence_read(registry, stall_after_s=stall_after_s)

    async def presence_leave(self, registry: str, member: str) -> None:
        (await self._enter()).presence.leave(registry, member)

    # -- capacity leases -----------------------------------------------------------------------

    async def put_node_facts(self, facts: NodeFacts) -> None:
        (await self._enter()).leases.put_facts(facts)

    async def drop_node_facts(self, node_id: str, conn_id: str) -> None:
        (await self._enter()).leases.drop_facts(node_id, conn_id)

    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        state = await self._enter()
        return state.leases.admit(ask, rules, state.now())

    async def renew_leases(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> list[bool]:
        state = await self._enter()
        return state.leases.renew(leases, ttl_s, state.now())

    async def release(self, release: LeaseRelease, rules: AdmissionRules) -> list[tuple[str, str]]:
        state = await self._enter()
        return state.leases.release(release, rules, state.now())

    async def lease_usage(self, node_ids: Sequence[str]) -> dict[str, LeaseUsage]:
        state = await self._enter()
        return state.leases.usage(node_ids, state.now())

    async def queue_depths(self, models: Sequence[str], rules: AdmissionRules) -> dict[str, int]:
        state = await self._enter()
        return state.leases.queue_depths(models, rules, state.now())

    # -- host telemetry -------------------------------------------------------------------------

    async def append_telemetry(
        self, node_id: str, sample: bytes, *, keep: int, ttl_s: float
    ) -> None:
        state = await self._enter()
        state.telemetry.append(node_id, sample, keep, ttl_s, state.now())

    async def telemetry_history(self, node_id: str) -> list[bytes]:
        state = await self._enter()
        return state.telemetry.history(node_id, state.now())

    async def latest_telemetry(self, node_ids: Sequence[str]) -> dict[str, bytes]:
        state = await self._enter()
        return state.telemetry.latest(node_ids, state.now())

    # -- the monitor election and fenced facts ---------------------------------------------------

    async def monitor_acquire(self, candidate: str, ttl_s: float) -> MonitorClaim:
        return (await self._enter()).monitor.acquire(candidate, ttl_s)

    async def monitor_renew(self, candidate: str, epoch: int, ttl_s: float) -> bool:
        return (await self._enter()).monitor.renew(candidate, epoch, ttl_s)

    async def monitor_resign(self, candidate: str, epoch: int) -> bool:
        return (await self._enter()).monitor.resign(candidate, epoch)

    async def monitor_status(self) -> MonitorStatus:
        return (await self._enter()).monitor.status()

    async def write_host_facts(
        self, candidate: str, epoch: int, host_id: str, record: bytes, *, fenced: bool = True
    ) -> bool:
        state = await self._enter()
        return state.monitor.write(candidate, epoch, host_id, record, fenced=fenced)

    async def host_facts(self, host_ids: Sequence[str] | None = None) -> dict[str, HostFacts]:
        return (await self._enter()).monitor.read(host_ids)

    async def accepted_fact_writes(self, epoch: int) -> int:
        return (await self._enter()).monitor.accepted(epoch)

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
