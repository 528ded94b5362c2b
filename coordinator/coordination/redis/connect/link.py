"""The connection layer of the Redis backend: the one module that works below coredis's
public client API.

Why below it: ``coredis.Redis`` wraps every command in a pool, retries and telemetry and managed
~5k GET/s with 50 trio tasks on the reference box, where one multiplexed connection does
12-16k. So this module drives coredis *connections* (``BaseConnection.run``, ``create_request``,
``send_command``, ``invalidate``) itself: it opens them in the backend's nursery, keeps one
multiplexed connection per *lane* ("main" for commands, "presence" for beats and liveness
reads, which must never queue behind request traffic), bounds every operation by
``op_timeout_s`` and maps every failure to ``CoordinationUnavailable``. coredis still does the
hard parts: RESP3 parsing, pipelined writes, TLS and the HELLO/AUTH handshake. If coredis
changes those internals, this module is what to adapt.

Every role object of the backend (``redis/*.py``) holds the one ``RedisLink`` of its bundle and
reaches Redis through its public part: ``redis_key`` (the key prefix), ``execute`` and
``run_script`` (one guarded command or script), ``guarded`` and ``request`` (an operation of
several steps), ``open_connection`` and ``track`` (connections of their own). So does the
Streams bus (``bus/streams.py``), with ``dedicated.py`` for its blocking reads, and the pub/sub
bus (``pubsub.py``). The link's lean lane (``lean``, ``redis/lean/lane.py``: hiredis, not
coredis) carries the bus and the scripts of every request (``run_script(..., lane="lean")``);
its connections go where ``master`` says and report a MOVED to ``rehome``.
"""

from __future__ import annotations

import logging
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import trio
from coredis import BaseConnection, ConnectionPool
from coredis.connection import TCPLocation
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import MovedError, NoScriptError, ResponseError

from coordinator.coordination.base import CoordinationUnavailable, OpObserver
from coordinator.coordination.redis.connect.cluster import key_slot, plain_url, tagged_prefix
from coordinator.coordination.redis.connect.discovery import sentinel_master, slot_master
from coordinator.coordination.redis.connect.errors import (
    acl_hint,
    caused_by_cancellation,
    caused_by_timeout,
    describe,
    is_failure,
    misuse,
    redact_url,
)
from coordinator.coordination.redis.connect.operation import Droppable, Operation
from coordinator.coordination.redis.connect.sentinel import parse_sentinel_url
from coordinator.coordination.redis.lean.connection import LeanTarget
from coordinator.coordination.redis.lean.lane import LeanLane
from coordinator.coordination.redis.scripts import LuaScript
from coordinator.errors import CoordinationTimeout, SettingsError

__all__ = ["Droppable", "Operation", "RedisLink"]

log = logging.getLogger("coordinator.coordination.redis.coordination")

T = TypeVar("T")


class _TaskStatusProbe:
    """Forwards ``started()`` and remembers that it happened."""

    def __init__(self, task_status: trio.TaskStatus[None]) -> None:
        self._task_status = task_status
        self.started_called = False

    def started(self, value: None = None) -> None:
        self.started_called = True
        self._task_status.started(value)


def _heard_from(connection: Droppable, within_s: float) -> bool:
    """Whether ``connection`` received bytes in the last ``within_s`` (coredis connections
    keep the time; others are taken as stuck)."""
    last = getattr(getattr(connection, "statistics", None), "last_byte_received_at", None)
    return isinstance(last, float) and time.perf_counter() - last < within_s


class RedisLink:
    """Connections to one Redis under one key prefix: lanes of multiplexed connections, and
    the guard that bounds and classifies every operation. ``RedisCoordination`` holds one and
    hands it to each of its role objects."""

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "gn",
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
        self.routed = self.cluster or self.sentinel is not None
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
        #: the lean pipeline (``redis/lean/lane.py``): the bus's PUBLISH, the hot-path scripts
        self.lean = LeanLane(
            self, LeanTarget.from_pool(self._pool, require_master=self.sentinel is not None)
        )
        self._nursery: trio.Nursery | None = None
        # One multiplexed connection per lane ("main": commands; "presence": beats and reads).
        self._lanes: dict[str, BaseConnection] = {}
        self._connect_locks: dict[str, trio.Lock] = {}
        # Every open connection, coredis or lean, so that closing the backend drops them all.
        self._live: set[Droppable] = set()
        # Connections dropped because an operation on them timed out: the other operations
        # waiting on one of them fail with "connection lost", which is the same slowness
        # (CoordinationTimeout), not a server that closed the socket.
        self._dropped_slow: weakref.WeakSet[Droppable] = weakref.WeakSet()
        # When Redis last answered any operation (perf_counter), a reply or an error reply:
        # how long it has been silent goes with every CoordinationTimeout (``silent_for_s``).
        self._answered_at: float | None = None
        self._closed = False
        self.key_prefix = key_prefix
        # On a cluster, the hash tag {key_prefix} keeps every key in one slot (cluster.py).
        self._prefix = tagged_prefix(key_prefix) if self.cluster else f"{key_prefix}:"
        #: Cluster only: the slot all of this link's keys hash to (``cluster.py`` module
        #: docstring), its master once known, and every master seen (seeds for rediscovery).
        self.home_slot = key_slot(self._prefix)
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

    @property
    def pool(self) -> ConnectionPool[Any]:
        """Where and how connections go (parsed from the URL; it opens nothing itself)."""
        return self._pool

    @property
    def prefix(self) -> str:
        """What ``redis_key`` puts before every key: ``<key_prefix>:`` (``{…}:`` on a cluster)."""
        return self._prefix

    def redis_key(self, key: str) -> str:
        """The Redis name of ``key``: this link's prefix plus ``key``."""
        return self._prefix + key

    def track(self, connection: Droppable) -> None:
        """Count a connection opened beside the lanes (a lean one): closing drops it too."""
        self._live.add(connection)

    def untrack(self, connection: Droppable) -> None:
        self._live.discard(connection)

    def attach(self, nursery: trio.Nursery) -> None:
        """Run this link's connections in ``nursery`` (its bundle's, for the bundle's life)."""
        self._nursery = nursery

    def detach(self) -> None:
        """Cancel the nursery of ``attach`` (its connections end with it) and forget it."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._nursery = None

    def start_soon(self, async_fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run a helper task in this link's nursery; it must handle its own errors and ends
        when the backend closes (at the latest)."""
        self.require_nursery().start_soon(async_fn, *args)

    def close(self) -> None:
        """Drop every connection; every operation from now on fails. Idempotent."""
        self._closed = True
        for connection in list(self._live):
            connection.invalidate("coordination closed")
        self._live.clear()
        self._lanes.clear()

    def require_nursery(self) -> trio.Nursery:
        if self._closed:
            raise CoordinationUnavailable("the Redis coordination backend is closed")
        if self._nursery is None:
            raise RuntimeError(
                "RedisCoordination is not running: use `async with RedisCoordination(...)` "
                "or `await nursery.start(coordination.run)` first"
            )
        return self._nursery

    async def open_connection(self) -> BaseConnection:
        return await self._connect(await self.master())

    async def _connect(
        self, location: TCPLocation | None, *, to_sentinel: bool = False
    ) -> BaseConnection:
        """A running connection to ``location`` (None: the URL's server)."""
        nursery = self.require_nursery()
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
    # of that slot (CLUSTER SLOTS on any reachable node: discovery.py), send everything there,
    # and follow a MOVED (failover, resharding) by re-pointing every lane at the new master.

    async def master(self) -> TCPLocation | None:
        """Where this link's connections go now (None: the URL's server, when not routed): the
        master of the moment, found once and again after ``rehome``. The pub/sub bus's own
        connections (``redis/lean/``) ask here too, so every connection follows one answer."""
        if not self.routed:
            return None
        home = self._home
        if home is not None:
            return home
        async with self._discover_lock:
            if self._home is None:
                self._home = await self._discover_home()
            return self._home

    async def _discover_home(self) -> TCPLocation:
        if self.sentinel is not None:
            return await sentinel_master(self._connect, self.sentinel)
        seed = self._pool.location
        assert isinstance(seed, TCPLocation)
        home, self._masters = await slot_master(
            self._connect, [seed, *self._masters], self.home_slot
        )
        if home is None:
            raise ResponseError(f"CLUSTERDOWN no master serves slot {self.home_slot}")
        return home

    def rehome(self, home: TCPLocation | None, why: str) -> None:
        """Point the lanes at ``home`` (None: find it again on the next operation); a MOVED
        seen on a connection of its own (the bus's) is followed here too."""
        if not self.routed or home == self._home:
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
                connection = await self.open_connection()
                self._lanes[lane] = connection
            return connection

    async def request(self, op: Operation, command: bytes, *args: Any, lane: str = "main") -> Any:
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
                self.rehome(TCPLocation(exc.host, exc.port), "MOVED")
                continue
            op.waiting_on = None
            return reply
        raise AssertionError("unreachable")

    async def guarded(
        self,
        what: str,
        operation: Callable[[Operation], Awaitable[T]],
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
        operation: Callable[[Operation], Awaitable[T]],
        timeout_s: float | None,
    ) -> T:
        self.require_nursery()
        op = Operation()
        timeout_s = self.op_timeout_s if timeout_s is None else timeout_s
        scope = trio.move_on_after(timeout_s)
        try:
            with scope:
                result = await operation(op)
                self._answered_at = time.perf_counter()
                return result
        except BaseException as exc:
            if isinstance(exc, ResponseError):
                self._answered_at = time.perf_counter()  # an error reply is an answer
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
                    self.rehome(None, f"{what} failed")
                message = f"Redis at {self.url} failed on {what}: {describe(exc)}{acl_hint(exc)}"
                # Slow, not down: a connect that timed out, or a connection dropped because
                # another operation on it timed out (a refusal or a closed socket is down).
                slow = caused_by_timeout(exc) or (
                    op.waiting_on is not None and op.waiting_on in self._dropped_slow
                )
                if slow:
                    raise CoordinationTimeout(message, silent_for_s=self._silent_for()) from exc
                raise CoordinationUnavailable(message) from exc
            # Our deadline, reported by coredis as ConnectionError: a timeout after all.
        if op.waiting_on is not None and not _heard_from(op.waiting_on, timeout_s):
            # The connection may be stuck behind an unresponsive server (SIGSTOP, network
            # black hole: no FIN ever comes); the next operation opens a fresh one. One that
            # still receives replies is only slow: the late reply is matched to its request
            # (replies come in order), and dropping it would fail every other operation on it.
            self._dropped_slow.add(op.waiting_on)
            op.waiting_on.invalidate(f"{what} timed out")
            self.rehome(None, f"{what} timed out")
        raise CoordinationTimeout(
            f"Redis at {self.url} did not answer {what} within {timeout_s:g} s",
            silent_for_s=self._silent_for(),
        )

    def _silent_for(self) -> float | None:
        """Seconds since Redis last answered any operation of this link (None: never)."""
        answered = self._answered_at
        return None if answered is None else time.perf_counter() - answered

    async def execute(self, what: str, command: bytes, *args: Any) -> Any:
        """Run one command on the shared connection, bounded by ``op_timeout_s``; failures raise
        ``CoordinationUnavailable``. Never send a blocking command here (it would hold up every
        other operation): use ``dedicated.dedicated_connection``. Key arguments are Redis
        names: pass them through ``redis_key`` first."""
        return await self.guarded(what, lambda op: self.request(op, command, *args))

    async def run_script(
        self, script: LuaScript, keys: Sequence[str], args: Sequence[Any], *, lane: str = "main"
    ) -> Any:
        """EVALSHA ``script`` (EVAL when the server forgot it), bounded like ``execute``;
        ``lane="lean"``: on the lean pipeline (the per-request scripts)."""
        if lane == "lean":
            return await self.guarded(
                script.name, lambda op: self.lean.script(op, script, keys, args)
            )

        async def operation(op: Operation) -> Any:
            try:
                return await self.request(
                    op, b"EVALSHA", script.sha, len(keys), *keys, *args, lane=lane
                )
            except NoScriptError:
                # A restarted server forgot its script cache; EVAL runs and caches it again.
                return await self.request(
                    op, b"EVAL", script.source, len(keys), *keys, *args, lane=lane
                )

        return await self.guarded(script.name, operation)
