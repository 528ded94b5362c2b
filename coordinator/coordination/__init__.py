"""Coordination backends: one interface (base.Coordination), two implementations.

``memory`` is the embedded default (single instance, tests, simulator); ``redis`` lets any
number of instances share one Redis/Valkey. Both honour the same semantics, proven by one
contract suite in tests/coordinator/test_coordination_contract.py.

The instance bus likewise: one interface (bus.Bus), three implementations — ``PubSubBus`` over
either backend's pub/sub, ``StreamsBus`` (streams_bus.py, Redis only) and the in-process
``MemoryBus`` (memory_bus.py) — proven by tests/coordinator/test_bus_contract.py.
"""

from typing import TYPE_CHECKING

from coordinator.coordination.base import (
    Coordination,
    CoordinationUnavailable,
    PresenceEntry,
    PresenceView,
    RateDecision,
    Subscription,
)
from coordinator.coordination.bus import Bus, PubSubBus
from coordinator.coordination.factory import create_bus, create_coordination
from coordinator.coordination.memory import MemoryCoordination, MemoryState
from coordinator.coordination.memory_bus import MemoryBus, MemoryBusHub

if TYPE_CHECKING:
    from coordinator.coordination.redis import RedisCoordination

__all__ = [
    "Bus",
    "Coordination",
    "CoordinationUnavailable",
    "MemoryBus",
    "MemoryBusHub",
    "MemoryCoordination",
    "MemoryState",
    "PresenceEntry",
    "PresenceView",
    "PubSubBus",
    "RateDecision",
    "RedisCoordination",
    "Subscription",
    "create_bus",
    "create_coordination",
]


def __getattr__(name: str) -> object:
    # RedisCoordination imports coredis (~0.25 s); load it only when someone asks for it.
    if name == "RedisCoordination":
        from coordinator.coordination.redis import RedisCoordination

        return RedisCoordination
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
