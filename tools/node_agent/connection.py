"""One connection of the node agent to its coordinator: the hello and its welcome, the single
writer of the socket, and closing it within a bound (``NodeAgent`` runs one at a time)."""

from __future__ import annotations

import logging
from typing import Final

import msgspec
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
)

from protocol import (
    Chunk,
    CloseCode,
    Error,
    Heartbeat,
    Hello,
    ProtocolError,
    Result,
    Welcome,
    decode_node,
    encode,
)
from tools.node_agent.config import AgentConfig
from tools.node_agent.task_run import short

log = logging.getLogger("gemmanet.node")

#: the node protocol versions the agent speaks, offered in its hello
PROTOCOLS: Final = (1, 2)


class CloseRequest:
    """Queued behind every pending frame: the sender closes the socket when it gets here."""

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


#: what the agent's tasks queue for the socket
Outbound = Heartbeat | Chunk | Result | Error | CloseRequest


def why(exc: HandshakeError) -> str:
    """Why a dial or WebSocket upgrade failed, in a few words for the log."""
    if isinstance(exc, ConnectionRejected):
        return f"HTTP {exc.status_code} instead of a WebSocket upgrade"
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        return short(f"{type(cause).__name__}: {cause}")
    return type(exc).__name__


async def handshake(
    ws: WebSocketConnection, config: AgentConfig, *, backend_down: str | None = None
) -> Welcome | None:
    """Say hello (``backend_down``: why the backend cannot serve, health.py); the
    coordinator's welcome (None: refused, closed, or none in time)."""
    hello = Hello(
        node_id=config.node_id,
        token=config.token,
        models=list(config.models),
        max_parallel=config.max_parallel,
        vram_gb=config.vram_gb,
        agent_version=config.agent_version,
        protocols=list(PROTOCOLS),
        backend_down=msgspec.UNSET if backend_down is None else backend_down,
    )
    try:
        with trio.fail_after(config.handshake_timeout_s):
            await ws.send_message(encode(hello).decode())
            while True:
                envelope = decode_node(await ws.get_message())
                if isinstance(envelope, Welcome):
                    return envelope
                log.debug("ignoring %s before welcome", type(envelope).__name__)
    except ConnectionClosed:
        return None
    except trio.TooSlowError:
        log.warning("no welcome within %.1f s", config.handshake_timeout_s)
        await close(ws, CloseCode.GOING_AWAY, "no welcome", config.close_timeout_s)
    except ProtocolError as exc:
        log.warning("bad frame during handshake: %s", short(str(exc)))
        await close(ws, CloseCode.PROTOCOL_ERROR, "protocol error", config.close_timeout_s)
    return None


async def close(ws: WebSocketConnection, code: int, reason: str, timeout_s: float) -> None:
    with trio.move_on_after(timeout_s):
        await ws.aclose(code, reason)


async def send_all(
    ws: WebSocketConnection,
    outbox: trio.MemoryReceiveChannel[Outbound],
    connection_scope: trio.CancelScope,
    close_timeout_s: float,
) -> None:
    """Write what is queued, in order, until a ``CloseRequest`` or a closed socket; then end the
    connection (``connection_scope``)."""
    # A task cancelled mid-write would leave a torn frame; queueing makes a cancelled task
    # either enqueue a whole frame or none, and only this task touches the socket.
    try:
        async for item in outbox:
            if isinstance(item, CloseRequest):
                await close(ws, item.code, item.reason, close_timeout_s)
                break
            await ws.send_message(encode(item).decode())
    except ConnectionClosed:
        pass
    connection_scope.cancel()
