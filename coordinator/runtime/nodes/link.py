"""The send side of one node connection, decoupled from the socket that drains it."""

from __future__ import annotations

import math

import msgspec
import trio

from protocol import encode

#: the base heartbeat interval is cut into this many ticks, each sending to one share of the
#: links (runtime/node_heartbeats.py)
HEARTBEAT_TICKS = 10


class NodeLink:
    """Envelopes queued for one node connection, and a request to close it.

    Anyone may queue (``send_nowait`` never blocks); the connection's sender task drains the
    queue into the socket. ``request_close`` asks the socket handler to close with a code."""

    def __init__(self) -> None:
        #: the heartbeat interval this connection is told, and ours to it: every ``every``
        #: ticks of the instance's heartbeat timer, on the tick whose remainder is ``share``
        #: (``seq``: the connection's order); set when it is attached (node_heartbeats.py)
        self.heartbeat_s = 0.0
        self.every = HEARTBEAT_TICKS
        self.share = 0
        self.seq = 0
        #: a longer interval to tell the node in our next heartbeat (None: nothing to tell)
        self.pending_s: float | None = None
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
