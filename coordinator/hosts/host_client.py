"""The coordinator's HTTP side of a call to a direct model host: one httpx stream per call.

What to send and how to read the answer is sans-IO, in ``protocol/model_servers/`` (the wire
formats of Ollama and OpenAI-compatible servers, shared with the node agent). This opens the
stream, turns a non-200 answer into its short ``HostError`` from the body's first 4 KiB (then
the connection is closed, the rest unread), feeds the body's bytes as they come to the shared
line splitter and its lines to the call's reader, and maps httpx's errors to a ``HostError``
too. The body is asked for unencoded and a compressed one refused, so what the bounds of
``bounded_reads.py`` count (a line at most 1 MiB, a stream 128 MiB) is what the host sent. The
node agent keeps its own copy of these few lines (``tools/node_agent/backends.py``): the
coordinator must not import the tools, and the agent must not import the coordinator. The
caller owns the ``httpx.AsyncClient`` (no read timeout on it: the task's timeout bounds a call).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing

import httpx

from protocol.model_servers import (
    Finish,
    HostError,
    ServerCall,
    bounded_body,
    encoded,
    lines_of,
    short,
    status_error,
)

__all__ = ["describe", "stream_call"]


async def stream_call(
    client: httpx.AsyncClient,
    base_url: str,
    call: ServerCall,
    auth: Mapping[str, str] | None = None,
) -> AsyncGenerator[str | Finish, None]:
    """The output deltas of ``call`` posted to ``base_url``, then its Finish. ``auth``: the
    host's ``Authorization`` header, when it has an API key (no error message quotes it)."""
    headers = {**call.request_headers, **(auth or {})}
    try:
        async with client.stream(
            "POST", f"{base_url}{call.path}", json=call.body, headers=headers
        ) as response:
            if response.status_code != 200:
                raise await _status_error(call.server, response)
            if encoded(response.headers.get("content-encoding")):
                raise HostError(f"{call.server}: the answer came compressed, none was asked for")
            lines = lines_of(response.aiter_bytes(), call.server)
            async with aclosing(lines), aclosing(call.read(lines)) as items:
                async for item in items:
                    yield item
    except httpx.HTTPError as exc:
        raise HostError(describe(call.server, base_url, exc)) from exc


async def _status_error(server: str, response: httpx.Response) -> HostError:
    body = b""  # the status alone says enough, when the body cannot be read as it is
    if not encoded(response.headers.get("content-encoding")):
        try:
            body = await bounded_body(response.aiter_bytes())
        except httpx.HTTPError:
            pass
    return status_error(server, response.status_code, body)


def describe(name: str, base_url: str, exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"{name}: cannot connect to {base_url}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{name}: timed out talking to {base_url}"
    if isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError)):
        return f"{name}: connection to {base_url} lost mid-response"
    return short(f"{name}: {type(exc).__name__}: {exc}")
