"""The lean pub/sub path of the Redis backend: RESP over a plain trio stream, parsed by hiredis.

Why: a pub/sub round trip through coredis cost 2.5/6.2 ms p50/p95 where a bare socket round trip
took 0.3 ms on the same box (docs/benchmarks.md): the client library, not Redis, was the cost of
the cross-instance hop. PUBLISH and SUBSCRIBE (SPUBLISH and SSUBSCRIBE on a cluster) are the
only commands on that hop, and the admission and release scripts the only ones of every
request, so they take this path; everything else stays on coredis. The pipeline
(``pipeline.py``, held by the link's lean lane, ``lane.py``) and the subscription
(``subscription.py``) build on the ``LeanConnection`` here.

What stays identical to the link's coredis connections, by construction rather than by copy:
the URL is parsed by coredis's own pool (host, port or unix socket, db, ACL user, password,
``ssl_*`` parameters turned into an ``SSLContext``); where to connect on a cluster or behind
Sentinel is the link's answer (``RedisLink.master``, ``LeanTarget.at``); error replies are
classified by coredis's own parser table (``WRONGPASS``, ``NOPERM``, ``MOVED`` ... become the
coredis exceptions the guard in ``redis/connect/link.py`` maps to ``CoordinationUnavailable``
with its hints; ``Parser.parse_error`` is private to coredis: adapt here if it changes); lost
connections surface as coredis ``ConnectionError``. The connection speaks RESP2: no HELLO round
trip, and pub/sub messages are plain arrays.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass, replace
from typing import Any, cast

import hiredis
import trio
from coredis import ConnectionPool
from coredis.connection import TCPLocation
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import RedisError, ResponseError
from coredis.parser import Parser

__all__ = ["LeanConnection", "LeanTarget", "encode_command", "open_lean_connection"]

_RECEIVE_BYTES = 65536
_ERRORS = Parser()  # only its table of error prefixes is used (parse_error)


@dataclass(frozen=True, slots=True)
class LeanTarget:
    """Where and as whom to connect, taken from the coredis pool that parsed the URL."""

    host: str | None
    port: int
    unix_path: str | None
    db: int
    username: str | None
    password: str | None
    ssl_context: ssl.SSLContext | None
    #: Sentinel: check ``ROLE`` in the handshake, as the link does of the master it is named.
    #: A demoted master keeps taking PUBLISH and SUBSCRIBE (a replica does), but its messages
    #: no longer meet those of the instances already at the new one.
    require_master: bool = False

    @classmethod
    def from_pool(cls, pool: ConnectionPool[Any], *, require_master: bool = False) -> LeanTarget:
        location = pool.location
        kwargs = pool.connection_kwargs
        host = getattr(location, "host", None)
        return cls(
            host=host,
            port=int(getattr(location, "port", 0) or 0),
            unix_path=None if host is not None else str(getattr(location, "path", "")),
            db=int(kwargs.get("db") or 0),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            ssl_context=kwargs.get("ssl_context"),
            require_master=require_master,
        )

    def at(self, location: TCPLocation | None) -> LeanTarget:
        """This target at ``location`` (the link's master of the moment; None: as the URL
        says), with the same user, password and TLS: a cluster's masters and the master a
        sentinel names take the URL's settings, only their address is found."""
        if location is None:
            return self
        return replace(self, host=location.host, port=location.port, unix_path=None)


def encode_command(*args: bytes) -> bytes:
    """One RESP command (an array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


def reply_error(error: hiredis.ReplyError) -> RedisError:
    """The coredis exception for an error reply, exactly as coredis would raise it."""
    return _ERRORS.parse_error(str(error))


class LeanConnection:
    """One RESP2 connection: a trio stream and a hiredis reader. ``invalidate`` closes it at
    once from any task (the guard drops a timed-out connection that way); a task blocked reading
    or writing it then gets ``ConnectionError``."""

    def __init__(self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]) -> None:
        self._stream = stream
        self._reader = hiredis.Reader()
        self.lost_reason: str | None = None
        #: perf_counter of the last bytes received (the guard's "still answering" test)
        self.last_byte_received_at: float | None = None

    @property
    def usable(self) -> bool:
        return self.lost_reason is None

    def invalidate(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        stream = self._stream
        transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        # trio's socket close is synchronous and wakes every task waiting on the socket.
        transport.socket.close()

    def lost(self, exc: BaseException | None) -> RedisConnectionError:
        reason = self.lost_reason or (f"{type(exc).__name__}: {exc}" if exc else "closed by Redis")
        self.invalidate(reason)
        return RedisConnectionError(f"Redis connection lost ({reason})")

    async def send(self, data: bytes) -> None:
        if self.lost_reason is not None:
            raise self.lost(None)
        try:
            await self._stream.send_all(data)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise self.lost(exc) from exc

    def next_buffered(self) -> Any:
        """The next complete reply already received, or False (hiredis's "not yet")."""
        try:
            return self._reader.gets()
        except hiredis.ProtocolError as exc:
            raise self.lost(exc) from exc

    async def receive(self) -> None:
        """Read what the socket has into the parser; a closed connection raises."""
        if self.lost_reason is not None:
            raise self.lost(None)
        try:
            data = await self._stream.receive_some(_RECEIVE_BYTES)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise self.lost(exc) from exc
        if not data:
            raise self.lost(None)
        self.last_byte_received_at = time.perf_counter()
        self._reader.feed(cast(bytes, data))  # SocketStream gives bytes; typed wider

    async def read_reply(self) -> Any:
        """The next reply; an error reply is returned as a ``hiredis.ReplyError`` value."""
        while True:
            reply = self.next_buffered()
            if reply is not False:
                return reply
            await self.receive()


async def open_lean_connection(target: LeanTarget) -> LeanConnection:
    """Connect, TLS-handshake when configured, AUTH, SELECT and ROLE as configured (pipelined,
    one round trip). Failures raise coredis exceptions or ``OSError`` (a replica where a master
    is required: ``ResponseError`` READONLY, on which the link's guard asks the sentinels
    again); the caller bounds the time."""
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
    if target.host is None:
        assert target.unix_path is not None
        stream = await trio.open_unix_socket(target.unix_path)
    else:
        stream = await trio.open_tcp_stream(target.host, target.port)  # TCP_NODELAY is set
        if target.ssl_context is not None:
            tls = trio.SSLStream(
                stream, target.ssl_context, server_hostname=target.host, https_compatible=False
            )
            try:
                await tls.do_handshake()
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            stream = tls
    connection = LeanConnection(stream)
    handshake: list[bytes] = []
    if target.password is not None:
        who = [target.username.encode()] if target.username else []
        handshake.append(encode_command(b"AUTH", *who, target.password.encode()))
    if target.db:
        handshake.append(encode_command(b"SELECT", b"%d" % target.db))
    if target.require_master:
        handshake.append(encode_command(b"ROLE"))
    try:
        if handshake:
            await connection.send(b"".join(handshake))
            for _ in handshake:
                reply = await connection.read_reply()
                if isinstance(reply, hiredis.ReplyError):
                    raise reply_error(reply)
            if target.require_master and reply[0] != b"master":
                where = f"{target.host}:{target.port}"
                raise ResponseError(f"READONLY {where} is not a master (failover under way)")
    except BaseException:
        connection.invalidate("handshake failed")
        raise
    return connection
