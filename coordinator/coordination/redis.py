"""The Redis/Valkey coordination backend, on coredis connections under trio.

Why it talks to coredis connections directly instead of ``coredis.Redis``: the high-level client
adds a pool, retries and telemetry around every command and managed ~5k GET/s with 50 trio tasks
on the reference box (2 cores, Redis on the same box), where one multiplexed connection does
12-16k. coredis still does the hard parts: RESP3 parsing, pipelined writes, TLS (``rediss://``)
and the HELLO/AUTH handshake.

Failure model (see ``base.Coordination``):

* every operation is bounded by ``op_timeout_s`` as a whole; a timeout, a refused or broken
  connection, or any Redis error surfaces as ``CoordinationUnavailable``, never a raw coredis
  exception and never a hang;
* a timed-out connection is dropped, and the next operation opens a fresh one, so the same object
  works again as soon as Redis is back;
* a command cut off by a timeout may still have run on the server (at-most-once, like the bus).

Each subscription has its own connection. Losing it makes the iterator raise
``CoordinationUnavailable``: the caller re-subscribes and treats in-flight work as possibly lost.

Lifecycle: connections run in a nursery owned by this object, so use it as
``async with RedisCoordination(...) as coord:`` (or ``await nursery.start(coord.run)``),
entered and exited by the same task.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Self, TypeVar

import trio
from coredis import BaseConnection, ConnectionPool
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import NoScriptError, RedisError, ResponseError

from coordinator.coordination.base import (
    Coordination,
    CoordinationUnavailable,
    PresenceEntry,
    PresenceView,
    RateDecision,
    Subscription,
)
from coordinator.coordination.redis_errors import (
    caused_by_cancellation,
    describe,
    is_failure,
    misuse,
    redact_url,
)
from coordinator.coordination.redis_scripts import (
    COMPARE_AND_SET,
    INCR_WITH_TTL,
    PRESENCE,
    RATE_LIMIT,
    REFRESH_IF,
    LuaScript,
)
from coordinator.coordination.redis_subscription import RedisSubscription

__all__ = ["DedicatedConnection", "RedisCoordination", "RedisSubscription", "redact_url"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_SUBSCRIBER_BUFFER = 10_000
_SCAN_COUNT = 1000


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


class _Operation:
    """The connection an operation is waiting on, so a timeout can drop exactly that one."""

    __slots__ = ("waiting_on",)

    def __init__(self) -> None:
        self.waiting_on: BaseConnection | None = None


class _TaskStatusProbe:
    """Forwards ``started()`` and remembers that it happened."""

    def __init__(self, task_status: trio.TaskStatus[None]) -> None:
        self._task_status = task_status
        self.started_called = False

    def started(self, value: None = None) -> None:
        self.started_called = True
        self._task_status.started(value)


class RedisCoordination(Coordination):
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
    ) -> None:
        if not op_timeout_s > 0:
            raise ValueError("op_timeout_s must be positive")
        self.url = redact_url(url)
        self.key_prefix = key_prefix
        self.op_timeout_s = op_timeout_s
        self.subscription_keepalive_s = subscription_keepalive_s
        #: how long an idle subscription's PING may go unanswered before it counts as lost
        self.subscription_stall_s = subscription_stall_s
        self._prefix = f"{key_prefix}:"
        self._subscriber_buffer = subscriber_buffer
        extra: dict[str, Any] = {"connect_timeout": op_timeout_s}
        # Only parses the URL (scheme, TLS parameters, db, credentials); opens nothing.
        self._pool = ConnectionPool.from_url(url, **extra)
        if password is not None:
            self._pool.connection_kwargs["password"] = password
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._run_scope: trio.CancelScope | None = None
        # One multiplexed connection per lane ("main": commands; "presence": beats and reads).
        self._lanes: dict[str, BaseConnection] = {}
        self._connect_locks: dict[str, trio.Lock] = {}
        self._live: set[BaseConnection] = set()
        self._closed = False

    @classmethod
    def from_url_and_password_file(
        cls,
        url: str,
        password_file: str | None,
        key_prefix: str = "gn",
        **kwargs: Any,
    ) -> RedisCoordination:
        """Build from settings; the password (if any) is the file's content minus surrounding
        whitespace, so secrets stay out of URLs and logs."""
        password = None
        if password_file:
            try:
                password = Path(password_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(
                    f"cannot read the Redis password file {password_file!r}: {exc.strerror}"
                ) from None
        return cls(url, key_prefix=key_prefix, password=password, **kwargs)

    def __repr__(self) -> str:
        return f"RedisCoordination(url={self.url!r}, key_prefix={self.key_prefix!r})"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_connections(self) -> int:
        """Live connections: the shared one plus one per subscription (for diagnostics)."""
        return len(self._live)

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
        self._closed = True
        for connection in list(self._live):
            connection.invalidate("coordination closed")
        self._live.clear()
        self._lanes.clear()
        if self._run_scope is not None:
            self._run_scope.cancel()

    async def ping(self) -> None:
        reply = await self._command("PING", b"PING")
        if reply not in (b"PONG", "PONG"):
            raise CoordinationUnavailable(f"unexpected PING reply from Redis: {reply!r}")

    # -- connections --------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        return self._prefix + key

    def _require_nursery(self) -> trio.Nursery:
        if self._closed:
            raise CoordinationUnavailable("the Redis coordination backend is closed")
        if self._nursery is None:
            raise RuntimeError(
                "RedisCoordination is not running: use `async with RedisCoordination(...)` "
                "or `await nursery.start(coordination.run)` first"
            )
        return self._nursery

    async def _open_connection(self) -> BaseConnection:
        nursery = self._require_nursery()
        pool = self._pool
        assert pool.location is not None
        connection: BaseConnection = pool.connection_class(pool.location, **pool.connection_kwargs)
        await nursery.start(self._run_connection, connection)
        return connection

    async def _run_connection(
        self,
        connection: BaseConnection,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        probe = _TaskStatusProbe(task_status)
        self._live.add(connection)
        try:
            await connection.run(task_status=probe)
        except Exception as exc:
            if not probe.started_called:
                raise  # nursery.start hands it to the caller
            log.info("Redis connection ended: %r", exc)
        finally:
            self._live.discard(connection)
            for lane, current in list(self._lanes.items()):
                if current is connection:
                    del self._lanes[lane]

    async def _shared_connection(self, lane: str = "main") -> BaseConnection:
        """The multiplexed connection of ``lane``, (re)opened on demand."""
        connection = self._lanes.get(lane)
        if connection is not None and connection.usable:
            return connection
        lock = self._connect_locks.setdefault(lane, trio.Lock())
        async with lock:
            connection = self._lanes.get(lane)
            if connection is None or not connection.usable:
                self._lanes.pop(lane, None)
                connection = await self._open_connection()
                self._lanes[lane] = connection
            return connection

    async def _request(self, op: _Operation, command: bytes, *args: Any, lane: str = "main") -> Any:
        """Send one command on the shared connection; one retry if the connection turned out
        to be dead before anything was sent."""
        for attempt in (1, 2):
            connection = await self._shared_connection(lane)
            try:
                request = connection.create_request(command, *args, decode=False)
            except RedisConnectionError:
                connection.invalidate("connection found dead")
                if attempt == 2:
                    raise
                continue
            op.waiting_on = connection
            reply = await request
            op.waiting_on = None
            return reply
        raise AssertionError("unreachable")

    async def _guarded(
        self,
        what: str,
        operation: Callable[[_Operation], Awaitable[T]],
        *,
        timeout_s: float | None = None,
    ) -> T:
        self._require_nursery()
        op = _Operation()
        timeout_s = self.op_timeout_s if timeout_s is None else timeout_s
        scope = trio.move_on_after(timeout_s)
        try:
            with scope:
                return await operation(op)
        except BaseException as exc:
            if isinstance(exc, CoordinationUnavailable) or not is_failure(exc):
                raise
            if isinstance(exc, ResponseError) and (wrong := misuse(exc, what)) is not None:
                raise wrong from exc
            if not scope.cancel_called:
                if caused_by_cancellation(exc):
                    # coredis turns a cancellation that hits its handshake into
                    # ConnectionError; let an outer cancellation win over our report.
                    await trio.lowlevel.checkpoint_if_cancelled()
                raise CoordinationUnavailable(
                    f"Redis at {self.url} failed on {what}: {describe(exc)}"
                ) from exc
            # Our deadline, reported by coredis as ConnectionError: a timeout after all.
        if op.waiting_on is not None:
            # The connection may be stuck behind an unresponsive server (SIGSTOP, network
            # black hole: no FIN ever comes); the next operation opens a fresh one.
            op.waiting_on.invalidate(f"{what} timed out")
        raise CoordinationUnavailable(
            f"Redis at {self.url} did not answer {what} within {timeout_s:g} s"
        )

    async def _command(self, what: str, command: bytes, *args: Any) -> Any:
        return await self._guarded(what, lambda op: self._request(op, command, *args))

    async def _eval(
        self, script: LuaScript, keys: Sequence[str], args: Sequence[Any], *, lane: str = "main"
    ) -> Any:
        async def operation(op: _Operation) -> Any:
            try:
                return await self._request(
                    op, b"EVALSHA", script.sha, len(keys), *keys, *args, lane=lane
                )
            except NoScriptError:
                # A restarted server forgot its script cache; EVAL runs and caches it again.
                return await self._request(
                    op, b"EVAL", script.source, len(keys), *keys, *args, lane=lane
                )

        return await self._guarded(script.name, operation)

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

    async def publish(self, channel: str, payload: bytes) -> int:
        return int(await self._command("PUBLISH", b"PUBLISH", self._name(channel), payload))

    async def subscriber_count(self, channel: str) -> int:
        reply = await self._command("PUBSUB NUMSUB", b"PUBSUB", b"NUMSUB", self._name(channel))
        if isinstance(reply, dict):
            values = list(reply.values())
        else:
            values = list(reply)[1::2]
        return int(values[0]) if values else 0

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        return self._subscribe(channel)

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[RedisSubscription]:
        nursery = self._require_nursery()
        subscription = RedisSubscription(
            self, channel, self._name(channel), self._subscriber_buffer
        )
        connection: BaseConnection | None = None

        async def open_and_subscribe(op: _Operation) -> None:
            nonlocal connection
            connection = await self._open_connection()
            subscription._connection = connection
            await nursery.start(subscription._pump, connection)
            connection.send_command(b"SUBSCRIBE", self._name(channel))
            await subscription._subscribed.wait()
            if subscription._pump_done:
                raise RedisConnectionError("connection lost while subscribing")

        try:
            await self._guarded(f"SUBSCRIBE {channel!r}", open_and_subscribe)
        except BaseException:
            if connection is not None:
                connection.invalidate("subscribe failed")
            raise
        try:
            yield subscription
        finally:
            subscription._closing = True
            await self._unsubscribe(subscription)

    async def _unsubscribe(self, subscription: RedisSubscription) -> None:
        connection = subscription._connection
        if connection is None:
            return
        # Wait for the ack so subscriber_count is accurate as soon as the block is left.
        with trio.move_on_after(self.op_timeout_s) as scope:
            scope.shield = True
            if connection.usable and not subscription._pump_done:
                try:
                    connection.send_command(b"UNSUBSCRIBE")
                except RedisError:
                    pass
                else:
                    await subscription._unsubscribed.wait()
        connection.invalidate("unsubscribed")
        subscription._receive.close()

    # -- raw commands -------------------------------------------------------------------------
    # For transports built on this backend (coordinator/coordination/streams_bus.py): the same
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

    @asynccontextmanager
    async def dedicated_connection(
        self, client_name: str | None = None
    ) -> AsyncIterator[DedicatedConnection]:
        """A connection of its own for the block, for blocking commands (``XREAD BLOCK``).
        Opening it is bounded by ``op_timeout_s``; ``client_name`` is set with CLIENT SETNAME
        (spaces and control characters become ``_``) so operators can find it in CLIENT LIST."""
        holder: list[BaseConnection] = []

        async def open_it(op: _Operation) -> None:
            connection = await self._open_connection()
            holder.append(connection)
            if client_name:
                name = "".join(ch if 32 < ord(ch) < 127 else "_" for ch in client_name)
                op.waiting_on = connection
                await connection.create_request(b"CLIENT", b"SETNAME", name, decode=False)
                op.waiting_on = None

        try:
            await self._guarded("open a dedicated connection", open_it)
        except BaseException:
            for connection in holder:
                connection.invalidate("opening failed")
            raise
        dedicated = DedicatedConnection(self, holder[0])
        try:
            yield dedicated
        finally:
            dedicated.retire("dedicated connection closed")


class DedicatedConnection:
    """One connection used by one task at a time (see ``RedisCoordination.dedicated_connection``).
    It is never reopened: after any failure, timeout or cancellation of a command it is retired
    and every further command raises ``CoordinationUnavailable`` (open a new one)."""

    def __init__(self, owner: RedisCoordination, connection: BaseConnection) -> None:
        self._owner = owner
        self._connection = connection
        self.lost_reason: str | None = None

    def retire(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        self._connection.invalidate(reason)

    async def execute(
        self, what: str, command: bytes, *args: Any, timeout_s: float | None = None
    ) -> Any:
        """Run one command, bounded by ``timeout_s`` (default ``op_timeout_s``): give a blocking
        command its BLOCK time plus a margin."""
        if self.lost_reason is not None:
            raise CoordinationUnavailable(
                f"the dedicated Redis connection is gone ({self.lost_reason})"
            )
        connection = self._connection

        async def operation(op: _Operation) -> Any:
            op.waiting_on = connection
            reply = await connection.create_request(command, *args, decode=False)
            op.waiting_on = None
            return reply

        try:
            return await self._owner._guarded(what, operation, timeout_s=timeout_s)
        except BaseException as exc:
            # A reply still owed (cancelled or timed-out command) would be read as the answer
            # to the next command: this connection is done.
            self.retire(f"{what} ended with {type(exc).__name__}")
            raise
