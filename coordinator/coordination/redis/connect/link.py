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
from coredis.connection import TCPLocation
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import MovedError, NoScriptError, ResponseError

from coordinator.coordination.base import CoordinationUnavailable, OpObserver
from coordinator.coordination.redis.connect.cluster import plain_url, slot_owner
from coordinator.coordination.redis.connect.errors import (
    acl_hint,
    caused_by_cancellation,
    describe,
    is_failure,
    misuse,
    redact_url,
)
from coordinator.coordination.redis.connect.sentinel import parse_sentinel_url
from coordinator.coordination.redis.scripts import LuaScript
from coordinator.errors import SettingsError

__all__ = ["DedicatedConnection", "Droppable", "RedisLink", "read_password_file"]

log = logging.getLogger("coordinator.coordination.redis.coordination")

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
        # redis+cluster://seed: every connection goes to the master of ``home_slot`` instead;
        # redis+sentinel://s1,s2,s3/service: to the master the sentinels name.
        self.sentinel = parse_sentinel_url(url)
        shown = redact_url(url) if self.sentinel is None else self.sentinel.shown
        if self.sentinel is not None:
            url = self.sentinel.master_url
        url, self.cluster = plain_url(url)
        self._routed = self.cluster or self.sentinel is not None
        if ssl_context is not None and not url.startswith("rediss://"):  # after plain_url
            # coredis would wrap even a redis:// connection in it: say what was meant instead.
            raise SettingsError("a TLS context (GEMMANET_REDIS_CA_FILE) needs a rediss:// URL")
        #: for messages: the URL as given (cluster, sentinels), without a password
        self.url = shown
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
        #: Cluster only: the slot all of this link's keys hash to (``redis_cluster`` module
        #: docstring), its master once known, and every master seen (seeds for rediscovery).
        self.home_slot = 0
        self._home: TCPLocation | None = None
        self._masters: list[TCPLocation] = []
        self._discover_lock = trio.Lock()
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
        if self._routed:
            return await self._connect(await self._cluster_home())
        return await self._connect(None)

    async def _connect(
        self, location: TCPLocation | None, *, to_sentinel: bool = False
    ) -> BaseConnection:
        """A running connection to ``location`` (None: the URL's server)."""
        nursery = self._require_nursery()
        pool = self._pool
        assert pool.location is not None
        kwargs = dict(pool.connection_kwargs)
        if to_sentinel:
            # The URL's user and password file are the master's; sentinels get none.
            kwargs.pop("username", None)
            kwargs.pop("password", None)
        # The pool parsed the URL into a location matching its connection class (TCP or UDS);
        # coredis types the two separately.
        connection: BaseConnection = pool.connection_class(location or pool.location, **kwargs)
        await nursery.start(self._run_connection, connection)
        return connection

    # -- Redis Cluster --------------------------------------------------------------------------
    # Every key of a deployment shares one hash slot, so the whole routing is: find the master
    # of that slot (CLUSTER SLOTS on any reachable node), send everything there, and follow a
    # MOVED (failover, resharding) by re-pointing every lane at the new master.

    async def _cluster_home(self) -> TCPLocation:
        home = self._home
        if home is not None:
            return home
        async with self._discover_lock:
            if self._home is None:
                self._home = await self._discover_home()
            return self._home

    async def _discover_home(self) -> TCPLocation:
        if self.sentinel is not None:
            return await self._ask_sentinels()
        seed = self._pool.location
        assert isinstance(seed, TCPLocation)
        failure: Exception | None = None
        for location in dict.fromkeys([seed, *self._masters]):
            try:
                connection = await self._connect(location)
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
            self._masters = [
                TCPLocation(bytes(entry[2][0]).decode() or location.host, int(entry[2][1]))
                for entry in reply
            ]
            owner = slot_owner(reply, self.home_slot)
            if owner is None:
                raise ResponseError(f"CLUSTERDOWN no master serves slot {self.home_slot}")
            return TCPLocation(owner[0] or location.host, owner[1])
        assert failure is not None
        raise failure

    async def _ask_sentinels(self) -> TCPLocation:
        """The master the first answering sentinel names, once it says ``ROLE`` master (a
        sentinel that has not noticed a failover yet may still name the dead or demoted one)."""
        assert self.sentinel is not None
        failure: Exception = RedisConnectionError("no sentinel answered")
        for host, port in self.sentinel.sentinels:
            try:
                connection = await self._connect(TCPLocation(host, port), to_sentinel=True)
            except RedisConnectionError as exc:
                failure = exc
                continue
            try:
                reply: Any = await connection.create_request(
                    b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", self.sentinel.service, decode=False
                )
            except RedisConnectionError as exc:
                failure = exc
                continue
            finally:
                connection.invalidate("sentinel asked")
            if not reply:
                raise ResponseError(f"the sentinels know no master {self.sentinel.service!r}")
            master = TCPLocation(bytes(reply[0]).decode(), int(reply[1]))
            connection = await self._connect(master)
            try:
                role: Any = await connection.create_request(b"ROLE", decode=False)
            finally:
                connection.invalidate("role checked")
            if role[0] != b"master":
                raise ResponseError(f"READONLY {master} is not a master (failover under way)")
            return master
        raise failure

    def _rehome(self, home: TCPLocation | None, why: str) -> None:
        """Point the lanes at ``home`` (None: find it again on the next operation)."""
        if not self._routed or home == self._home:
            return
        log.info("Redis master of slot %d now at %s (%s)", self.home_slot, home or "?", why)
        self._home = home
        for connection in list(self._lanes.values()):
            connection.invalidate(why)
        self._lanes.clear()

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
            try:
                reply = await request
            except MovedError as exc:
                if not self.cluster or attempt == 2:
                    raise
                self._rehome(TCPLocation(exc.host, exc.port), "MOVED")
                continue
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
                if not isinstance(exc, ResponseError) or str(exc).startswith("READONLY"):
                    # The master may have failed over: ask the cluster/sentinels again.
                    self._rehome(None, f"{what} failed")
                raise CoordinationUnavailable(
                    f"Redis at {self.url} failed on {what}: {describe(exc)}{acl_hint(exc)}"
                ) from exc
            # Our deadline, reported by coredis as ConnectionError: a timeout after all.
        if op.waiting_on is not None:
            # The connection may be stuck behind an unresponsive server (SIGSTOP, network
            # black hole: no FIN ever comes); the next operation opens a fresh one.
            op.waiting_on.invalidate(f"{what} timed out")
            self._rehome(None, f"{what} timed out")
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
