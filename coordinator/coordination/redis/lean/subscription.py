"""SUBSCRIBE on the lean path: the iterating task reads the socket itself.

There is no pump task and no buffer between Redis and the bus reader: ``__anext__`` parses the
next message out of what the socket already delivered, or waits on the socket for more. That
saves two task switches per envelope on the answer path. Backpressure is Redis's own: a
subscriber that stops reading is cut off by its ``client-output-buffer-limit pubsub``, which the
iterator then reports as a loss.

Each subscription has its own connection. Losing it makes the iterator raise
``CoordinationUnavailable``: the caller re-subscribes and treats in-flight work as possibly
lost. On a cluster the subscription is sharded (SSUBSCRIBE, ``smessage``), and the server ends
it with an unasked ``sunsubscribe`` when the slot moves to another master: a loss too, and the
re-subscription finds the new master (``pubsub.py``).

Only a real loss counts: a subscription whose connection is intact has lost nothing, however
long Redis was paused (TCP keeps what was published; a paused server publishes nothing). So an
idle subscription PINGs after ``subscription_keepalive_s`` (a SIGSTOPped or unplugged Redis
sends no FIN) and counts as lost only if the PING goes unanswered for ``subscription_stall_s``
(10 s by default), not the 1 s operation timeout: a Redis SIGSTOPped for a few seconds must not
make an instance fail its cross-instance tasks. A closed or reset connection is still reported
at once; closing the backend ends the iteration.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import hiredis
import trio
from coredis.exceptions import RedisError

from coordinator.coordination.base import CoordinationUnavailable, Subscription
from coordinator.coordination.redis.lean.connection import (
    LeanConnection,
    encode_command,
    reply_error,
)

__all__ = ["LeanSubscription", "SubscriptionHost"]

_PING = encode_command(b"PING")


class SubscriptionHost(Protocol):
    """What a subscription needs of the role that opened it (``pubsub.RedisPubSub``)."""

    @property
    def subscription_keepalive_s(self) -> float: ...
    @property
    def subscription_stall_s(self) -> float: ...
    @property
    def closed(self) -> bool: ...


class LeanSubscription(Subscription):
    """Messages of one channel, read straight from a dedicated ``LeanConnection``."""

    def __init__(
        self, owner: SubscriptionHost, channel: str, redis_channel: str, *, sharded: bool = False
    ) -> None:
        self._owner = owner
        self._channel = channel
        self._channel_bytes = redis_channel.encode()
        # Sharded pub/sub (Redis Cluster): SSUBSCRIBE, and "s"-prefixed pub/sub replies.
        self._verb = b"s" if sharded else b""
        self._connection: LeanConnection | None = None
        self._closing = False
        self._ping_deadline = math.inf  # set while a keepalive PING awaits its answer

    def __aiter__(self) -> LeanSubscription:
        return self

    async def open(self, connection: LeanConnection) -> None:
        """SUBSCRIBE on ``connection`` and wait for the acknowledgement (messages cannot come
        before it). An error reply raises its coredis exception (a ``MovedError`` when a
        cluster's slot is served elsewhere). The caller bounds the time and retires the
        connection on failure."""
        self._connection = connection
        verb = self._verb
        await connection.send(encode_command(verb + b"SUBSCRIBE", self._channel_bytes))
        while True:
            reply = await connection.read_reply()
            if isinstance(reply, hiredis.ReplyError):
                raise reply_error(reply)
            if isinstance(reply, list) and reply[:1] == [verb + b"subscribe"]:
                return

    async def __anext__(self) -> bytes:
        connection = self._connection
        assert connection is not None
        keepalive_s = self._owner.subscription_keepalive_s
        while True:
            try:
                reply = connection.next_buffered()
                if reply is not False:
                    payload = self._message(connection, reply)
                    if payload is not None:
                        return payload
                    continue
                deadline = self._ping_deadline
                if deadline == math.inf:
                    deadline = trio.current_time() + keepalive_s
                with trio.move_on_at(deadline):
                    await connection.receive()
                    continue
                await self._idle(connection)
            except (RedisError, OSError) as exc:
                if self._closing or self._owner.closed:
                    raise StopAsyncIteration from None
                raise CoordinationUnavailable(
                    f"lost the Redis subscription to {self._channel!r}; messages may be lost"
                ) from exc

    def _message(self, connection: LeanConnection, reply: Any) -> bytes | None:
        """The payload of a message of our channel; None for anything else (a PONG ends the
        keepalive wait). An unsubscription we did not ask for raises ``ConnectionError``."""
        verb = self._verb
        if isinstance(reply, list) and len(reply) >= 3 and reply[0] == verb + b"message":
            if reply[1] == self._channel_bytes and isinstance(reply[2], bytes):
                return reply[2]
            return None
        if isinstance(reply, list) and reply[:1] == [verb + b"unsubscribe"]:
            # Only a cluster does this (the slot moved to another master): nothing more
            # comes on this connection, so it is a loss, and re-subscribing follows the slot.
            connection.invalidate("the server ended the subscription (the slot moved)")
            raise connection.lost(None)
        if isinstance(reply, list) and reply[:1] == [b"pong"] or reply == b"PONG":
            self._ping_deadline = math.inf
        return None

    async def _idle(self, connection: LeanConnection) -> None:
        """Nothing for ``keepalive_s``: PING (a SIGSTOPped or unplugged Redis sends no FIN, so
        a dead subscription would just look quiet); no answer within the stall limit: lost."""
        if self._ping_deadline != math.inf:
            connection.invalidate("subscription keepalive failed")
            raise CoordinationUnavailable(
                f"Redis stopped answering on the subscription to {self._channel!r}"
            )
        self._ping_deadline = trio.current_time() + self._owner.subscription_stall_s
        await connection.send(_PING)

    async def close(self, timeout_s: float) -> None:
        """UNSUBSCRIBE and wait (shielded, at most ``timeout_s``) for the acknowledgement, so a
        subscriber count read right after the block is accurate; then close the connection."""
        self._closing = True
        connection = self._connection
        if connection is None:
            return
        verb = self._verb
        with trio.CancelScope(shield=True), trio.move_on_after(timeout_s):
            try:
                if connection.usable:
                    await connection.send(encode_command(verb + b"UNSUBSCRIBE"))
                    while True:
                        reply = await connection.read_reply()
                        if isinstance(reply, list) and reply[:1] == [verb + b"unsubscribe"]:
                            break
            except (RedisError, OSError):
                pass
        connection.invalidate("unsubscribed")
