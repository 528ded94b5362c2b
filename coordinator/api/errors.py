"""Every error leaves as INTERFACE.md's JSON body, never an HTML page or a traceback."""

from __future__ import annotations

import logging
from typing import Any

from quart import Quart
from werkzeug.exceptions import HTTPException

from coordinator.errors import GemmaNetError
from coordinator.store import StoreError

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


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None):
    body: dict[str, Any] = {"error": {"code": code, "message": message}}
    return body, status, headers or {}


def install_error_handlers(app: Quart) -> None:
    @app.errorhandler(GemmaNetError)
    async def _ours(exc: GemmaNetError) -> Any:
        return exc.body(), exc.status, exc.headers()

    @app.errorhandler(StoreError)
    async def _store(exc: StoreError) -> Any:
        status = getattr(exc, "http_status", 500)
        headers = {"Retry-After": "1"} if status == 503 else {}
        return error_response(status, getattr(exc, "code", "store_error"), str(exc), headers)

    @app.errorhandler(HTTPException)
    async def _http(exc: HTTPException) -> Any:
        status = exc.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        message = {
            404: "no such endpoint",
            405: "method not allowed on this endpoint",
            413: "request body exceeds the size limit",
        }.get(status, exc.description or code)
        # A 413 is sent before the body was read; the connection cannot carry another
        # request (the rest of the body is still on the wire), so tell the client to close it.
        headers = {"Connection": "close"} if status == 413 else {}
        return error_response(status, code, message, headers)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Any:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal_error", "internal error; see the coordinator log")
