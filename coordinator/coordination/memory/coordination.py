"""The embedded coordination backend: one process, no Redis.

Three layers:

* ``MemoryState`` (``state.py``) — plain synchronous state. Every decision reads the injected
  clock, never wall time, randomness or hash order, so the simulator can drive it on virtual
  time and get the same trace for the same seed. Expired keys are removed before every call (a
  heap of deadlines), so memory stays flat even for keys nobody reads again.
* ``MemoryLink`` (``link.py``) — one client of a state: several on one state model several
  instances sharing a backend, each closing on its own.
* the role objects (``roles.py``, ``pubsub.py``) — async facades over one link. Each call
  checkpoints once, then runs the state method synchronously, which is what makes it atomic.

``MemoryCoordination`` is the bundle that hands them out (``bundle.Coordination``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from coordinator.coordination.bundle import Coordination
from coordinator.coordination.memory.link import MemoryLink
from coordinator.coordination.memory.pubsub import DEFAULT_SUBSCRIBER_BUFFER, MemoryPubSub
from coordinator.coordination.memory.roles import (
    MemoryAffinity,
    MemoryKeyValue,
    MemoryLeases,
    MemoryMonitor,
    MemoryPresence,
    MemoryRateLimits,
    MemoryTelemetry,
)
from coordinator.coordination.memory.state import MemoryState, Sink

__all__ = ["MemoryCoordination", "MemoryState", "Sink"]


class MemoryCoordination(Coordination):
    """Every role over one ``MemoryState`` (single process)."""

    kind = "memory"

    key_value: MemoryKeyValue
    rate_limits: MemoryRateLimits
    presence: MemoryPresence
    leases: MemoryLeases
    telemetry: MemoryTelemetry
    monitor: MemoryMonitor
    pubsub: MemoryPubSub
    affinity: MemoryAffinity

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        state: MemoryState | None = None,
        subscriber_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
    ) -> None:
        # Passing one ``state`` to several bundles models several instances sharing a backend.
        self.state = state if state is not None else MemoryState(clock)
        self.link = link = MemoryLink(self.state)
        self.key_value = MemoryKeyValue(link)
        self.rate_limits = MemoryRateLimits(link)
        self.presence = MemoryPresence(link)
        self.leases = MemoryLeases(link)
        self.telemetry = MemoryTelemetry(link)
        self.monitor = MemoryMonitor(link)
        self.pubsub = MemoryPubSub(link, subscriber_buffer=subscriber_buffer)
        self.affinity = MemoryAffinity(link)

    async def ping(self) -> None:
        await self.link.enter()

    async def aclose(self) -> None:
        self.link.close()
