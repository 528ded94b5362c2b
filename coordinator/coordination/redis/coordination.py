"""The Redis/Valkey coordination backend, on coredis connections under trio.

The connection layer (lanes of multiplexed connections, timeouts, error mapping, and why it
works below coredis's public client) is ``redis_link.RedisLink``; this module is the
``Coordination`` operations on top of it, except capacity leases and admission queues, which
the ``redis_leases.RedisLeases`` mixin adds.

Failure model (see ``base.Coordination``):

* every operation is bounded by ``op_timeout_s`` as a whole; a timeout, a refused or broken
  connection, or any Redis error surfaces as ``CoordinationUnavailable``, never a raw coredis
  exception and never a hang;
* a timed-out connection is dropped, and the next operation opens a fresh one, so the same object
  works again as soon as Redis is back;
* a command cut off by a timeout may still have run on the server (at-most-once, like the bus).

PUBLISH and SUBSCRIBE take the lean path (``redis_lean``: RESP parsed by hiredis over a trio
socket) unless ``bus_client="coredis"`` (``GEMMANET_REDIS_BUS_CLIENT``); same semantics either way.

Each subscription has its own connection. Losing it makes the iterator raise
``CoordinationUnavailable``: the caller re-subscribes and treats in-flight work as possibly lost.
A paused server is not a loss (see ``redis_subscription``).

Lifecycle: connections run in a nursery owned by this object, so use it as
``async with RedisCoordination(...) as coord:`` (or ``await nursery.start(coord.run)``),
entered and exited by the same task.
"""

from __future__ import annotations

import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, Self

import trio
from coredis import BaseConnection

from coordinator.coordination.base import (
    Coordination,
    CoordinationUnavailable,
    PresenceEntry,
    PresenceView,
    RateDecision,
    Subscription,
)
from coordinator.coordination.redis.connect.cluster import key_slot, tagged_prefix
from coordinator.coordination.redis.connect.errors import redact_url
from coordinator.coordination.redis.connect.link import (
    DedicatedConnection,
    _Operation,
    read_password_file,
)
from coordinator.coordination.redis.lean.connection import (
    LeanConnection,
    LeanTarget,
    open_lean_connection,
)
from coordinator.coordination.redis.lean.publisher import LeanPublisher, publish_command
from coordinator.coordination.redis.lean.subscription import LeanSubscription
from coordinator.coordination.redis.leases import RedisLeases
from coordinator.coordination.redis.monitor import RedisMonitor
from coordinator.coordination.redis.scripts import (
    COMPARE_AND_SET,
    INCR_WITH_TTL,
    PRESENCE,
    RATE_LIMIT,
    REFRESH_IF,
    REFRESH_MANY,
    SWAP_MANY,
    LuaScript,
)
from coordinator.coordination.redis.subscription import RedisSubscription
from coordinator.coordination.redis.telemetry import RedisTelemetry

__all__ = [
    "BUS_CLIENTS",
    "DedicatedConnection",
    "RedisCoordination",
    "RedisSubscription",
    "redact_url",
]

DEFAULT_SUBSCRIBER_BUFFER = 10_000
#: the clients PUBLISH and SUBSCRIBE can take (GEMMANET_REDIS_BUS_CLIENT); the first is default
BUS_CLIENTS = ("lean", "coredis")
_SCAN_COUNT = 1000
#: keys per ``refresh_many`` script: one script blocks Redis, so it stays short
REFRESH_BATCH = 500


def _ttl_ms(ttl_s: float | None) -> str:
    if ttl_s is None:
        return ""
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive or None, got {ttl_s!r}")
    return str(max(1, round(ttl_s * 1000)))


def _us(seconds: float) -> str:
    return str(max(1, round(seconds * 1_000_000)))


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "\\*?[]" else ch for ch in text)


class RedisCoordination(RedisLeases, RedisTelemetry, RedisMonitor, Coordination):
    """``Coordination`` shared by every instance that points at the same Redis and prefix."""

    kind = "redis"

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "gn",
        password: str | None = None,
        op_timeout_s: float = 1.0,
        subscription_keepalive_s: float = 5.0,
        subscription_stall_s: float = 10.0,
        subscriber_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
        ssl_context: ssl.SSLContext | None = None,
        bus_client: str = BUS_CLIENTS[0],
    ) -> None:
        super().__init__(url, password=password, op_timeout_s=op_timeout_s, ssl_context=ssl_context)
        if bus_client not in BUS_CLIENTS:
            raise ValueError(f"bus_client must be one of {BUS_CLIENTS}, got {bus_client!r}")
        self.bus_client = bus_client
        # The lean path connects where coredis's pool would, as whom it would, with its TLS.
        # Not on a cluster or behind Sentinel: there redis_link routes every connection to the
        # master of the moment (MOVED, rediscovery), and the lean path holds one fixed address.
        lean = bus_client == "lean" and not self._routed
        self._lean_target = LeanTarget.from_pool(self._pool) if lean else None
        self._lean_publisher: LeanPublisher | None = None
        self.key_prefix = key_prefix
        self.subscription_keepalive_s = subscription_keepalive_s
        #: how long an idle subscription's PING may go unanswered before it counts as lost
        self.subscription_stall_s = subscription_stall_s
        # On a cluster, the hash tag {key_prefix} keeps every key in one slot (redis_cluster).
        self._prefix = tagged_prefix(key_prefix) if self.cluster else f"{key_prefix}:"
        self.home_slot = key_slot(self._prefix)
        self._subscriber_buffer = subscriber_buffer
        self._stack: AsyncExitStack | None = None
        self._run_scope: trio.CancelScope | None = None

    @classmethod
    def from_url_and_password_file(
        cls, url: str, password_file: str | None, key_prefix: str = "gn", **kwargs: Any
    ) -> RedisCoordination:
        """Build from settings, the password read from ``password_file``."""
        password = read_password_file(password_file)
        return cls(url, key_prefix=key_prefix, password=password, **kwargs)

    def __repr__(self) -> str:
        return (
            f"RedisCoordination(url={self.url!r}, key_prefix={self.key_prefix!r}, "
            f"bus_client={self.bus_client!r})"
        )

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None or self._closed:
            raise RuntimeError("a RedisCoordination can be entered only once")
        stack = AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
        stack, self._stack = self._stack, None
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._nursery = None
        if stack is not None:
            await stack.aclose()

    async def run(self, *, task_status: trio.TaskStatus[Self] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled or ``aclose``d, for ``nursery.start(coordination.run)``."""
        async with self:
            with trio.CancelScope() as self._run_scope:
                task_status.started(self)
                await trio.sleep_forever()

    async def aclose(self) -> None:
        self._close_connections()
        if self._run_scope is not None:
            self._run_scope.cancel()

    async def ping(self) -> None:
        reply = await self._command("PING", b"PING")
        if reply not in (b"PONG", "PONG"):
            raise CoordinationUnavailable(f"unexpected PING reply from Redis: {reply!r}")

    def _name(self, key: str) -> str:
        return self._prefix + key

    # -- keys ---------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        reply: bytes | None = await self._command("GET", b"GET", self._name(key))
        return reply

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        reply = await self._command("MGET", b"MGET", *(self._name(key) for key in keys))
        return list(reply)

    async def set(
        self, key: str, value: bytes, *, ttl_s: float | None = None, only_if_absent: bool = False
    ) -> bool:
        args: list[Any] = [self._name(key), value]
        ttl = _ttl_ms(ttl_s)
        if ttl:
            args += [b"PX", ttl]
        if only_if_absent:
            args.append(b"NX")
        reply = await self._command("SET", b"SET", *args)
        return reply is not None

    async def swap(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bytes | None:
        # SET ... GET (Redis >= 6.2) is atomic on its own.
        args: list[Any] = [self._name(key), value, b"GET"]
        ttl = _ttl_ms(ttl_s)
        if ttl:
            args += [b"PX", ttl]
        reply: bytes | None = await self._command("SET GET", b"SET", *args)
        return reply

    async def swap_many(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        ttl_s: float | None = None,
        bump: str | None = None,
    ) -> list[bytes | None]:
        ttl = _ttl_ms(ttl_s)
        previous: list[bytes | None] = []
        for at in range(0, len(items), REFRESH_BATCH):
            batch = items[at : at + REFRESH_BATCH]
            keys = [self._name(k) for k, _ in batch]
            if bump is not None:
                keys.append(self._name(bump))  # the script bumps the key past the values
            args = [ttl, "1" if bump is not None else "0", *(v for _, v in batch)]
            previous.extend(await self._eval(SWAP_MANY, keys, args))
        return previous

    async def compare_and_set(
        self,
        key: str,
        expected: bytes | None,
        value: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        args = [
            b"0" if expected is None else b"1",
            b"" if expected is None else expected,
            b"0" if value is None else b"1",
            b"" if value is None else value,
            _ttl_ms(ttl_s),
        ]
        return bool(await self._eval(COMPARE_AND_SET, [self._name(key)], args))

    async def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        ttl = _ttl_ms(ttl_s)
        return bool(await self._eval(REFRESH_IF, [self._name(key)], [expected, ttl]))

    async def refresh_many(self, expected: Sequence[tuple[str, bytes]], ttl_s: float) -> list[bool]:
        ttl = _ttl_ms(ttl_s)
        done: list[bool] = []
        for at in range(0, len(expected), REFRESH_BATCH):
            batch = expected[at : at + REFRESH_BATCH]
            reply = await self._eval(
                REFRESH_MANY, [self._name(k) for k, _ in batch], [ttl, *(v for _, v in batch)]
            )
            done.extend(bool(int(r)) for r in reply)
        return done

    async def delete(self, key: str) -> None:
        await self._command("DEL", b"DEL", self._name(key))

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        reply = await self._eval(INCR_WITH_TTL, [self._name(key)], [int(amount), _ttl_ms(ttl_s)])
        return int(reply)

    async def keys_with_prefix(self, prefix: str) -> list[str]:
        pattern = _glob_escape(self._name(prefix)) + "*"
        cut = len(self._prefix)

        async def scan(op: _Operation) -> list[str]:
            found: set[str] = set()
            cursor: bytes | int = b"0"
            while True:
                # TYPE string: rate-limit logs (sorted sets) are not "keys" of this interface.
                reply = await self._request(
                    op,
                    b"SCAN",
                    cursor,
                    b"MATCH",
                    pattern,
                    b"COUNT",
                    _SCAN_COUNT,
                    b"TYPE",
                    b"string",
                )
                cursor, batch = reply[0], reply[1]
                found.update(raw.decode()[cut:] for raw in batch)
                if cursor in (b"0", 0, "0"):
                    return sorted(found)

        return await self._guarded("SCAN", scan)

    async def rate_limit(self, key: str, *, limit: int, period_s: float) -> RateDecision:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, got {period_s!r}")
        period_us = max(1, round(period_s * 1_000_000))
        reply = await self._eval(
            RATE_LIMIT, [self._name(key)], [limit, period_us, secrets.token_hex(6)]
        )
        allowed, retry_us, remaining = (int(part) for part in reply)
        return RateDecision(
            allowed=bool(allowed),
            retry_after_s=retry_us / 1_000_000,
            remaining=max(0, remaining),
        )

    # -- presence -----------------------------------------------------------------------------
    # Presence calls run on a connection of their own (the "presence" lane): a beat or a judge's
    # read is never queued behind request traffic, a SCAN or a burst of publishes.

    async def _presence(
        self, registry: str, mode: bytes, member: str, data: bytes, stall_s: float, forget_s: float
    ) -> PresenceView:
        name = self._name(registry)
        keys = [name, name + ":data", name + ":pulse", name + ":stalls"]
        args = [member, data, _us(stall_s), _us(forget_s), mode]
        reply = await self._eval(PRESENCE, keys, args, lane="presence")
        now, previous, members, data_list, stalls = reply
        entries = tuple(
            PresenceEntry(
                member=members[i].decode(),
                last_beat=int(float(members[i + 1])) / 1e6,
                data=data_list[i // 2] or b"",
            )
            for i in range(0, len(members), 2)
        )
        windows = []
        for raw in stalls:
            start, _, end = raw.partition(b":")
            windows.append((int(start) / 1e6, int(end) / 1e6))
        return PresenceView(
            now=int(now) / 1e6,
            entries=tuple(sorted(entries, key=lambda e: e.member)),
            previous_beat=int(float(previous)) / 1e6 if previous else None,
            stalls=tuple(windows),
        )

    async def presence_beat(
        self,
        registry: str,
        member: str,
        data: bytes,
        *,
        stall_after_s: float,
        forget_after_s: float,
    ) -> PresenceView:
        return await self._presence(registry, b"beat", member, data, stall_after_s, forget_after_s)

    async def presence_read(self, registry: str, *, stall_after_s: float) -> PresenceView:
        return await self._presence(registry, b"read", "", b"", stall_after_s, 1.0)

    async def presence_leave(self, registry: str, member: str) -> None:
        await self._presence(registry, b"leave", member, b"", 1.0, 1.0)

    # -- bus ----------------------------------------------------------------------------------

    # On a cluster the bus is sharded pub/sub: a PUBLISH there is copied to every node over the
    # cluster bus, an SPUBLISH only to the master of the channel's slot (the home slot).

    async def publish(self, channel: str, payload: bytes) -> int:
        if self._lean_target is None:
            command = b"SPUBLISH" if self.cluster else b"PUBLISH"
            return int(await self._command(command.decode(), command, self._name(channel), payload))
        command = publish_command(self._name(channel).encode(), payload)

        async def operation(op: _Operation) -> int:
            publisher = await self._open_lean_publisher()
            op.waiting_on = publisher
            return int(await publisher.request(command))

        return await self._guarded("PUBLISH", operation)

    async def _open_lean_publisher(self) -> LeanPublisher:
        """The lean publisher, (re)opened on demand like a lane of the coredis path."""
        publisher = self._lean_publisher
        if publisher is not None and publisher.usable:
            return publisher
        async with self._connect_locks.setdefault("lean publish", trio.Lock()):
            publisher = self._lean_publisher
            if publisher is None or not publisher.usable:
                connection = await self._open_lean_connection()
                publisher = LeanPublisher(connection)
                await self._require_nursery().start(self._run_lean_publisher, publisher)
                self._lean_publisher = publisher
            return publisher

    async def _run_lean_publisher(
        self, publisher: LeanPublisher, *, task_status: trio.TaskStatus[None]
    ) -> None:
        try:
            await publisher.run(task_status=task_status)
        finally:
            self._live.discard(publisher.connection)

    async def _open_lean_connection(self) -> LeanConnection:
        self._require_nursery()
        assert self._lean_target is not None
        connection = await open_lean_connection(self._lean_target)
        if self.closed:
            connection.invalidate("coordination closed")
        self._live.add(connection)
        return connection

    async def subscriber_count(self, channel: str) -> int:
        sub = b"SHARDNUMSUB" if self.cluster else b"NUMSUB"
        reply = await self._command("PUBSUB " + sub.decode(), b"PUBSUB", sub, self._name(channel))
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
        subscription = LeanSubscription(self, channel, self._name(channel))
        holder: list[LeanConnection] = []

        async def open_and_subscribe(op: _Operation) -> None:
            connection = await self._open_lean_connection()
            holder.append(connection)
            op.waiting_on = connection
            await subscription.open(connection)

        try:
            await self._guarded(f"SUBSCRIBE {channel!r}", open_and_subscribe)
        except BaseException:
            for connection in holder:
                connection.invalidate("subscribe failed")
                self._live.discard(connection)
            raise
        try:
            yield subscription
        finally:
            await subscription.close(self.op_timeout_s)
            self._live.discard(holder[0])

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[RedisSubscription]:
        nursery = self._require_nursery()
        subscription = RedisSubscription(
            self, channel, self._name(channel), self._subscriber_buffer, sharded=self.cluster
        )
        connection: BaseConnection | None = None

        async def open_and_subscribe(op: _Operation) -> None:
            nonlocal connection
            connection = await self._open_connection()
            await subscription.open(connection, nursery)

        try:
            await self._guarded(f"SUBSCRIBE {channel!r}", open_and_subscribe)
        except BaseException:
            if connection is not None:
                connection.invalidate("subscribe failed")
            raise
        try:
            yield subscription
        finally:
            await subscription.close(self.op_timeout_s)

    # -- raw commands -------------------------------------------------------------------------
    # For transports built on this backend (coordinator/coordination/bus/streams.py): the same
    # timeouts and error mapping as every other operation, for commands this interface lacks.
    # Key arguments are Redis names: pass them through ``redis_key`` first.

    def redis_key(self, key: str) -> str:
        """The Redis name of ``key``: this backend's prefix plus ``key``."""
        return self._name(key)

    async def execute(self, what: str, command: bytes, *args: Any) -> Any:
        """Run one command on the shared connection, bounded by ``op_timeout_s``; failures raise
        ``CoordinationUnavailable``. Never send a blocking command here (it would hold up every
        other operation): use ``dedicated_connection``."""
        return await self._command(what, command, *args)

    async def run_script(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """EVALSHA ``script`` (EVAL when the server forgot it), bounded like ``execute``."""
        return await self._eval(script, keys, args)

    def start_soon(self, async_fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run a helper task in this backend's nursery; it must handle its own errors and ends
        when the backend closes (at the latest)."""
        self._require_nursery().start_soon(async_fn, *args)
