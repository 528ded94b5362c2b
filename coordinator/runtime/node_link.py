"""The send side of one node connection, decoupled from the socket that drains it."""

from __future__ import annotations

import math

import msgspec
import trio

from protocol import encode


class NodeLink:
    """Envelopes queued for one node connection, and a request to close it.

    Anyone may queue (``send_nowait`` never blocks); the connection's sender task drains the
    queue into the socket. ``request_close`` asks the socket handler to close with a code."""

    def __init__(self) -> None:
        #: which tick of the heartbeat interval sends to this link (set when it is attached;
        #: runtime/node_socket.py, send_node_heartbeats)
        self.share = 0
        self._send, self.outbox = trio.open_memory_channel[bytes](math.inf)
        self.closed = trio.Event()
        self.close_code = 1000
        self.close_reason = ""

    def send_nowait(self, envelope: msgspec.Struct) -> None:
        if self.closed.is_set():
            return
        self._send.send_nowait(encode(envelope))

    def send_encoded_nowait(self, data: bytes) -> None:
        """An envelope encoded once for many links (the heartbeat)."""
        if not self.closed.is_set():
            self._send.send_nowait(data)

    def request_close(self, code: int, reason: str) -> None:
        if not self.closed.is_set():
            self.close_code, self.close_reason = code, reason
            self.closed.set()
