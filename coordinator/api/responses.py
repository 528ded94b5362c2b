"""Typed JSON responses: every body leaves as one Struct of ``schemas``, encoded by msgspec."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from quart import Response

from coordinator.api.schemas import ErrorDetail, ErrorResponse
from coordinator.errors import GemmaNetError

_json = msgspec.json.Encoder()


def json_response(
    body: msgspec.Struct, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        _json.encode(body), status, dict(headers or {}), content_type="application/json"
    )


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return json_response(
        ErrorResponse(error=ErrorDetail(code=code, message=message)), status, headers
    )


def error_of(exc: GemmaNetError) -> Response:
    return error_response(exc.status, exc.code, exc.client_message, exc.headers())
