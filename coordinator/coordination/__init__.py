"""Coordination backends: one interface (base.Coordination), two implementations.

``memory/`` is the embedded default (single instance, tests, simulator); ``redis/`` lets any
number of instances share one Redis/Valkey. Both honour the same semantics, proven by one
contract suite in tests/coordinator/test_coordination_contract.py (capacity leases and the
admission queue: tests/coordinator/test_lease_contract.py).

The instance bus likewise (``bus/``): one interface, three implementations, proven by
tests/coordinator/test_bus_contract.py.

base.py          the interface, its semantics and CoordinationUnavailable
roles.py         the interface cut into one small Protocol per concern (what callers take)
leases.py        capacity leases and the admission queue: types and semantics
monitor_types.py the monitor election and fenced host facts: types, keys, semantics
factory.py       the backend and bus named by the settings
memory/          the memory backend
redis/           the Redis backend
bus/             the instance bus
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
from coordinator.coordination.bus.base import Bus, PubSubBus
from coordinator.coordination.bus.memory import MemoryBus, MemoryBusHub
from coordinator.coordination.factory import create_bus, create_coordination
from coordinator.coordination.memory.coordination import MemoryCoordination, MemoryState
from coordinator.coordination.roles import (
    KeyValue,
    Leases,
    Lifecycle,
    MonitorStore,
    Presence,
    PubSub,
    RateLimits,
    TelemetryStore,
)

if TYPE_CHECKING:
    from coordinator.coordination.redis.coordination import RedisCoordination

__all__ = [
    "Bus",
    "Coordination",
    "CoordinationUnavailable",
    "KeyValue",
    "Leases",
    "Lifecycle",
    "MemoryBus",
    "MemoryBusHub",
    "MemoryCoordination",
    "MemoryState",
    "MonitorStore",
    "Presence",
    "PresenceEntry",
    "PresenceView",
    "PubSub",
    "PubSubBus",
    "RateDecision",
    "RateLimits",
    "RedisCoordination",
    "Subscription",
    "TelemetryStore",
    "create_bus",
    "create_coordination",
]


def __getattr__(name: str) -> object:
    # RedisCoordination imports coredis (~0.25 s); load it only when someone asks for it.
    if name == "RedisCoordination":
        from coordinator.coordination.redis.coordination import RedisCoordination

        return RedisCoordination
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
