"""Bodies of the OpenAI-compatible API (``/v1/...``), in OpenAI's shapes.

Requests are decoded with msgspec like the native API's, but unknown fields are ignored (not
refused): OpenAI clients send many optional fields (``user``, ``metadata``, ``store``, …).
The parameters a node can honour are decoded with protocol v2's option ranges; those it
cannot honour are decoded only to be refused by name (``openai_params``). The responses are
Structs like ``schemas``'s, so /openapi.json documents them too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from coordinator.api.schemas import ModelName, TimeoutS
from protocol import FinishReason
from protocol.conversation import (
    MAX_MESSAGES,
    MaxTokens,
    Penalty,
    Seed,
    StopList,
    StopString,
    Temperature,
    TopK,
    TopP,
)

# Roles OpenAI's chat API defines; anything else is a 422 (a typo, not a new kind of message).
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Response(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


# --- requests ----------------------------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a message's content list. Only ``{"type": "text", "text": …}`` can reach a
    node; other types (``image_url``, ``input_audio``, …) decode here and are refused with 400
    ``unsupported_content``, so the client learns which part it was."""

    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Role
    # A string, a list of parts, or null (an assistant turn that only called tools).
    content: str | list[ContentPart] | None = None


class JsonSchemaSpec(msgspec.Struct, kw_only=True):
    name: str | None = None
    schema_: dict[str, Any] | None = msgspec.field(default=None, name="schema")
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _Sampling(msgspec.Struct, kw_only=True):
    """What chat and text completions share."""

    model: ModelName
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    # Not OpenAI's, but vLLM's and Ollama's: passed on where the server takes it.
    top_k: TopK | None = None
    stop: StopString | StopList | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # Decoded only to be refused by name when set (openai_params).
    n: int | None = None
    logit_bias: dict[str, Any] | None = None
    # Extension, as ``timeout_s`` of POST /api/v1/request: an upper bound on the task's
    # lifetime (capped by GEMMANET_TASK_TIMEOUT_S).
    timeout_s: TimeoutS | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    audio: Any | None = None
    prediction: Any | None = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | Annotated[list[str], msgspec.Meta(min_length=1)]
    max_tokens: MaxTokens | None = None
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


# --- responses ---------------------------------------------------------------------------------


class Usage(_Response):
    """Tokens as the node's model server counted them."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(_Response, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str


class CompletionChoice(_Response, kw_only=True):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason = "stop"
    logprobs: None = None


class ChatCompletion(_Response, kw_only=True):
    """A finished chat completion. ``id`` is ``chatcmpl-`` + the task id, which rates the answer
    through ``POST /api/v1/tasks/{id}/rating``. ``usage`` is null when the node did not say
    (a protocol v1 node, a model server that does not count)."""

    __event_stream__ = (
        'with "stream": true: `data: <chat.completion.chunk>` lines, then `data: [DONE]`'
    )

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None


class TextChoice(_Response, kw_only=True):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: None = None


class TextCompletion(_Response, kw_only=True):
    """A finished (or, streamed, one piece of a) text completion: ``cmpl-`` + the task id."""

    __event_stream__ = 'with "stream": true: `data: <text_completion>` lines, then `data: [DONE]`'

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None | msgspec.UnsetType = msgspec.UNSET


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
    # The request parameter at fault, where one is (an unsupported or invalid parameter).
    param: str | None = None
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
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(_Response, kw_only=True):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    # With ``stream_options.include_usage``: null on every chunk but the last one, which has
    # no choices and the usage (OpenAI's convention). Absent otherwise.
    usage: Usage | None | msgspec.UnsetType = msgspec.UNSET
