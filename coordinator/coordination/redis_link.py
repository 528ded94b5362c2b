"""The connection layer of the Redis backend: the one module that works below coredis's
public client API.

Why below it: ``coredis.Redis`` wraps every command in a pool, retries and telemetry and managed
~5k GET/s with 50 trio tasks on the reference box, where one multiplexed connection does
12-16k. So this module drives coredis *connections* (``BaseConnection.run``, ``create_request``,
``send_command``, ``push_messages``, ``invalidate``) itself: it opens them in the backend's
nursery, keeps one multiplexed connection per *lane* ("main" for commands, "presence" for
beats and liveness reads, which must never queue behind request traffic), bounds every
operation by ``op_timeout_s`` and maps every failure to ``CoordinationUnavailable``. coredis
still does the hard parts: RESP3 parsing, pipelined writes, TLS and the HELLO/AUTH handshake.
If coredis changes those internals, this module (and the subscription pump, which reads
``push_messages``) is what to adapt.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio
from coredis import BaseConnection, ConnectionPool
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import NoScriptError, ResponseError

from coordinator.coordination.base import CoordinationUnavailable, OpObserver
from coordinator.coordination.redis_errors import (
    acl_hint,
    caused_by_cancellation,
    describe,
    is_failure,
    misuse,
    redact_url,
)
from coordinator.coordination.redis_scripts import LuaScript
from coordinator.errors import SettingsError

__all__ = ["DedicatedConnection", "Droppable", "RedisLink", "read_password_file"]

log = logging.getLogger("coordinator.coordination.redis")

T = TypeVar("T")


def read_password_file(password_file: str | None) -> str | None:
    """The file's content minus surrounding whitespace, so secrets stay out of URLs and logs."""
    if not password_file:
        return None
    try:
        return Path(password_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SettingsError(
            f"GEMMANET_REDIS_PASSWORD_FILE={password_file!r}: cannot read the file: {exc.strerror}"
        ) from None


class Droppable(Protocol):
    """A connection the guard can drop: a coredis one or a lean one (``redis_lean``)."""

    def invalidate(self, reason: str) -> None: ...


class _Operation:
    """The connection an operation is waiting on, so a timeout can drop exactly that one."""

    __slots__ = ("waiting_on",)

    def __init__(self) -> None:
        self.waiting_on: Droppable | None = None


class _TaskStatusProbe:
    """Forwards ``started()`` and remembers that it happened."""

    def __init__(self, task_status: trio.TaskStatus[None]) -> None:
        self._task_status = task_status
        self.started_called = False

    def started(self, value: None = None) -> None:
        self.started_called = True
        self._task_status.started(value)


class RedisLink:
    """Connections to one Redis: lanes of multiplexed connections, dedicated ones, and the
    guard that bounds and classifies every operation. ``RedisCoordination`` builds on it."""

    def __init__(
        self,
        url: str,
        *,
        password: str | None,
        op_timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if not op_timeout_s > 0:
            raise ValueError("op_timeout_s must be positive")
        if ssl_context is not None and not url.startswith("rediss://"):
            # coredis would wrap even a redis:// connection in it: say what was meant instead.
            raise SettingsError("a TLS context (GEMMANET_REDIS_CA_FILE) needs a rediss:// URL")
        self.url = redact_url(url)
        self.op_timeout_s = op_timeout_s
        # Only parses the URL (scheme, TLS parameters, db, user name); opens nothing. The user
        # name of the URL and the password go into HELLO 3 AUTH <user> <password>.
        tls: dict[str, Any] = {} if ssl_context is None else {"ssl_context": ssl_context}
        self._pool = ConnectionPool.from_url(url, connect_timeout=op_timeout_s, **tls)
        if password is not None:
            self._pool.connection_kwargs["password"] = password
        self._nursery: trio.Nursery | None = None
        # One multiplexed connection per lane ("main": commands; "presence": beats and reads).
        self._lanes: dict[str, BaseConnection] = {}
        self._connect_locks: dict[str, trio.Lock] = {}
        # Every open connection, coredis or lean, so that closing the backend drops them all.
        self._live: set[Droppable] = set()
        self._closed = False
        #: told (what, seconds, failed) after every guarded operation (the metrics' hook)
        self.op_observer: OpObserver | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_connections(self) -> int:
        """Live connections: one per lane in use plus one per subscription (diagnostics)."""
        return len(self._live)

    def _close_connections(self) -> None:
        self._closed = True
        for connection in list(self._live):
            connection.invalidate("coordination closed")
        self._live.clear()
        self._lanes.clear()

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
        # The pool parsed the URL into a location matching its connection class (TCP or UDS);
        # coredis types the two separately.
        connection: BaseConnection = pool.connection_class(
            pool.location,
            **pool.connection_kwargs,
        )
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
        observer = self.op_observer
        if observer is None:
            return await self._bounded(what, operation, timeout_s)
        started = time.perf_counter()
        try:
            result = await self._bounded(what, operation, timeout_s)
        except CoordinationUnavailable:
            observer(what, time.perf_counter() - started, True)
            raise
        observer(what, time.perf_counter() - started, False)
        return result

    async def _bounded(
        self,
        what: str,
        operation: Callable[[_Operation], Awaitable[T]],
        timeout_s: float | None,
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
                    f"Redis at {self.url} failed on {what}: {describe(exc)}{acl_hint(exc)}"
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

    def __init__(self, owner: RedisLink, connection: BaseConnection) -> None:
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
