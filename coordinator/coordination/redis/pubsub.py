"""The ``PubSub`` role on Redis: PUBLISH, SUBSCRIBE and PUBSUB NUMSUB.

PUBLISH and SUBSCRIBE take the lean client (``lean/``: RESP parsed by hiredis over a trio
socket), on every deployment: a single server, TLS and ACL users, a cluster, Sentinel. Its
connections go where the link's do (``RedisLink.master``: the URL's server, the master of the
deployment's slot, or the master the sentinels name), so the link's discovery is the one
answer; a MOVED reply is handed to the link (``rehome``) and the operation tried once more
there, and a lost or timed-out connection makes the link's guard ask again (a failover).

Each subscription has its own connection. Losing it makes the iterator raise
``CoordinationUnavailable``: the caller re-subscribes (at the master of that moment) and treats
in-flight work as possibly lost. A paused server is not a loss (see ``lean/subscription.py``).

On a cluster the bus is sharded pub/sub: a PUBLISH there is copied to every node over the
cluster bus, an SPUBLISH only to the master of the channel's slot (the home slot).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar

import trio
from coredis.connection import TCPLocation
from coredis.exceptions import MovedError

from coordinator.coordination.base import Subscription
from coordinator.coordination.redis.connect.link import Operation, RedisLink
from coordinator.coordination.redis.lean.connection import (
    LeanConnection,
    LeanTarget,
    open_lean_connection,
)
from coordinator.coordination.redis.lean.publisher import LeanPublisher, publish_command
from coordinator.coordination.redis.lean.subscription import LeanSubscription

__all__ = ["RedisPubSub"]

T = TypeVar("T")


class RedisPubSub:
    """``PubSub`` on the channels of one link's prefix (the ``SubscriptionHost`` of its
    subscriptions)."""

    def __init__(self, link: RedisLink, *, keepalive_s: float = 5.0, stall_s: float = 10.0) -> None:
        self._link = link
        # As whom and with which TLS the bus connects: the URL's, as the link's connections.
        self._target = LeanTarget.from_pool(link.pool, require_master=link.sentinel is not None)
        self._publisher: LeanPublisher | None = None
        # Where the publisher is connected: a publisher left on a demoted master would publish
        # to a replica's subscribers only (a replica takes PUBLISH), so it follows the link.
        self._publisher_at: TCPLocation | None = None
        self._publisher_lock = trio.Lock()
        self.subscription_keepalive_s = keepalive_s
        #: how long an idle subscription's PING may go unanswered before it counts as lost
        self.subscription_stall_s = stall_s

    @property
    def closed(self) -> bool:
        return self._link.closed

    async def _following_moved(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt``, once more after a MOVED reply (a cluster's slot moved: resharding or
        a failover), at the master the reply names."""
        try:
            return await attempt()
        except MovedError as exc:
            if not self._link.cluster:
                raise
            self._link.rehome(TCPLocation(exc.host, exc.port), "MOVED")
        return await attempt()

    async def publish(self, channel: str, payload: bytes) -> int:
        link = self._link
        command = publish_command(link.redis_key(channel).encode(), payload, sharded=link.cluster)

        async def operation(op: Operation) -> int:
            async def attempt() -> int:
                publisher = await self._open_publisher()
                op.waiting_on = publisher
                return int(await publisher.request(command))

            return await self._following_moved(attempt)

        return await link.guarded("PUBLISH", operation)

    async def _open_publisher(self) -> LeanPublisher:
        """The publisher, (re)opened on demand at the link's master of the moment."""
        where = await self._link.master()
        publisher = self._publisher
        if publisher is not None and publisher.usable and self._publisher_at == where:
            return publisher
        async with self._publisher_lock:
            where = await self._link.master()
            publisher = self._publisher
            if publisher is None or not publisher.usable or self._publisher_at != where:
                if publisher is not None:
                    publisher.invalidate("the master moved")
                connection = await self._open_connection(where)
                publisher = LeanPublisher(connection)
                await self._link.require_nursery().start(self._run_publisher, publisher)
                self._publisher, self._publisher_at = publisher, where
            return publisher

    async def _run_publisher(
        self, publisher: LeanPublisher, *, task_status: trio.TaskStatus[None]
    ) -> None:
        try:
            await publisher.run(task_status=task_status)
        finally:
            self._link.untrack(publisher.connection)

    async def _open_connection(self, where: TCPLocation | None) -> LeanConnection:
        self._link.require_nursery()
        connection = await open_lean_connection(self._target.at(where))
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
        return self._subscribe(channel)

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[LeanSubscription]:
        link = self._link
        subscription = LeanSubscription(
            self, channel, link.redis_key(channel), sharded=link.cluster
        )
        opened: list[LeanConnection] = []

        async def open_and_subscribe(op: Operation) -> None:
            async def attempt() -> None:
                connection = await self._open_connection(await link.master())
                opened.append(connection)
                op.waiting_on = connection
                await subscription.open(connection)

            await self._following_moved(attempt)

        try:
            await link.guarded(f"SUBSCRIBE {channel!r}", open_and_subscribe)
        except BaseException:
            for connection in opened:
                connection.invalidate("subscribe failed")
                link.untrack(connection)
            raise
        # A connection a MOVED sent elsewhere is done with.
        for connection in opened[:-1]:
            connection.invalidate("MOVED")
            link.untrack(connection)
        try:
            yield subscription
        finally:
            await subscription.close(link.op_timeout_s)
            link.untrack(opened[-1])
