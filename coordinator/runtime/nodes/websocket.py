"""Serving one node WebSocket: hello and authentication, then envelopes until it closes.

The socket is reached through the small ``NodeSocket`` protocol so the same code serves Quart's
websocket object in production and an in-memory pair in tests and the simulator.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.core.node_table import NodeConnection
from coordinator.runtime.drain import Drain
from coordinator.runtime.log_context import bind_log_ids
from coordinator.runtime.metrics import Metrics
from coordinator.runtime.nodes.link import NodeLink
from coordinator.settings import Settings
from protocol import (
    CloseCode,
    Hello,
    NodeSession,
    ProtocolError,
    Welcome,
)

if TYPE_CHECKING:
    # Only the type (the instance's store is passed in): importing the runtime need not load
    # SQLAlchemy, which a simulator process never uses.
    from coordinator.store import Store

log = logging.getLogger("gemmanet.node_socket")

HELLO_TIMEOUT_S = 10.0


class NodeHost(Protocol):
    """What serving a node socket needs of its instance."""

    instance_id: str
    settings: Settings
    store: Store
    metrics: Metrics
    drain: Drain

    async def attach_node(
        self, hello: Hello, link: NodeLink, protocol: int = ...
    ) -> NodeConnection: ...
    def detach_node(self, conn: NodeConnection, why: str = ...) -> None: ...
    def on_node_envelope(self, conn: NodeConnection, envelope: object) -> None: ...


class NodeSocket(Protocol):
    async def accept(self) -> None: ...
    async def receive(self) -> str | bytes: ...
    async def send(self, data: str | bytes) -> None: ...
    async def close(self, code: int, reason: str = "") -> None: ...


class _Closing(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


def _reason(text: str) -> str:
    # A close reason must fit in 123 bytes of UTF-8.
    return text.encode()[:120].decode(errors="ignore")


async def serve_node_socket(instance: NodeHost, socket: NodeSocket) -> None:
    # This task serves one node: its lines carry the instance and (after hello) the node.
    bind_log_ids(instance_id=instance.instance_id, request_id=None)
    await socket.accept()
    # The session refuses anything a node may not send in the current state (4002).
    session = NodeSession("coordinator")
    node_id = ""
    code: int | None = None
    try:
        hello = await _receive_hello(instance, socket, session)
        node_id = hello.node_id
        code, reason = await _serve_authenticated(instance, socket, session, hello)
    except _Closing as closing:
        code, reason = closing.code, closing.reason
    finally:
        # None: the node's side went away (or we are stopping) before we chose a close code.
        instance.metrics.node_closed(node_id, code)
    with trio.CancelScope(shield=True), trio.move_on_after(2):
        try:
            await socket.close(code, _reason(reason))
        except Exception as exc:  # noqa: BLE001 - the peer may already be gone
            log.debug("could not close a node socket cleanly: %r", exc)


async def serve_node_in(nursery: trio.Nursery, instance: NodeHost, socket: NodeSocket) -> None:
    """Serve ``socket`` as a task of ``nursery`` (the instance's: stopping the instance closes
    it) while the caller (the WebSocket handler) waits; the caller leaving closes it too."""
    done = trio.Event()

    async def serve(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            try:
                await serve_node_socket(instance, socket)
            finally:
                done.set()

    scope = await nursery.start(serve)
    try:
        await done.wait()
    finally:
        if not done.is_set():  # our caller was cancelled: the socket goes with it
            scope.cancel()
            with trio.CancelScope(shield=True):
                await done.wait()


async def _receive_hello(instance: NodeHost, socket: NodeSocket, session: NodeSession) -> Hello:
    with trio.move_on_after(HELLO_TIMEOUT_S):
        data = await socket.receive()
        try:
            envelope = session.receive(data)
        except ProtocolError as exc:
            raise _Closing(CloseCode.PROTOCOL_ERROR, str(exc)) from None
        assert isinstance(envelope, Hello)  # the session accepts nothing else first
        bind_log_ids(node_id=envelope.node_id)
        if not await instance.store.verify_node_token(envelope.node_id, envelope.token):
            log.warning("node %s failed authentication", envelope.node_id)
            raise _Closing(
                CloseCode.AUTH_FAILED, f"authentication failed for node {envelope.node_id}"
            )
        return envelope
    raise _Closing(CloseCode.PROTOCOL_ERROR, f"no hello within {HELLO_TIMEOUT_S:g} s")


async def _serve_authenticated(
    instance: NodeHost, socket: NodeSocket, session: NodeSession, hello: Hello
) -> tuple[int, str]:
    if not instance.drain.accepts_nodes():
        log.info("node %s told to move: this instance is draining", hello.node_id)
        return CloseCode.MOVE, "coordinator instance draining: connect to another one now"
    link = NodeLink()
    try:
        conn = await instance.attach_node(hello, link, session.version or 1)
    except CoordinationUnavailable as exc:
        log.warning("refusing node %s for now: %s", hello.node_id, exc)
        return CloseCode.TRY_AGAIN_LATER, "coordination store unavailable; reconnect later"
    if conn.backend_down is None:
        log.info(
            "node %s connected (%s) serving %s", hello.node_id, conn.conn_id, sorted(conn.models)
        )
    else:
        log.warning(
            "node %s connected (%s) with its backend down, serving none of %s: %s",
            hello.node_id,
            conn.conn_id,
            sorted(conn.advertised),
            conn.backend_down,
        )
    try:
        welcome = Welcome(
            instance_id=instance.instance_id,
            conn_id=conn.conn_id,
            heartbeat_interval_s=link.heartbeat_s,
        )
        await socket.send(session.send(welcome).decode())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump_outbox, socket, link)
            nursery.start_soon(_receive_envelopes, instance, socket, session, conn, link)
            await link.closed.wait()
            nursery.cancel_scope.cancel()
        return link.close_code, link.close_reason
    finally:
        instance.detach_node(conn)
        log.info("node %s disconnected (%s)", hello.node_id, conn.conn_id)


async def _pump_outbox(socket: NodeSocket, link: NodeLink) -> None:
    async for data in link.outbox:
        await socket.send(data.decode())


async def _receive_envelopes(
    instance: NodeHost,
    socket: NodeSocket,
    session: NodeSession,
    conn: NodeConnection,
    link: NodeLink,
) -> None:
    while True:
        data = await socket.receive()
        try:
            envelope = session.receive(data)
        except ProtocolError as exc:
            log.warning("node %s sent a bad envelope: %s", conn.node_id, exc)
            link.request_close(CloseCode.PROTOCOL_ERROR, str(exc))
            return
        down = conn.backend_down
        instance.on_node_envelope(conn, envelope)
        if (down is None) != (conn.backend_down is None):
            _log_backend_flip(conn)


def _log_backend_flip(conn: NodeConnection) -> None:
    if conn.backend_down is not None:
        log.warning(
            "node %s reports its backend down; not placing on it: %s",
            conn.node_id,
            conn.backend_down,
        )
    else:
        log.info(
            "node %s reports its backend answering again: serving %s",
            conn.node_id,
            sorted(conn.models),
        )
