"""The ``PubSub`` role on Redis: PUBLISH, SUBSCRIBE and PUBSUB NUMSUB.

PUBLISH and SUBSCRIBE take the lean path (``lean/``: RESP parsed by hiredis over a trio socket)
unless ``bus_client="coredis"`` (``GEMMANET_REDIS_BUS_CLIENT``); same semantics either way.

Each subscription has its own connection. Losing it makes the iterator raise
``CoordinationUnavailable``: the caller re-subscribes and treats in-flight work as possibly lost.
A paused server is not a loss (see ``subscription.py``).

On a cluster the bus is sharded pub/sub: a PUBLISH there is copied to every node over the
cluster bus, an SPUBLISH only to the master of the channel's slot (the home slot).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import trio
from coredis import BaseConnection

from coordinator.coordination.base import Subscription
from coordinator.coordination.redis.connect.link import Operation, RedisLink
from coordinator.coordination.redis.lean.connection import (
    LeanConnection,
    LeanTarget,
    open_lean_connection,
)
from coordinator.coordination.redis.lean.publisher import LeanPublisher, publish_command
from coordinator.coordination.redis.lean.subscription import LeanSubscription
from coordinator.coordination.redis.subscription import RedisSubscription

__all__ = ["BUS_CLIENTS", "DEFAULT_SUBSCRIBER_BUFFER", "RedisPubSub"]

DEFAULT_SUBSCRIBER_BUFFER = 10_000
#: the clients PUBLISH and SUBSCRIBE can take (GEMMANET_REDIS_BUS_CLIENT); the first is default
BUS_CLIENTS = ("lean", "coredis")


class RedisPubSub:
    """``PubSub`` on the channels of one link's prefix (the ``SubscriptionHost`` of its
    subscriptions)."""

    def __init__(
        self,
        link: RedisLink,
        *,
        bus_client: str = BUS_CLIENTS[0],
        keepalive_s: float = 5.0,
        stall_s: float = 10.0,
        subscriber_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
    ) -> None:
        if bus_client not in BUS_CLIENTS:
            raise ValueError(f"bus_client must be one of {BUS_CLIENTS}, got {bus_client!r}")
        self._link = link
        self.bus_client = bus_client
        # The lean path connects where coredis's pool would, as whom it would, with its TLS.
        # Not on a cluster or behind Sentinel: there the link routes every connection to the
        # master of the moment (MOVED, rediscovery), and the lean path holds one fixed address.
        lean = bus_client == "lean" and not link.routed
        self._lean_target = LeanTarget.from_pool(link.pool) if lean else None
        self._lean_publisher: LeanPublisher | None = None
        self._lean_lock = trio.Lock()
        self.subscription_keepalive_s = keepalive_s
        #: how long an idle subscription's PING may go unanswered before it counts as lost
        self.subscription_stall_s = stall_s
        self._subscriber_buffer = subscriber_buffer

    @property
    def closed(self) -> bool:
        return self._link.closed

    async def publish(self, channel: str, payload: bytes) -> int:
        link = self._link
        if self._lean_target is None:
            command = b"SPUBLISH" if link.cluster else b"PUBLISH"
            return int(
                await link.execute(command.decode(), command, link.redis_key(channel), payload)
            )
        command = publish_command(link.redis_key(channel).encode(), payload)

        async def operation(op: Operation) -> int:
            publisher = await self._open_lean_publisher()
            op.waiting_on = publisher
            return int(await publisher.request(command))

        return await link.guarded("PUBLISH", operation)

    async def _open_lean_publisher(self) -> LeanPublisher:
        """The lean publisher, (re)opened on demand like a lane of the coredis path."""
        publisher = self._lean_publisher
        if publisher is not None and publisher.usable:
            return publisher
        async with self._lean_lock:
            publisher = self._lean_publisher
            if publisher is None or not publisher.usable:
                connection = await self._open_lean_connection()
                publisher = LeanPublisher(connection)
                await self._link.require_nursery().start(self._run_lean_publisher, publisher)
                self._lean_publisher = publisher
            return publisher

    async def _run_lean_publisher(
        self, publisher: LeanPublisher, *, task_status: trio.TaskStatus[None]
    ) -> None:
        try:
            await publisher.run(task_status=task_status)
        finally:
            self._link.untrack(publisher.connection)

    async def _open_lean_connection(self) -> LeanConnection:
        self._link.require_nursery()
        assert self._lean_target is not None
        connection = await open_lean_connection(self._lean_target)
        if self._link.closed:
            connection.invalidate("coordination closed")
        self._link.track(connection)
        return connection

    async def subscriber_count(self, channel: str) -> int:
        link = self._link
        sub = b"SHARDNUMSUB" if link.cluster else b"NUMSUB"
        reply = await link.execute(
            "PUBSUB " + sub.decode(), b"PUBSUB", sub, link.redis_key(channel)
        )
        if isinstance(reply, dict):
            values = list(reply.values())
        else:
            values = list(reply)[1::2]
        return int(values[0]) if values else 0

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        if self._lean_target is not None:
            return self._lean_subscribe(channel)
        return self._subscribe(channel)

    @asynccontextmanager
    async def _lean_subscribe(self, channel: str) -> AsyncIterator[LeanSubscription]:
        link = self._link
        subscription = LeanSubscription(self, channel, link.redis_key(channel))
        holder: list[LeanConnection] = []

        async def open_and_subscribe(op: Operation) -> None:
            connection = await self._open_lean_connection()
            holder.append(connection)
            op.waiting_on = connection
            await subscription.open(connection)

        try:
            await link.guarded(f"SUBSCRIBE {channel!r}", open_and_subscribe)
        except BaseException:
            for connection in holder:
                connection.invalidate("subscribe failed")
                link.untrack(connection)
            raise
        try:
            yield subscription
        finally:
            await subscription.close(link.op_timeout_s)
            link.untrack(holder[0])

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[RedisSubscription]:
        link = self._link
        nursery = link.require_nursery()
        subscription = RedisSubscription(
            self, channel, link.redis_key(channel), self._subscriber_buffer, sharded=link.cluster
        )
        connection: BaseConnection | None = None

        async def open_and_subscribe(op: Operation) -> None:
            nonlocal connection
            connection = await link.open_connection()
            await subscription.open(connection, nursery)

        try:
            await link.guarded(f"SUBSCRIBE {channel!r}", open_and_subscribe)
        except BaseException:
            if connection is not None:
                connection.invalidate("subscribe failed")
            raise
        try:
            yield subscription
        finally:
            await subscription.close(link.op_timeout_s)
