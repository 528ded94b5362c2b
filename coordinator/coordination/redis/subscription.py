"""Subscriptions of the Redis backend: one dedicated connection per subscription.

A pump task moves push messages from the connection into a bounded channel (a full buffer drops
and counts, like the memory backend). The iterator raises ``CoordinationUnavailable`` when the
connection is lost, and PINGs while idle so that a hung server (no FIN) is noticed too.

Only a real loss counts: a subscription whose connection is intact has lost nothing, however
long Redis was paused (TCP keeps what was published; a paused server publishes nothing). So the
idle PING may wait ``subscription_stall_s`` (10 s by default), not the 1 s operation timeout:
a Redis SIGSTOPped for a few seconds must not make an instance fail its cross-instance tasks.
A closed or reset connection is still reported at once.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio
from coredis import BaseConnection
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import RedisError

from coordinator.coordination.base import CoordinationUnavailable, Subscription
from coordinator.coordination.redis.connect.errors import KEEPALIVE_FAILURES


class SubscriptionHost(Protocol):
    """What a subscription needs of the role that opened it (``pubsub.RedisPubSub``)."""

    @property
    def subscription_keepalive_s(self) -> float: ...
    @property
    def subscription_stall_s(self) -> float: ...
    @property
    def closed(self) -> bool: ...


__all__ = ["RedisSubscription"]

log = logging.getLogger(__name__)


class RedisSubscription(Subscription):
    """Messages of one channel, read from a dedicated connection."""

    def __init__(
        self,
        owner: SubscriptionHost,
        channel: str,
        redis_channel: str,
        buffer: int,
        *,
        sharded: bool = False,
    ) -> None:
        self._owner = owner
        # Sharded pub/sub (Redis Cluster): SSUBSCRIBE, and "s"-prefixed push messages.
        self._verb = b"s" if sharded else b""
        self._channel = channel
        self._channel_bytes = redis_channel.encode()
        self._send, self._receive = trio.open_memory_channel[bytes](buffer)
        self._connection: BaseConnection | None = None
        self._subscribed = trio.Event()  # set on the SUBSCRIBE ack, or when the pump ends
        self._unsubscribed = trio.Event()
        self._pump_done = False
        self._closing = False
        #: messages lost because this subscriber's buffer was full
        self.dropped = 0

    def __aiter__(self) -> RedisSubscription:
        return self

    async def __anext__(self) -> bytes:
        keepalive_s = self._owner.subscription_keepalive_s
        while True:
            got: bytes | None = None
            ended = False
            with trio.move_on_after(keepalive_s):
                try:
                    got = await self._receive.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    ended = True
            if got is not None:
                return got
            if ended:
                if self._closing or self._owner.closed:
                    raise StopAsyncIteration
                raise CoordinationUnavailable(
                    f"lost the Redis subscription to {self._channel!r}; messages may be lost"
                )
            # Idle: make sure the server is still there (a SIGSTOPped or unplugged Redis sends
            # no FIN, so without this a dead subscription would just look quiet).
            await self._keepalive()

    async def _keepalive(self) -> None:
        connection = self._connection
        try:
            if connection is None:
                raise RedisConnectionError("subscription has no connection")
            with trio.fail_after(self._owner.subscription_stall_s):
                await connection.create_request(b"PING", decode=False)
        except KEEPALIVE_FAILURES as exc:
            if connection is not None:
                connection.invalidate("subscription keepalive failed")
            raise CoordinationUnavailable(
                f"Redis stopped answering on the subscription to {self._channel!r}"
            ) from exc

    async def open(self, connection: BaseConnection, nursery: trio.Nursery) -> None:
        """Subscribe on ``connection`` (dedicated to this subscription); the pump that moves
        its push messages runs in ``nursery``. Raises when the connection drops meanwhile."""
        self._connection = connection
        await nursery.start(self._pump, connection)
        connection.send_command(self._verb + b"subscribe", self._channel_bytes)
        await self._subscribed.wait()
        if self._pump_done:
            raise RedisConnectionError("connection lost while subscribing")

    async def close(self, timeout_s: float) -> None:
        """Unsubscribe and wait (shielded, at most ``timeout_s``) for the ack, so a subscriber
        count read right after the block is accurate; then retire the connection."""
        self._closing = True
        connection = self._connection
        if connection is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(timeout_s):
            if connection.usable and not self._pump_done:
                try:
                    connection.send_command(self._verb + b"unsubscribe", self._channel_bytes)
                except RedisError:
                    pass
                else:
                    await self._unsubscribed.wait()
        connection.invalidate("unsubscribed")
        self._receive.close()

    async def _pump(
        self,
        connection: BaseConnection,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Move push messages from the connection into the bounded channel."""
        task_status.started()
        try:
            verb = self._verb
            async for push in connection.push_messages:
                kind = push[0]
                payload = push[2] if len(push) > 2 else None
                if kind == verb + b"message" and push[1] == self._channel_bytes:
                    assert isinstance(payload, bytes)
                    try:
                        self._send.send_nowait(payload)
                    except trio.WouldBlock:
                        self.dropped += 1
                elif kind == verb + b"subscribe":
                    self._subscribed.set()
                elif kind == verb + b"unsubscribe":
                    self._unsubscribed.set()
                    if not self._closing:
                        # A cluster drops sharded subscribers when the slot moves elsewhere:
                        # a loss, reported by the iterator, and the caller subscribes again.
                        return
        # Whatever ends the pump (normally the connection closing), the iterator reports it;
        # it must never crash the coordination's nursery.
        except Exception as exc:  # noqa: BLE001
            log.debug("subscription pump for %r ended: %r", self._channel, exc)
        finally:
            self._pump_done = True
            self._subscribed.set()
            self._unsubscribed.set()
            self._send.close()
