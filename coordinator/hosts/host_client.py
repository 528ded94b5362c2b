"""The wire formats of direct model hosts, one async generator of output deltas each.

* :func:`ollama_generate` - Ollama's ``POST /api/generate``, read as an NDJSON stream to the
  ``done`` record;
* :func:`openai_generate` - an OpenAI-compatible ``POST /v1/chat/completions`` with
  ``stream: true``, read as server-sent events to ``[DONE]``.

Both always stream from the server, even for a task that does not stream: the caller joins
the deltas, and cancelling the caller drops the connection, which stops the generation at
once. Every failure of the server surfaces as :class:`HostError` with a short, loggable
message; anything else escaping is a bug. The caller owns the ``httpx.AsyncClient`` (no read
timeout on it: the task's timeout bounds a call).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

__all__ = ["HostError", "describe", "ollama_generate", "openai_generate", "short"]

_MAX_ERROR_CHARS = 200


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
    detail = ""
    try:
        body = (await response.aread())[:4096]
        payload: Any = json.loads(body)
        error = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(error, dict):
            error = error.get("message")
        detail = str(error) if error else body.decode("utf-8", "replace")
    except (ValueError, httpx.HTTPError):
        pass
    reason = f"{name}: HTTP {response.status_code}"
    return HostError(short(f"{reason}: {detail}" if detail else reason))


async def ollama_generate(
    client: httpx.AsyncClient, base_url: str, model: str, prompt: str
) -> AsyncIterator[str]:
    body = {"model": model, "prompt": prompt, "stream": True}
    try:
        async with client.stream("POST", f"{base_url}/api/generate", json=body) as response:
            if response.status_code != 200:
                raise await status_error("ollama", response)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    raise HostError(f"ollama: malformed stream line {short(line)!r}") from None
                if not isinstance(record, dict):
                    raise HostError(f"ollama: malformed stream line {short(line)!r}")
                if record.get("error"):
                    raise HostError(short(f"ollama: {record['error']}"))
                piece = record.get("response")
                if isinstance(piece, str) and piece:
                    yield piece
                if record.get("done"):
                    return
            raise HostError("ollama: stream ended before the final done record")
    except httpx.HTTPError as exc:
        raise HostError(describe("ollama", base_url, exc)) from exc


async def openai_generate(
    client: httpx.AsyncClient, base_url: str, model: str, prompt: str
) -> AsyncIterator[str]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True}
    finished = False
    try:
        async with client.stream(
            "POST",
            f"{base_url}/v1/chat/completions",
            json=body,
            headers={"Accept": "text/event-stream"},
        ) as response:
            if response.status_code != 200:
                raise await status_error("openai", response)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, ": comments", "event:" / "id:" fields
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    return
                try:
                    event = json.loads(data)
                except ValueError:
                    raise HostError(f"openai: malformed event {short(data)!r}") from None
                if not isinstance(event, dict):
                    raise HostError(f"openai: malformed event {short(data)!r}")
                if event.get("error"):
                    error = event["error"]
                    message = error.get("message") if isinstance(error, dict) else error
                    raise HostError(short(f"openai: {message}"))
                for choice in event.get("choices") or ():
                    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                        continue
                    delta = choice.get("delta") or {}
                    content = delta.get("content") if isinstance(delta, dict) else None
                    if isinstance(content, str) and content:
                        yield content
                    if choice.get("finish_reason"):
                        finished = True
            if not finished:
                raise HostError("openai: stream ended before [DONE]")
    except httpx.HTTPError as exc:
        raise HostError(describe("openai", base_url, exc)) from exc
