"""Errors of the Ollama-compatible routes in Ollama's shape, ``{"error": "<message>"}``, with
the native API's HTTP statuses and headers (Retry-After on 429 and 503, WWW-Authenticate on
401). One rename, as Ollama answers it: a model no online node serves is a 404 whose message
says "model not found" (the native API answers 503 ``no_node_for_model``; Ollama clients take
a 404 as "no such model" and offer to pull it). A failure after a stream began is one last
NDJSON line of the same shape (the ollama library raises it as a ``ResponseError``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgspec
from quart import Blueprint, Response
from werkzeug.exceptions import HTTPException

from coordinator.api.errors import http_error_message
from coordinator.api.ollama.schemas import OllamaError
from coordinator.api.rate_charge import rate_first
from coordinator.errors import GemmaNetError, NoNodeForModel

log = logging.getLogger("gemmanet.api")
_json = msgspec.json.Encoder()

__all__ = ["error_line", "install_ollama_error_handlers", "ollama_error", "ollama_error_of"]


def ollama_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        _json.encode(OllamaError(error=message)),
        status,
        dict(headers or {}),
        content_type="application/json",
    )


def _status_and_message(exc: GemmaNetError) -> tuple[int, str]:
    if isinstance(exc, NoNodeForModel):
        return 404, f"model not found: {exc.client_message}"
    return exc.status, exc.client_message


def ollama_error_of(exc: GemmaNetError) -> Response:
    status, message = _status_and_message(exc)
    # Retry-After belongs to the 503; a 404 is not worth retrying on a timer.
    headers = {} if status == 404 else exc.headers()
    return ollama_error(status, message, headers)


def error_line(exc: GemmaNetError) -> bytes:
    """The last NDJSON line of a stream that failed after its 200."""
    return _json.encode(OllamaError(error=_status_and_message(exc)[1])) + b"\n"


def install_ollama_error_handlers(blueprint: Blueprint) -> None:
    """Errors raised in the blueprint's routes answer in Ollama's shape (Quart asks a
    blueprint's handlers before the app's)."""

    @blueprint.errorhandler(GemmaNetError)
    async def _ours(exc: GemmaNetError) -> Response:
        return ollama_error_of(await rate_first(exc))

    @blueprint.errorhandler(HTTPException)
    async def _http(exc: HTTPException) -> Response:
        status = exc.code or 500
        # A 413 is sent before the body was read: the connection cannot carry another request.
        headers = {"Connection": "close"} if status == 413 else {}
        return ollama_error(status, http_error_message(exc), headers)

    @blueprint.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return ollama_error(500, "internal error; see the coordinator log")
