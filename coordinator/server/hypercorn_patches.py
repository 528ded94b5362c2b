"""Small, tested workarounds for Hypercorn's HTTP/1.1 server, for the releases in
``SUPPORTED_HYPERCORN`` (pyproject.toml's range; CI tests the version in constraints.txt).

They reach into Hypercorn's private ``H11Protocol`` and ``TCPServer``, so ``apply`` first checks
the installed Hypercorn and refuses, in one line (``StartupRefused``), any release outside that
range: a release that renamed what they wrap would otherwise be patched wrongly, or silently
not at all. Each patch wraps the method Hypercorn calls and works on what that method is handed
or asks to send, without a copy of Hypercorn's own code, so Hypercorn's logic (keep-alive
limits, its configured response headers, h11's framing) stays Hypercorn's.

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
  length) are written as before: their head leaves at once, whenever the first chunk comes, and
  each chunk is one write, handed straight to Hypercorn (nothing is held to join it with).
* Reads of 4 KiB instead of 64 KiB (``READ_BYTES``). CPython's ``recv(n)`` allocates ``n`` bytes
  and shrinks the block to what arrived; a 64 KiB block comes from glibc's heap, its freed tail
  is soon taken by longer-lived allocations, and the holes left (40-64 KiB, just too small for
  the next read) made the main heap grow under steady load while Python's own allocations
  stayed flat: about half the RSS growth ``gemmanet loadtest`` measured (docs/benchmarks.md "Load test";
  the rest was in the worker threads' arenas, ``heap_trim``). A coordinator's requests and node
  frames are small; a 1 MiB prompt takes 256 reads instead of 16.

tests/coordinator/test_response_writes.py drives the patched protocol directly,
tests/coordinator/test_heap_memory.py measures the reads, tests/test_dependency_versions.py
checks the refusal of an unsupported Hypercorn.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import h11
import msgspec
import trio
from hypercorn.events import Event, RawData
from hypercorn.protocol import h11 as hypercorn_h11
from hypercorn.protocol.events import Body, EndBody, Response
from hypercorn.trio import tcp_server

from coordinator.versions import require_release

_PATCHED = "_gemmanet_patched"

#: the Hypercorn releases the patches are written for: (major, minor) from, and below
SUPPORTED_HYPERCORN = ((0, 18), (0, 19))

#: bytes asked of the socket per read (Hypercorn's own is 64 KiB)
READ_BYTES = 4096

#: the JSON error for Hypercorn's own protocol-level answers (h11 gives only the status)
_PROTOCOL_ERRORS = {
    400: ("bad_request", "the request is not valid HTTP/1.1"),
    413: ("payload_too_large", "the request is too large"),
    431: ("headers_too_large", "the request line and headers exceed the server's limit"),
}


def apply() -> None:
    """Install every workaround once per process; refuse (``StartupRefused``, one line) a
    Hypercorn release they were not written for."""
    check_hypercorn_version()
    _send_reason_phrases()
    _close_when_asked()
    _json_protocol_errors()
    _one_write_per_response()
    _small_reads()


def check_hypercorn_version() -> None:
    """The installed Hypercorn is one of ``SUPPORTED_HYPERCORN``, or ``StartupRefused``."""
    require_release(
        "hypercorn",
        SUPPORTED_HYPERCORN,
        name="Hypercorn",
        needed_by="GemmaNet's workarounds for its HTTP/1.1 server support",
    )


@functools.cache
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
            # The constructor, not dataclasses.replace (which looks up the fields on every
            # call): the headers are h11's already, so they are not validated again.
            event = h11.Response(
                headers=event.headers,
                status_code=event.status_code,
                http_version=event.http_version,
                reason=_reason(event.status_code),
            )
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


def _with_json_body(headers: Any, body: bytes) -> list[tuple[bytes, bytes]]:
    """Hypercorn's headers of an empty error response (its ``content-length: 0``, its
    ``connection: close``, the configured ones), for ``body`` as JSON."""
    length = str(len(body)).encode("ascii")
    kept = [(name, length if name == b"content-length" else value) for name, value in headers]
    return [(b"content-type", b"application/json"), *kept]


def _json_protocol_errors() -> None:
    protocol: Any = hypercorn_h11.H11Protocol
    if getattr(protocol._send_error_response, _PATCHED, False):
        return
    error_response = protocol._send_error_response

    async def send_json_error(self: Any, status_code: int) -> None:
        code, message = _PROTOCOL_ERRORS.get(status_code, _PROTOCOL_ERRORS[400])
        body = msgspec.json.encode({"error": {"code": code, "message": message}})
        send = self._send_h11_event
        # Only this task's events are Hypercorn's error response: an application task still
        # answering the same connection (a request whose body turned out malformed) writes
        # through the same method while this one waits on the socket.
        task = trio.lowlevel.current_task()

        async def send_with_body(event: object) -> None:
            if trio.lowlevel.current_task() is task:
                if isinstance(event, h11.Response):
                    event = h11.Response(
                        status_code=event.status_code,
                        headers=_with_json_body(event.headers, body),
                        http_version=event.http_version,
                        reason=event.reason,
                    )
                elif isinstance(event, h11.EndOfMessage):
                    await send(h11.Data(data=body))
            await send(event)

        # Hypercorn builds the response and ends it; an instance attribute shadows the method
        # for the length of this call, so what it sends gains the body on the way.
        self._send_h11_event = send_with_body
        try:
            await error_response(self, status_code)
        finally:
            del self._send_h11_event

    setattr(send_json_error, _PATCHED, True)
    protocol._send_error_response = send_json_error


#: the head of a response waiting for its body (H11Protocol instance attribute)
_HELD = "_gemmanet_held_head"


async def _written(protocol: Any, call: Callable[[], Awaitable[None]]) -> tuple[bytes, list[Event]]:
    """Runs ``call`` (a Hypercorn method) with the protocol's writes caught instead of sent:
    the bytes it asked to write, and any other event it sent (passed on after)."""
    written: list[bytes] = []
    others: list[Event] = []

    async def catch(event: Event) -> None:
        if isinstance(event, RawData):
            written.append(event.data)
        else:
            others.append(event)

    # ``send`` is the TCP server's writer, kept by the protocol; ``catch`` never yields, so no
    # other task can write through the protocol while it stands in.
    send = protocol.send
    protocol.send = catch
    try:
        await call()
    finally:
        protocol.send = send
    return b"".join(written), others


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
            # Hypercorn builds and encodes the head; its write is held until the body.
            head, others = await _written(self, lambda: stream_send(self, event))
            setattr(self, _HELD, head)
            for other in others:
                await self.send(other)
            return
        if isinstance(event, Body) and held is None:
            # A chunk of a streamed body (or a later piece of one with a length): nothing to
            # join it with, and Hypercorn writes it once itself; no catching, no copy.
            await stream_send(self, event)
            return
        if isinstance(event, Body | EndBody):
            setattr(self, _HELD, None)
            # The end of a response with a length is no bytes at all: no write for it.
            data, others = await _written(self, lambda: stream_send(self, event))
            data = (held or b"") + data
            if data:
                await self.send(RawData(data=data))
            for other in others:
                await self.send(other)
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
