"""The OpenAI-compatible API (OpenAI, vLLM, llama.cpp, ...): a conversation goes to ``POST
/v1/chat/completions``, a raw prompt to ``POST /v1/completions``; both stream server-sent events
to ``[DONE]`` and ask for the usage chunk (``stream_options.include_usage``) that comes last,
with no choices.

The sampling options keep their names; ``top_k``, which OpenAI lacks, is vLLM's extra
parameter of that name (sent only when a task sets it, since OpenAI itself refuses it). The
answer format is ``response_format``: a JSON object, or a JSON schema named ``response``.
Sans-IO: :func:`openai_call` says what to send and reads the lines the caller's HTTP client
receives.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from protocol.conversation import FinishReason, Message, Options, Usage
from protocol.model_servers.generation import Finish, Generation
from protocol.model_servers.server_call import HostError, ServerCall, load_json, short, usage_of

__all__ = ["openai_call", "openai_request", "read_openai_stream"]

_NAME = "openai"
# Sent under the same name, only when a task sets them (None: the server's default).
_PARAMETERS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
)
_REASONS: dict[str, FinishReason] = {"length": "length", "content_filter": "content_filter"}


def openai_call(request: Generation) -> ServerCall:
    """The call that asks an OpenAI-compatible server for ``request`` and reads its answer."""
    path, body = openai_request(request)
    chat = path == "/v1/chat/completions"

    def read(lines: AsyncIterator[str]) -> AsyncGenerator[str | Finish, None]:
        return read_openai_stream(lines, chat=chat)

    return ServerCall(
        server=_NAME, path=path, body=body, read=read, headers={"Accept": "text/event-stream"}
    )


def openai_request(request: Generation) -> tuple[str, dict[str, Any]]:
    """The path and JSON body that ask an OpenAI-compatible server for ``request``."""
    body: dict[str, Any] = {"model": request.model}
    if request.messages is not None:
        path = "/v1/chat/completions"
        body["messages"] = [_message(m) for m in request.messages]
    else:
        path = "/v1/completions"
        body["prompt"] = request.prompt or ""
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if request.options is not None:
        body.update(_parameters(request.options))
    return path, body


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        # The API types a tool turn by the id of the call it answers; a conversation of ours
        # carries no tool calls, so there is no id to give (servers that check say so: 400).
        return {"role": "tool", "content": message.content, "tool_call_id": ""}
    return {"role": message.role, "content": message.content}


def _parameters(options: Options) -> dict[str, Any]:
    fields = {name: getattr(options, name) for name in _PARAMETERS}
    fields = {name: value for name, value in fields.items() if value is not None}
    if options.json_schema is not None:
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": options.json_schema},
        }
    elif options.format == "json":
        fields["response_format"] = {"type": "json_object"}
    return fields


async def read_openai_stream(
    lines: AsyncIterator[str], *, chat: bool
) -> AsyncGenerator[str | Finish, None]:
    """The deltas of a server-sent-event answer of ``/v1/chat/completions`` (``chat``) or
    ``/v1/completions``, then one Finish; a stream that ends unfinished is a HostError."""
    usage: Usage | None = None
    reason: FinishReason | None = None
    finished = False
    async for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, ": comments", "event:" / "id:" fields
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            finished = True
            break
        event = _event(data)
        # Some servers (vLLM's continuous usage) count in every chunk: the last wins.
        usage = _usage(event.get("usage")) or usage
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            piece = _piece(choice, chat)
            if piece:
                yield piece
            said = choice.get("finish_reason")
            if said:
                reason = _REASONS.get(said, "stop") if isinstance(said, str) else "stop"
                finished = True
    # A server that leaves out [DONE] but said why it finished has answered whole.
    if not finished:
        raise HostError("openai: stream ended before [DONE]")
    yield Finish(usage=usage, finish_reason=reason)


def _event(data: str) -> dict[str, Any]:
    try:
        event = load_json(data)
    except ValueError:
        raise HostError(short(f"openai: malformed event {short(data)!r}")) from None
    if not isinstance(event, dict):
        raise HostError(short(f"openai: malformed event {short(data)!r}"))
    if event.get("error"):
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise HostError(short(f"openai: {message}"))
    return event


def _piece(choice: dict[str, Any], chat: bool) -> str | None:
    if chat:
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else None
    else:
        piece = choice.get("text")
    if piece is not None and not isinstance(piece, str):
        raise HostError(short(f"openai: malformed output {short(repr(piece))}"))
    return piece


def _usage(value: object) -> Usage | None:
    if not isinstance(value, dict):
        return None
    return usage_of(value.get("prompt_tokens"), value.get("completion_tokens"))
