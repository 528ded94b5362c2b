"""Coordination backends: one interface (the roles of roles.py), two implementations.

A backend is one object per role (keys, rate limits, presence, leases, telemetry, the monitor,
pub/sub) on one shared link to its store, handed out by its bundle (``Coordination``);
whoever opens it gives each caller the one role it uses. ``memory/`` is the embedded default
(single instance, tests, simulator); ``redis/`` lets any number of instances share one
Redis/Valkey. Both honour the same semantics, proven by one contract suite in
tests/coordinator/test_coordination_contract.py (capacity leases and the admission queue:
tests/coordinator/test_lease_contract.py).

The instance bus likewise (``bus/``): one interface, three implementations, proven by
tests/coordinator/test_bus_contract.py.

base.py          the types the roles share, and CoordinationUnavailable
roles.py         the interface: one small Protocol per role, with its semantics
bundle.py        the bundle that hands a backend's roles out (``Coordination``), its lifecycle
keys.py          every key and channel name of the shared store
leases.py        capacity leases and the admission queue: types and semantics
monitor_types.py the monitor election and fenced host facts: types and semantics
factory.py       the backend and bus named by the settings
memory/          the memory backend
redis/           the Redis backend
bus/             the instance bus
"""

from typing import TYPE_CHECKING

from coordinator.coordination.base import (
    CoordinationUnavailable,
    PresenceEntry,
    PresenceView,
    RateDecision,
    Subscription,
)
from coordinator.coordination.bundle import Coordination
from coordinator.coordination.bus.base import Bus, PubSubBus
from coordinator.coordination.bus.memory import MemoryBus, MemoryBusHub
from coordinator.coordination.factory import create_bus, create_coordination
from coordinator.coordination.memory.coordination import MemoryCoordination, MemoryState
from coordinator.coordination.roles import (
    ROLES,
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
    "ROLES",
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
