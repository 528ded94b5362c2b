"""What every wire format of a model server shares: the call as the caller's HTTP client makes
it, one short error for every way a server can fail, and the reading of the counts it reports.

A :class:`ServerCall` is one ``POST`` that always streams, even for a task that does not: the
caller joins the deltas, and cancelling the caller drops the connection, which stops the
generation at once. The caller owns the HTTP client and the connection: it posts ``body`` to
``path`` with ``request_headers``, and on a 200 feeds the response's text lines to ``read``,
which yields the output deltas and then one ``Finish``; on any other status it hands the first
``MAX_ERROR_BODY_BYTES`` of the body to ``status_error``. How much of an answer is read, lines
and bodies, is ``bounded_reads.py``. Every failure of the server surfaces as :class:`HostError`
with a short, loggable message; the caller maps its own client's connection errors to one too.
Anything else escaping is a bug.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.conversation import Usage
from protocol.model_servers.generation import Finish

__all__ = [
    "UNENCODED",
    "HostError",
    "ServerCall",
    "load_json",
    "short",
    "status_error",
    "token_count",
    "usage_of",
]

_MAX_ERROR_CHARS = 200
#: what every request to a model server asks, so that the bytes its caller counts (every bound of
#: bounded_reads.py) are the bytes the server sent, not what they inflate to
UNENCODED = {"Accept-Encoding": "identity"}
# Usage travels in the bus and node envelopes, whose decoders refuse counts past this bound:
# a host reporting more must not turn a good answer into an undecodable result.
_MAX_TOKEN_COUNT = 2**53 - 1

#: reads a 200 response's text lines into output deltas and one Finish
StreamReader = Callable[[AsyncIterator[str]], AsyncGenerator[str | Finish, None]]


class HostError(Exception):
    """The model server failed, refused, or spoke something we cannot read."""


@dataclass(frozen=True, slots=True)
class ServerCall:
    """One streamed ``POST`` to a model server: what to send and how to read the answer."""

    #: the server's kind ("ollama", "openai"): the first word of every error message
    server: str
    path: str
    body: dict[str, Any]
    read: StreamReader
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def request_headers(self) -> dict[str, str]:
        """``headers``, and the ask for an answer as it is (``UNENCODED``): what to send."""
        return {**self.headers, **UNENCODED}


def short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 1] + "…"


def load_json(data: str | bytes) -> Any:
    """``data`` parsed as JSON, or ValueError. Nesting too deep for the parser is malformed too:
    a few KiB of ``[`` make ``json.loads`` raise RecursionError, which no caller expects."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def status_error(server: str, status: int, body: bytes) -> HostError:
    """The HostError of a non-200 answer, with the server's own message when it gave one."""
    try:
        payload: Any = load_json(body)
    except ValueError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    detail = str(error) if error else body.decode("utf-8", "replace")
    reason = f"{server}: HTTP {status}"
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
