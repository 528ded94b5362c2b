"""Coordination backends: one interface (base.Coordination), two implementations.

``memory`` is the embedded default (single instance, tests, simulator); ``redis`` lets any
number of instances share one Redis/Valkey. Both honour the same semantics, proven by one
contract suite in tests/coordinator/test_coordination_contract.py (capacity leases and the
admission queue: tests/coordinator/test_lease_contract.py).

The instance bus likewise: one interface (bus.Bus), three implementations — ``PubSubBus`` over
either backend's pub/sub, ``StreamsBus`` (streams_bus.py, Redis only) and the in-process
``MemoryBus`` (memory_bus.py) — proven by tests/coordinator/test_bus_contract.py.

base.py                 the interface, its semantics and CoordinationUnavailable
roles.py                the interface cut into one small Protocol per concern (what callers take)
leases.py               capacity leases and the admission queue: types and semantics
factory.py              the backend and bus named by the settings
bus.py                  the instance bus interface and PubSubBus
memory.py               the memory backend's async facade
memory_state.py         its synchronous state on an injected clock
memory_presence.py      its presence registries
memory_leases.py        its leases and queues (the reference semantics)
memory_telemetry.py     its host telemetry histories
memory_monitor.py       its monitor election and fenced host facts
monitor_types.py        the monitor election and fenced host facts: types, keys, semantics
memory_bus.py           the in-process bus
memory_bus_hub.py       the hub the in-process buses of one process share
redis.py                the Redis backend: keys, rate limits, presence, pub/sub
redis_leases.py         its leases and queues (a mixin of RedisCoordination)
redis_link.py           its connections: lanes, timeouts, error mapping, cluster routing
redis_cluster.py        Redis Cluster: the URL form, hash slots, the {prefix} tag
redis_sentinel.py       Redis Sentinel: the URL form of the sentinels and the service
redis_errors.py         how it classifies and reports failures
redis_scripts.py        the Lua scripts of its compound operations
redis_lease_scripts.py  the Lua scripts of its leases and queues
redis_telemetry.py      its host telemetry histories (a mixin, with their scripts)
redis_monitor.py        its monitor election and fenced facts (a mixin, with their scripts)
redis_subscription.py   one subscription's connection and pump
redis_lean.py           the lean pub/sub path's RESP connection (hiredis over a trio socket)
redis_lean_publisher.py its PUBLISH: one writer that pipelines, replies handed back in order
redis_lean_subscription.py  its SUBSCRIBE: the iterating task reads the socket itself
redis_acl.py            the least ACL rights of one instance (gemmanet redis-acl)
redis_tls.py            rediss:// verified against a private CA (GEMMANET_REDIS_CA_FILE)
streams_bus.py          the instance bus over Redis streams
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
    from coordinator.coordination.redis import RedisCoordination

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
        from coordinator.coordination.redis import RedisCoordination

        return RedisCoordination
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
