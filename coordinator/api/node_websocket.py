"""The node WebSocket (``/ws/node``) served straight from Hypercorn's ASGI events, below Quart.

Every node message (heartbeats, results, stream chunks) crossed two tasks in Quart-Trio: its
reader task took the ASGI event, sent a ``websocket_received`` signal and queued the message for
the handler's task, and each send went through the ``Websocket`` wrapper and a
``websocket_sent`` signal. At thousands of nodes that is most of an idle instance's work above
Hypercorn. Here the serving task reads the ASGI events itself.

Behaviour is Quart's: the socket is accepted without a subprotocol; a node that goes away
(``websocket.disconnect``) cancels its handler, which closes its connection in the instance
(``runtime/node_socket.py``); every other path, and every HTTP request, goes to Quart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from hypercorn.typing import ASGIReceiveCallable as Receive
from hypercorn.typing import ASGISendCallable as Send
from hypercorn.typing import Scope

from coordinator.runtime.nodes.websocket import NodeSocket

NODE_PATH = "/ws/node"

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ServeNode = Callable[[NodeSocket], Awaitable[None]]


class AsgiNodeSocket:
    """``NodeSocket`` over one ASGI WebSocket connection."""

    def __init__(self, receive: Receive, send: Send, gone: trio.CancelScope) -> None:
        self._receive = receive
        self._send = send
        #: cancelled when the node goes away (the handler's scope)
        self._gone = gone
        self._closed = False

    async def accept(self) -> None:
        event = await self._receive()
        if event["type"] != "websocket.connect":  # a disconnect before the handshake ended
            await self._went_away()
        await self._send({"type": "websocket.accept", "subprotocol": None, "headers": []})

    async def receive(self) -> str | bytes:
        event = await self._receive()
        if event["type"] == "websocket.receive":
            data = event["bytes"]
            if data is not None:
                return data
            return event["text"] or ""
        await self._went_away()
        raise AssertionError("unreachable")  # pragma: no cover - _went_away never returns

    async def send(self, data: str | bytes) -> None:
        if isinstance(data, str):
            await self._send({"type": "websocket.send", "bytes": None, "text": data})
        else:
            await self._send({"type": "websocket.send", "bytes": data, "text": None})

    async def close(self, code: int, reason: str = "") -> None:
        if self._closed:
            return
        self._closed = True
        await self._send({"type": "websocket.close", "code": code, "reason": reason})

    async def _went_away(self) -> None:
        # As Quart-Trio does: the node's side is gone, so its handler is cancelled (the
        # instance ends the connection); this task waits to be cancelled with it.
        self._closed = True
        self._gone.cancel()
        await trio.sleep_forever()


def node_path(scope: Scope) -> bool:
    """Whether ``scope`` is the node WebSocket (under the root path a proxy may set)."""
    if scope["type"] != "websocket":
        return False
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path == NODE_PATH


def serve_node_sockets_first(app: ASGIApp, serve_node: Callable[[], ServeNode]) -> ASGIApp:
    """``app`` with ``/ws/node`` answered by ``serve_node()`` (looked up per connection: the
    instance starts after the app is built)."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if not node_path(scope):
            await app(scope, receive, send)
            return
        with trio.CancelScope() as gone:
            await serve_node()(AsgiNodeSocket(receive, send, gone))

    return asgi
