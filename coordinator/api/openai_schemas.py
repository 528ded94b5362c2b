"""Bodies of the OpenAI-compatible API (``/v1/...``), in OpenAI's shapes.

Requests are decoded with msgspec like the native API's, but unknown fields are ignored (not
refused): OpenAI clients send many optional fields (``temperature``, ``top_p``, ``max_tokens``,
``stream_options``, ``user``, …) that a node cannot honour; docs/interface.md lists them. The
responses are Structs like ``schemas``'s, so /openapi.json documents them too.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from coordinator.api.schemas import ModelName, TimeoutS

# Roles OpenAI's chat API defines; anything else is a 422 (a typo, not a new kind of message).
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Response(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


# --- requests ----------------------------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a message's content list. Only ``{"type": "text", "text": …}`` can become a
    prompt; other types (``image_url``, ``input_audio``, …) decode here and are refused with 400
    ``unsupported_content`` when the prompt is built, so the client learns which part it was."""

    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Role
    # A string, a list of parts, or null (an assistant turn that only called tools).
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(msgspec.Struct, kw_only=True):
    model: ModelName
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    stream: bool = False
    # Extension, as ``timeout_s`` of POST /api/v1/request: an upper bound on the task's
    # lifetime (capped by GEMMANET_TASK_TIMEOUT_S).
    timeout_s: TimeoutS | None = None


# --- responses ---------------------------------------------------------------------------------


class AssistantMessage(_Response, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str


class CompletionChoice(_Response, kw_only=True):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop"] = "stop"
    logprobs: None = None


class Usage(_Response):
    """Always zeros: the coordinator does not tokenize, and nodes report no token counts, so
    any other number would be made up. Present because OpenAI clients expect the object."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ChatCompletion(_Response, kw_only=True):
    """A finished chat completion. ``id`` is ``chatcmpl-`` + the task id, which rates the answer
    through ``POST /api/v1/tasks/{task_id}/rating``."""

    __event_stream__ = (
        'with "stream": true: `data: <chat.completion.chunk>` lines, then `data: [DONE]`'
    )

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(_Response, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    # When the longest-connected node serving the model connected (Unix seconds; 0 if unknown).
    created: int
    owned_by: Literal["gemmanet"] = "gemmanet"


class ModelList(_Response, kw_only=True):
    """Every model some online node serves, on any instance."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class OpenAIErrorDetail(_Response, kw_only=True):
    message: str
    type: str
    param: None = None
    code: str


class OpenAIErrorResponse(_Response):
    """Every error of the /v1 routes, whatever its status (OpenAI's error shape)."""

    error: OpenAIErrorDetail


# --- chunks of a streamed completion (text/event-stream, one per ``data:`` line) ---------------


class ChunkDelta(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    # The first chunk carries only the role, the next ones only content, the last one neither.
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(_Response, kw_only=True):
    index: int = 0
    delta: ChunkDelta
    finish_reason: Literal["stop"] | None = None
    logprobs: None = None


class ChatCompletionChunk(_Response, kw_only=True):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
