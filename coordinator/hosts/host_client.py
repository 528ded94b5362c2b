"""What every wire format of a model host shares: one short error for every way a host can
fail, and the reading of the usage numbers a host reports.

The wire formats themselves are ``ollama_wire`` and ``openai_wire``. Each always streams from
the server, even for a task that does not stream: the caller joins the deltas, and cancelling
the caller drops the connection, which stops the generation at once. Every failure of the
server surfaces as :class:`HostError` with a short, loggable message; anything else escaping
is a bug. The caller owns the ``httpx.AsyncClient`` (no read timeout on it: the task's timeout
bounds a call).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from protocol import Usage

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "HostError",
    "describe",
    "short",
    "status_error",
    "token_count",
    "usage_of",
]

_MAX_ERROR_CHARS = 200
#: how much of an error response is read: enough for any server's message, never a whole page
MAX_ERROR_BODY_BYTES = 4096
# Usage travels in the bus and node envelopes, whose decoders refuse counts past this bound:
# a host reporting more must not turn a good answer into an undecodable result.
_MAX_TOKEN_COUNT = 2**53 - 1


class HostError(Exception):
    """The model server failed, refused, or spoke something we cannot read."""


def short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 1] + "…"


def describe(name: str, base_url: str, exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"{name}: cannot connect to {base_url}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{name}: timed out talking to {base_url}"
    if isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError)):
        return f"{name}: connection to {base_url} lost mid-response"
    return short(f"{name}: {type(exc).__name__}: {exc}")


async def status_error(name: str, response: httpx.Response) -> HostError:
    """The HostError of a non-200 answer, with the server's own message when it gave one."""
    detail = ""
    try:
        body = b""
        async for piece in response.aiter_bytes():
            body += piece
            if len(body) >= MAX_ERROR_BODY_BYTES:
                break
        body = body[:MAX_ERROR_BODY_BYTES]
        try:
            payload: Any = json.loads(body)
        except ValueError:
            payload = None
        error = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(error, dict):
            error = error.get("message")
        detail = str(error) if error else body.decode("utf-8", "replace")
    except httpx.HTTPError:
        pass
    reason = f"{name}: HTTP {response.status_code}"
    return HostError(short(f"{reason}: {detail}" if detail else reason))


def token_count(value: object) -> int | None:
    """``value`` as a token count, or None when it is not one (absent, negative, a bool...)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= _MAX_TOKEN_COUNT else None


def usage_of(prompt: object, completion: object) -> Usage | None:
    prompt_tokens, completion_tokens = token_count(prompt), token_count(completion)
    if prompt_tokens is None or completion_tokens is None:
        return None
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
