"""Every error leaves as INTERFACE.md's JSON body, never an HTML page or a traceback."""

from __future__ import annotations

import logging

from quart import Quart, Response
from werkzeug.exceptions import HTTPException

from coordinator.api.rate_charge import rate_first
from coordinator.api.responses import error_of, error_response
from coordinator.errors import GemmaNetError

log = logging.getLogger("gemmanet.api")

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}
_HTTP_MESSAGES = {
    404: "no such endpoint",
    405: "method not allowed on this endpoint",
    413: "request body exceeds the size limit",
}


def http_error_code(status: int) -> str:
    """The JSON error code of a Werkzeug HTTP error (also used by the OpenAI-compatible API)."""
    return _HTTP_CODES.get(status, "http_error")


def http_error_message(exc: HTTPException) -> str:
    status = exc.code or 500
    return _HTTP_MESSAGES.get(status, exc.description or http_error_code(status))


def install_error_handlers(app: Quart) -> None:
    @app.errorhandler(GemmaNetError)
    async def _ours(exc: GemmaNetError) -> Response:
        return error_of(await rate_first(exc))

    @app.errorhandler(HTTPException)
    async def _http(exc: HTTPException) -> Response:
        status = exc.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        message = _HTTP_MESSAGES.get(status, exc.description or code)
        # A 413 is sent before the body was read; the connection cannot carry another
        # request (the rest of the body is still on the wire), so tell the client to close it.
        headers = {"Connection": "close"} if status == 413 else {}
        return error_response(status, code, message, headers)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal_error", "internal error; see the coordinator log")
