"""Where a routed link's connections go: the master of its home slot (Redis Cluster) or the
master the sentinels name (Redis Sentinel). ``RedisLink`` asks once, and again after a
failover, a ``MOVED`` or a ``READONLY`` (``cluster.py``, ``sentinel.py``: the URL forms)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from coredis import BaseConnection
from coredis.connection import TCPLocation
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import ResponseError

from coordinator.coordination.redis.connect.cluster import slot_owner
from coordinator.coordination.redis.connect.sentinel import SentinelTarget

__all__ = ["Connect", "sentinel_master", "slot_master"]


class Connect(Protocol):
    """Opens a running connection to ``location`` (``RedisLink._connect``)."""

    def __call__(
        self, location: TCPLocation | None, *, to_sentinel: bool = False
    ) -> Awaitable[BaseConnection]: ...


async def slot_master(
    connect: Connect, seeds: Sequence[TCPLocation], slot: int
) -> tuple[TCPLocation | None, list[TCPLocation]]:
    """The master serving ``slot`` by CLUSTER SLOTS of the first seed that answers (None: no
    master serves it), and every master that answer names (the seeds of the next discovery)."""
    failure: Exception | None = None
    for location in dict.fromkeys(seeds):
        try:
            connection = await connect(location)
        except RedisConnectionError as exc:
            failure = exc
            continue
        try:
            reply: Any = await connection.create_request(b"CLUSTER", b"SLOTS", decode=False)
        except RedisConnectionError as exc:
            failure = exc
            continue
        finally:
            connection.invalidate("cluster discovery done")
        # A master announced without an address is reachable where the seed is.
        masters = [
            TCPLocation(bytes(entry[2][0]).decode() or location.host, int(entry[2][1]))
            for entry in reply
        ]
        owner = slot_owner(reply, slot)
        if owner is None:
            return None, masters
        return TCPLocation(owner[0] or location.host, owner[1]), masters
    assert failure is not None
    raise failure


async def sentinel_master(connect: Connect, sentinel: SentinelTarget) -> TCPLocation:
    """The master the first answering sentinel names, once it says ``ROLE`` master (a
    sentinel that has not noticed a failover yet may still name the dead or demoted one)."""
    failure: Exception = RedisConnectionError("no sentinel answered")
    for host, port in sentinel.sentinels:
        try:
            connection = await connect(TCPLocation(host, port), to_sentinel=True)
        except RedisConnectionError as exc:
            failure = exc
            continue
        try:
            reply: Any = await connection.create_request(
                b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", sentinel.service, decode=False
            )
        except RedisConnectionError as exc:
            failure = exc
            continue
        finally:
            connection.invalidate("sentinel asked")
        if not reply:
            raise ResponseError(f"the sentinels know no master {sentinel.service!r}")
        master = TCPLocation(bytes(reply[0]).decode(), int(reply[1]))
        connection = await connect(master)
        try:
            role: Any = await connection.create_request(b"ROLE", decode=False)
        finally:
            connection.invalidate("role checked")
        if role[0] != b"master":
            raise ResponseError(f"READONLY {master} is not a master (failover under way)")
        return master
    raise failure
