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
"""

from __future__ import annotations

import dataclasses
from http import HTTPStatus
from itertools import chain
from typing import Any

import h11
import msgspec
import trio
from hypercorn.protocol import h11 as hypercorn_h11
from hypercorn.trio import tcp_server

_PATCHED = "_gemmanet_patched"

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
