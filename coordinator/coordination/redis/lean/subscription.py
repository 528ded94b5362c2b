"""SUBSCRIBE on the lean path: the iterating task reads the socket itself.

There is no pump task and no buffer between Redis and the bus reader: ``__anext__`` parses the
next message out of what the socket already delivered, or waits on the socket for more. That
saves two task switches per envelope on the answer path. Backpressure is Redis's own: a
subscriber that stops reading is cut off by its ``client-output-buffer-limit pubsub``, which the
iterator then reports as a loss (the coredis path drops into its counted buffer instead).

Semantics otherwise as ``redis_subscription.RedisSubscription``: a lost connection raises
``CoordinationUnavailable``; an idle subscription PINGs after ``subscription_keepalive_s`` and
counts as lost only if the PING goes unanswered for ``subscription_stall_s`` (a paused Redis
loses nothing on an intact connection); closing the backend ends the iteration.
"""

from __future__ import annotations

import math
from typing import Any

import hiredis
import trio
from coredis.exceptions import RedisError

from coordinator.coordination.base import CoordinationUnavailable, Subscription
from coordinator.coordination.redis.lean.connection import (
    LeanConnection,
    encode_command,
    reply_error,
)
from coordinator.coordination.redis.subscription import SubscriptionHost

__all__ = ["LeanSubscription"]

_PING = encode_command(b"PING")


class LeanSubscription(Subscription):
    """Messages of one channel, read straight from a dedicated ``LeanConnection``."""

    def __init__(self, owner: SubscriptionHost, channel: str, redis_channel: str) -> None:
        self._owner = owner
        self._channel = channel
        self._channel_bytes = redis_channel.encode()
        self._connection: LeanConnection | None = None
        self._closing = False
        self._ping_deadline = math.inf  # set while a keepalive PING awaits its answer

    def __aiter__(self) -> LeanSubscription:
        return self

    async def open(self, connection: LeanConnection) -> None:
        """SUBSCRIBE on ``connection`` and wait for the acknowledgement (messages cannot come
        before it). The caller bounds the time and retires the connection on failure."""
        self._connection = connection
        await connection.send(encode_command(b"SUBSCRIBE", self._channel_bytes))
        while True:
            reply = await connection.read_reply()
            if isinstance(reply, hiredis.ReplyError):
                raise reply_error(reply)
            if isinstance(reply, list) and reply[:1] == [b"subscribe"]:
                return

    async def __anext__(self) -> bytes:
        connection = self._connection
        assert connection is not None
        keepalive_s = self._owner.subscription_keepalive_s
        while True:
            try:
                reply = connection.next_buffered()
                if reply is not False:
                    payload = self._message(reply)
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

    def _message(self, reply: Any) -> bytes | None:
        """The payload of a message of our channel; None for anything else (a PONG ends the
        keepalive wait)."""
        if isinstance(reply, list) and len(reply) >= 3 and reply[0] == b"message":
            if reply[1] == self._channel_bytes and isinstance(reply[2], bytes):
                return reply[2]
            return None
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
        with trio.CancelScope(shield=True), trio.move_on_after(timeout_s):
            try:
                if connection.usable:
                    await connection.send(encode_command(b"UNSUBSCRIBE"))
                    while True:
                        reply = await connection.read_reply()
                        if isinstance(reply, list) and reply[:1] == [b"unsubscribe"]:
                            break
            except (RedisError, OSError):
                pass
        connection.invalidate("unsubscribed")
