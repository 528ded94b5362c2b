"""Small, tested workarounds for Hypercorn 0.18's HTTP/1.1 server (pinned in pyproject.toml).

Each patch is idempotent and applied by ``create_app``, so ``gemmanet serve`` and a plain
``hypercorn 'coordinator.app:create_app()'`` behave the same. Drop a patch when Hypercorn fixes
the behaviour upstream (tests/e2e/test_http_edges.py shows each one).

* ``HTTP/1.1 200 OK``: Hypercorn hands h11 responses without a reason phrase
  (``HTTP/1.1 200 ``): legal (RFC 9112 says a client ignores it) but it looks broken to whoever
  reads a raw response.
* ``Connection: close`` and HTTP/1.0 (Hypercorn issue #330): h11 knows the connection must close
  after the response, and Hypercorn tries to, but from inside the application's task, which
  Quart-Trio cancels as soon as the response is out, so the close is cancelled halfway and the
  socket stays open: a client that reads to EOF hangs until the keep-alive timeout. The close is
  shielded (it is two non-blocking socket calls).
* Hypercorn's own answers to requests it cannot parse (a garbage request line, a 64 KiB header)
  have empty bodies; they carry the same JSON error body as every other error instead.
* One socket write per response, not two: Hypercorn writes the status line and headers, then
  the body, each with its own ``send``. On loopback a ``send`` costs as much as the rest of a
  small response (the kernel runs the peer's TCP receive inside it: ~8% of an instance's CPU
  under load, measured with py-spy), so the head of a response that declares its
  ``content-length`` is held and goes out with the first body bytes. Streamed responses (SSE, no
  length) are written as before: their head leaves at once, whenever the first chunk comes.
* Reads of 4 KiB instead of 64 KiB (``READ_BYTES``). CPython's ``recv(n)`` allocates ``n`` bytes
  and shrinks the block to what arrived; a 64 KiB block comes from glibc's heap, its freed tail
  is soon taken by longer-lived allocations, and the holes left (40-64 KiB, just too small for
  the next read) made the main heap grow under steady load while Python's own allocations
  stayed flat: about half the RSS growth ``gemmanet loadtest`` measured (README "Load test";
  the rest was in the worker threads' arenas, ``heap_trim``). A coordinator's requests and node
  frames are small; a 1 MiB prompt takes 256 reads instead of 16.
"""

from __future__ import annotations

import dataclasses
from http import HTTPStatus
from itertools import chain
from typing import Any

import h11
import msgspec
import trio
from hypercorn.events import RawData
from hypercorn.protocol import h11 as hypercorn_h11
from hypercorn.protocol.events import Body, EndBody, Response
from hypercorn.trio import tcp_server

_PATCHED = "_gemmanet_patched"

#: bytes asked of the socket per read (Hypercorn's own is 64 KiB)
READ_BYTES = 4096

#: the JSON error for Hypercorn's own protocol-level answers (h11 gives only the status)
_PROTOCOL_ERRORS = {
    400: ("bad_request", "the request is not valid HTTP/1.1"),
    413: ("payload_too_large", "the request is too large"),
    431: ("headers_too_large", "the request line and headers exceed the server's limit"),
}


def apply() -> None:
    """Install every workaround once per process."""
    _send_reason_phrases()
    _close_when_asked()
    _json_protocol_errors()
    _one_write_per_response()
    _small_reads()


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:  # a status without a registered phrase
        return b""


def _send_reason_phrases() -> None:
    protocol: Any = hypercorn_h11.H11Protocol
    if getattr(protocol._send_h11_event, _PATCHED, False):
        return
    send = protocol._send_h11_event

    async def send_with_reason(self: object, event: object) -> None:
        if isinstance(event, h11.Response) and not event.reason:
            event = dataclasses.replace(event, reason=_reason(event.status_code))
        await send(self, event)

    setattr(send_with_reason, _PATCHED, True)
    protocol._send_h11_event = send_with_reason


def _close_when_asked() -> None:
    server: Any = tcp_server.TCPServer
    if getattr(server._close, _PATCHED, False):
        return
    close = server._close

    async def shielded_close(self: object) -> None:
        with trio.CancelScope(shield=True):
            await close(self)

    setattr(shielded_close, _PATCHED, True)
    server._close = shielded_close


def _json_protocol_errors() -> None:
    protocol: Any = hypercorn_h11.H11Protocol
    if getattr(protocol._send_error_response, _PATCHED, False):
        return

    async def send_json_error(self: Any, status_code: int) -> None:
        code, message = _PROTOCOL_ERRORS.get(status_code, _PROTOCOL_ERRORS[400])
        body = msgspec.json.encode({"error": {"code": code, "message": message}})
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode("ascii")),
            (b"connection", b"close"),
        ]
        response = h11.Response(
            status_code=status_code,
            headers=list(chain(headers, self.config.response_headers("h11"))),
        )
        await self._send_h11_event(response)
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

    setattr(send_json_error, _PATCHED, True)
    protocol._send_error_response = send_json_error


#: the head of a response waiting for its body (H11Protocol instance attribute)
_HELD = "_gemmanet_held_head"


def _encode(protocol: Any, event: h11.Event) -> bytes | None:
    """``event`` as bytes, as Hypercorn's ``_send_h11_event`` does (None: the peer broke the
    protocol already, nothing to send)."""
    try:
        return bytes(protocol.connection.send(event))
    except h11.LocalProtocolError:
        if protocol.connection.their_state != h11.ERROR:
            raise
        return None


def _declares_length(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() == b"content-length" for name, _ in headers)


def _one_write_per_response() -> None:
    protocol: Any = hypercorn_h11.H11Protocol
    if getattr(protocol.stream_send, _PATCHED, False):
        return
    stream_send = protocol.stream_send

    async def coalescing_stream_send(self: Any, event: object) -> None:
        held: bytes | None = getattr(self, _HELD, None)
        if (
            isinstance(event, Response)
            and event.status_code >= 200
            and _declares_length(event.headers)
        ):
            # As Hypercorn builds the head (hypercorn/protocol/h11.py), held until the body.
            headers = list(chain(event.headers, self.config.response_headers("h11")))
            if self.keep_alive_requests >= self.config.keep_alive_max_requests:
                headers.append((b"connection", b"close"))
            head = h11.Response(
                headers=headers, status_code=event.status_code, reason=_reason(event.status_code)
            )
            setattr(self, _HELD, _encode(self, head) or b"")
            return
        if isinstance(event, Body | EndBody):
            setattr(self, _HELD, None)
            message = h11.Data(data=event.data) if isinstance(event, Body) else h11.EndOfMessage()
            # The end of a response with a length is no bytes at all: no write for it.
            data = (held or b"") + (_encode(self, message) or b"")
            if data:
                await self.send(RawData(data=data))
            return
        if held is not None:  # anything else (the stream closing early) goes after the head
            setattr(self, _HELD, None)
            if held:
                await self.send(RawData(data=held))
        await stream_send(self, event)

    setattr(coalescing_stream_send, _PATCHED, True)
    protocol.stream_send = coalescing_stream_send


def _small_reads() -> None:
    # TCPServer._read_data looks the module global up on every read.
    tcp_server.MAX_RECV = READ_BYTES
