"""Pick the coordination backend and the instance bus from the settings.

``GEMMANET_REDIS_URL`` unset: the embedded memory backend (one instance). Set: Redis, with the
password read from ``GEMMANET_REDIS_PASSWORD_FILE``, every key under ``GEMMANET_KEY_PREFIX`` and,
for rediss://, the server verified against ``GEMMANET_REDIS_CA_FILE`` when set.
Both backends are async context managers; enter the result once, in the task that owns the
app's lifetime::

    async with create_coordination(settings.redis_url, ...) as coordination:
        ...
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from coordinator.coordination.bundle import Coordination
from coordinator.coordination.bus.base import Bus, PubSubBus
from coordinator.coordination.bus.memory import MemoryBus, MemoryBusHub
from coordinator.coordination.memory.coordination import MemoryCoordination

if TYPE_CHECKING:
    from coordinator.coordination.redis.coordination import RedisCoordination
    from coordinator.settings import Settings

__all__ = ["BUS_NAMES", "coordination_for", "create_bus", "create_coordination"]

#: values of GEMMANET_BUS
BUS_NAMES = ("pubsub", "streams")


def coordination_for(
    settings: Settings, *, clock: Callable[[], float] = time.monotonic
) -> MemoryCoordination | RedisCoordination:
    """``create_coordination`` with every connection setting of ``settings`` (URL, password
    file, key prefix, TLS files): what the server, the monitor and the audit open."""
    return create_coordination(
        settings.redis_url,
        password_file=settings.redis_password_file,
        key_prefix=settings.key_prefix,
        ca_file=settings.redis_ca_file,
        cert_file=settings.redis_cert_file,
        key_file=settings.redis_key_file,
        clock=clock,
    )


def create_coordination(
    redis_url: str | None,
    *,
    password_file: str | None = None,
    key_prefix: str = "gn",
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    op_timeout_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> MemoryCoordination | RedisCoordination:
    """The memory backend when ``redis_url`` is empty, else Redis (``clock`` is memory-only:
    Redis judges time by its own clock)."""
    if not redis_url:
        return MemoryCoordination(clock)
    # Imported here: coredis costs a quarter of a second to import, memory users don't pay it.
    from coordinator.coordination.redis.connect.tls import private_ca_context
    from coordinator.coordination.redis.coordination import RedisCoordination

    # With a CA file, the server certificate is verified against it (docs/redis.md "Redis identities
    # and TLS"); without, coredis reads the rediss:// URL's ssl_* parameters itself.
    ssl_context = private_ca_context(ca_file, cert_file, key_file) if ca_file else None
    return RedisCoordination.from_url_and_password_file(
        redis_url,
        password_file,
        key_prefix,
        op_timeout_s=op_timeout_s,
        ssl_context=ssl_context,
    )


def create_bus(
    name: str, coordination: Coordination, *, memory_hub: MemoryBusHub | None = None
) -> Bus:
    """The instance bus ``name`` (``GEMMANET_BUS``): ``pubsub`` over ``coordination``'s
    publish/subscribe, ``streams`` on Redis Streams (over the Redis backend's link). With
    ``memory_hub``, the in-process ``MemoryBus`` on that hub instead, with the same semantics
    (durable for ``streams``)."""
    if name not in BUS_NAMES:
        raise ValueError(f"unknown bus {name!r}: expected one of {', '.join(BUS_NAMES)}")
    if memory_hub is not None:
        return MemoryBus(hub=memory_hub, durable=name == "streams")
    if name == "streams":
        from coordinator.coordination.bus.streams import StreamsBus
        from coordinator.coordination.redis.coordination import RedisCoordination

        if not isinstance(coordination, RedisCoordination):
            raise TypeError(
                "GEMMANET_BUS=streams needs the Redis coordination backend (set "
                f"GEMMANET_REDIS_URL); got {type(coordination).__name__}"
            )
        return StreamsBus(coordination.link)
    return PubSubBus(coordination.pubsub)
