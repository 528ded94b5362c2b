"""The ``PubSub`` role on Redis: PUBLISH, SUBSCRIBE and PUBSUB NUMSUB.

PUBLISH and SUBSCRIBE take the lean client (``lean/``: RESP parsed by hiredis over a trio
socket), on every deployment: a single server, TLS and ACL users, a cluster, Sentinel. PUBLISH
goes on the link's lean pipeline (``lean/lane.py``, shared with the hot-path scripts). Its
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

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from coordinator.coordination.base import Subscription
from coordinator.coordination.redis.connect.link import Operation, RedisLink
from coordinator.coordination.redis.lean.connection import LeanConnection
from coordinator.coordination.redis.lean.pipeline import publish_command
from coordinator.coordination.redis.lean.subscription import LeanSubscription

__all__ = ["RedisPubSub"]


class RedisPubSub:
    """``PubSub`` on the channels of one link's prefix (the ``SubscriptionHost`` of its
    subscriptions)."""

    def __init__(self, link: RedisLink, *, keepalive_s: float = 5.0, stall_s: float = 10.0) -> None:
        self._link = link
        # The link's lean lane: its pipeline (shared with the hot-path scripts) publishes, and
        # opens each subscription's connection, all at the link's master of the moment.
        self._lane = link.lean
        self.subscription_keepalive_s = keepalive_s
        #: how long an idle subscription's PING may go unanswered before it counts as lost
        self.subscription_stall_s = stall_s

    @property
    def closed(self) -> bool:
        return self._link.closed

    async def publish(self, channel: str, payload: bytes) -> int:
        link = self._link
        command = publish_command(link.redis_key(channel).encode(), payload, sharded=link.cluster)
        return int(await link.guarded("PUBLISH", lambda op: self._lane.request(op, command)))

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
                connection = await self._lane.open_connection(await link.master())
                opened.append(connection)
                op.waiting_on = connection
                await subscription.open(connection)

            await self._lane.following_moved(attempt)

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
