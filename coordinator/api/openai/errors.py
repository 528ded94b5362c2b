"""Errors of the /v1 routes in OpenAI's shape: ``{"error": {"message", "type", "param": null,
"code"}}``, with the native API's HTTP statuses and headers (Retry-After, WWW-Authenticate).
``param`` names the request parameter at fault where there is one (an unsupported parameter,
or the field a 422 points at).

The ``code`` is the native error code, with two renames OpenAI clients know: a bad or missing
key is ``invalid_api_key``, and a model no online node serves is ``404 model_not_found`` (the
native API answers that one with 503 ``no_node_for_model``: OpenAI's SDKs treat an unknown model
as a 404, and one that a node may bring later cannot be told apart from a typo anyway).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import msgspec
from quart import Blueprint, Response
from werkzeug.exceptions import HTTPException

from coordinator.api.errors import http_error_code, http_error_message
from coordinator.api.openai.schemas import OpenAIErrorDetail, OpenAIErrorResponse
from coordinator.api.rate_charge import rate_first
from coordinator.errors import (
    GemmaNetError,
    InvalidFields,
    NoNodeForModel,
    Unauthorized,
    UnsupportedParameter,
)

log = logging.getLogger("gemmanet.api")
# msgspec's validation messages end with the path of the field: "... - at `$.max_tokens`".
_FIELD_PATH = re.compile(r"at `\$\.([A-Za-z_][A-Za-z0-9_]*)")
_json = msgspec.json.Encoder()


def error_type(status: int) -> str:
    """OpenAI's ``type`` for a status (its SDKs pick the exception class by status alone)."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def openai_error(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    param: str | None = None,
) -> Response:
    return Response(
        _json.encode(openai_error_body(status, code, message, param)),
        status,
        dict(headers or {}),
        content_type="application/json",
    )


def openai_error_body(
    status: int, code: str, message: str, param: str | None = None
) -> OpenAIErrorResponse:
    detail = OpenAIErrorDetail(message=message, type=error_type(status), code=code, param=param)
    return OpenAIErrorResponse(error=detail)


def param_of(exc: GemmaNetError) -> str | None:
    if isinstance(exc, UnsupportedParameter):
        return exc.param
    if isinstance(exc, InvalidFields):
        found = _FIELD_PATH.search(exc.message)
        return found.group(1) if found else None
    return None


def status_and_code(exc: GemmaNetError) -> tuple[int, str]:
    if isinstance(exc, NoNodeForModel):
        return 404, "model_not_found"
    if isinstance(exc, Unauthorized):
        return exc.status, "invalid_api_key"
    return exc.status, exc.code


def openai_error_of(exc: GemmaNetError) -> Response:
    status, code = status_and_code(exc)
    # Retry-After belongs to the 503; a 404 is not worth retrying on a timer.
    headers = {} if status == 404 else exc.headers()
    return openai_error(status, code, exc.client_message, headers, param_of(exc))


def install_openai_error_handlers(blueprint: Blueprint) -> None:
    """Errors raised in the blueprint's routes answer in OpenAI's shape (Quart asks a
    blueprint's handlers before the app's)."""

    @blueprint.errorhandler(GemmaNetError)
    async def _ours(exc: GemmaNetError) -> Response:
        return openai_error_of(await rate_first(exc))

    @blueprint.errorhandler(HTTPException)
    async def _http(exc: HTTPException) -> Response:
        status = exc.code or 500
        headers = {"Connection": "close"} if status == 413 else {}
        return openai_error(status, http_error_code(status), http_error_message(exc), headers)

    @blueprint.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return openai_error(500, "internal_error", "internal error; see the coordinator log")
