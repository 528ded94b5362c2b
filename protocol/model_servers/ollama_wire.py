"""Ollama's native API: a conversation goes to ``POST /api/chat``, a raw prompt to ``POST
/api/generate``; both are read as an NDJSON stream to the ``done`` record, whose counts and
``done_reason`` make the :class:`Finish`.

Ollama knows no ``developer`` role, so it is sent as ``system`` (the role it renames). The
sampling options go into Ollama's ``options`` object under Ollama's names (``max_tokens`` is
``num_predict``); the answer format is a top-level ``format``: ``"json"``, or the JSON schema
itself. Sans-IO: :func:`ollama_call` says what to send and reads the lines the caller's HTTP
client receives.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from protocol.conversation import FinishReason, Options
from protocol.model_servers.generation import Finish, Generation
from protocol.model_servers.server_call import HostError, ServerCall, load_json, short, usage_of

__all__ = ["ollama_call", "ollama_request", "read_ollama_stream"]

_NAME = "ollama"
# Ours -> Ollama's ``options`` field; only those a task sets are sent (None: the model's own).
_OPTION_FIELDS = (
    ("max_tokens", "num_predict"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("stop", "stop"),
    ("seed", "seed"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
)


def ollama_call(request: Generation) -> ServerCall:
    """The call that asks Ollama for ``request`` and reads its answer."""
    path, body = ollama_request(request)
    chat = path == "/api/chat"

    def read(lines: AsyncIterator[str]) -> AsyncGenerator[str | Finish, None]:
        return read_ollama_stream(lines, chat=chat)

    return ServerCall(server=_NAME, path=path, body=body, read=read)


def ollama_request(request: Generation) -> tuple[str, dict[str, Any]]:
    """The path and JSON body that ask Ollama for ``request``."""
    body: dict[str, Any] = {"model": request.model}
    if request.messages is not None:
        path = "/api/chat"
        body["messages"] = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            for m in request.messages
        ]
    else:
        path = "/api/generate"
        body["prompt"] = request.prompt or ""
        # A task's prompt is raw text: no template of Ollama's around it (a conversation is
        # what gets the model's chat template, through /api/chat).
        body["raw"] = True
    body["stream"] = True
    if request.options is not None:
        body.update(_options(request.options))
    return path, body


def _options(options: Options) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    mapped = {
        theirs: getattr(options, ours)
        for ours, theirs in _OPTION_FIELDS
        if getattr(options, ours) is not None
    }
    if mapped:
        fields["options"] = mapped
    if options.json_schema is not None:
        fields["format"] = options.json_schema
    elif options.format == "json":
        fields["format"] = "json"
    return fields


async def read_ollama_stream(
    lines: AsyncIterator[str], *, chat: bool
) -> AsyncGenerator[str | Finish, None]:
    """The deltas of an NDJSON answer of ``/api/chat`` (``chat``) or ``/api/generate``, then
    the Finish of its ``done`` record; a stream that ends before it is a HostError."""
    async for line in lines:
        record = _record(line)
        if record is None:
            continue
        piece = _piece(record, chat)
        if piece:
            yield piece
        if record.get("done"):
            yield _finish(record)
            return
    raise HostError("ollama: stream ended before the final done record")


def _record(line: str) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        record = load_json(line)
    except ValueError:
        raise HostError(short(f"ollama: malformed stream line {short(line)!r}")) from None
    if not isinstance(record, dict):
        raise HostError(short(f"ollama: malformed stream line {short(line)!r}"))
    if record.get("error"):
        raise HostError(short(f"ollama: {record['error']}"))
    return record


def _piece(record: dict[str, Any], chat: bool) -> str | None:
    if chat:
        message = record.get("message")
        if message is None:
            return None
        if not isinstance(message, dict):
            raise HostError(short(f"ollama: malformed message {short(repr(message))}"))
        piece = message.get("content")
    else:
        piece = record.get("response")
    if piece is not None and not isinstance(piece, str):
        raise HostError(short(f"ollama: malformed output {short(repr(piece))}"))
    return piece


def _finish(record: dict[str, Any]) -> Finish:
    # Ollama leaves prompt_eval_count out when the whole prompt came from its cache: nothing
    # was evaluated, so it counts as 0 rather than dropping the usage.
    usage = usage_of(record.get("prompt_eval_count", 0), record.get("eval_count"))
    # Besides stop and length Ollama says "load" / "unload" (no generation): no bound was hit.
    reason: FinishReason = "length" if record.get("done_reason") == "length" else "stop"
    return Finish(usage=usage, finish_reason=reason)
