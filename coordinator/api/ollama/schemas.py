"""Bodies of the Ollama-compatible API (``/api/chat``, ``/api/generate``, ``/api/tags``,
``/api/ps``, ``/api/version``), in Ollama's shapes, and what a request means as a task.

Requests are decoded with msgspec, ignoring unknown fields as Ollama does (clients send
``keep_alive``, ``num_ctx``, ``repeat_penalty``, ``mirostat``, … which no node here can be
given). What a node can honour is decoded with protocol v2's option ranges (422 beyond them);
what it cannot is decoded only to be refused by name (400). The response Structs forbid unknown
fields and omit what the node did not report, so a record never carries a guessed number.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NoReturn

import msgspec

from coordinator.api.schemas import ModelName, TimeoutS
from coordinator.errors import InvalidFields, UnsupportedContent, UnsupportedParameter
from protocol import Message, Options
from protocol.conversation import (
    MAX_MESSAGES,
    MAX_TOKENS_LIMIT,
    Penalty,
    Role,
    Seed,
    StopList,
    StopString,
    Temperature,
    TopK,
    TopP,
)

#: Ollama's "no bound" for ``num_predict`` (its default): the node's model server decides.
NO_TOKEN_BOUND = -1


class _Response(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


# --- requests ----------------------------------------------------------------------------------


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Role
    # Null or missing: an assistant turn that only called tools.
    content: str | None = None
    # Decoded as anything, so an odd image is refused by name (400), not as a type error.
    images: list[Any] | None = None
    tool_calls: list[Any] | None = None


class OllamaOptions(msgspec.Struct, kw_only=True):
    """The options a node's model server takes, under Ollama's names."""

    # -1 (Ollama's default) leaves the bound to the server; below that is a 422.
    num_predict: Annotated[int, msgspec.Meta(ge=NO_TOKEN_BOUND, le=MAX_TOKENS_LIMIT)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    stop: StopString | StopList | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None


class _Generation(msgspec.Struct, kw_only=True):
    model: ModelName
    # Ollama streams unless told not to.
    stream: bool = True
    options: OllamaOptions | None = None
    # "" (plain text), "json", or a JSON schema the answer must follow.
    format: Literal["", "json"] | dict[str, Any] | None = None
    # Decoded only to be refused by name when they ask for something (request_options).
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # Extension, as ``timeout_s`` of POST /api/v1/request: an upper bound on the task's
    # lifetime (capped by GEMMANET_TASK_TIMEOUT_S).
    timeout_s: TimeoutS | None = None


class ChatRequest(_Generation, kw_only=True):
    # No messages: Ollama's "load the model" request, answered without a task.
    messages: Annotated[list[ChatMessage], msgspec.Meta(max_length=MAX_MESSAGES)] = msgspec.field(
        default_factory=list
    )
    # The ollama library always sends a list, empty unless tools are given.
    tools: list[Any] | None = None


class GenerateRequest(_Generation, kw_only=True):
    # No prompt and no system: Ollama's "load the model" request.
    prompt: str | None = None
    system: str | None = None
    raw: bool | None = None
    suffix: str | None = None
    template: str | None = None
    context: list[Any] | None = None
    images: list[Any] | None = None
    # Ollama's experimental image generation.
    width: Any | None = None
    height: Any | None = None
    steps: Any | None = None


# --- responses ---------------------------------------------------------------------------------


class AssistantMessage(_Response, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str


class _Record(_Response, kw_only=True, omit_defaults=True):
    """One NDJSON record of a stream, or the whole answer. The numbers are the final record's
    only; each is left out when the node did not report what it is made of."""

    model: str
    created_at: str
    done: bool
    done_reason: str | None = None
    #: nanoseconds, as the coordinator measured the request (queue and placement included)
    total_duration: int | None = None
    #: 0: a node does not report its model's load time
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    #: the node's time to its first output
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    #: the node's time from its first output to its end
    eval_duration: int | None = None


class ChatRecord(_Record, kw_only=True):
    message: AssistantMessage


class GenerateRecord(_Record, kw_only=True):
    response: str


class OllamaError(_Response, kw_only=True):
    """Every error of these routes, whatever its status (Ollama's shape)."""

    error: str


class ModelDetails(_Response, kw_only=True):
    """What Ollama knows from a model's file; GemmaNet's nodes do not report it (empty)."""

    parent_model: str = ""
    format: str = ""
    family: str = ""
    families: list[str] = msgspec.field(default_factory=list)
    parameter_size: str = ""
    quantization_level: str = ""


class TagModel(_Response, kw_only=True):
    name: str
    model: str
    #: when the first node now online with the model connected (RFC 3339, UTC)
    modified_at: str
    #: 0: nodes do not report the size of their weights
    size: int = 0
    #: sha256 of the model name: stable, but not the weights' digest (nodes do not report it)
    digest: str
    details: ModelDetails = msgspec.field(default_factory=ModelDetails)


class TagsResponse(_Response, kw_only=True):
    models: list[TagModel]


class RunningModel(_Response, kw_only=True):
    name: str
    model: str
    size: int = 0
    digest: str
    details: ModelDetails = msgspec.field(default_factory=ModelDetails)
    size_vram: int = 0


class PsResponse(_Response, kw_only=True):
    models: list[RunningModel]


class VersionResponse(_Response, kw_only=True):
    version: str


# --- a request as a task -----------------------------------------------------------------------


def _refuse(param: str, why: str) -> NoReturn:
    raise UnsupportedParameter(param, f"'{param}' {why}; this API cannot honour it")


def _check_common(body: _Generation) -> None:
    if body.think:
        _refuse("think", "asks for a thinking model's reasoning")
    if body.logprobs:
        _refuse("logprobs", "asks for log probabilities")
    if body.top_logprobs:
        _refuse("top_logprobs", "asks for log probabilities")


def request_options(body: ChatRequest | GenerateRequest) -> Options:
    """The task's options; raises UnsupportedParameter for what a node cannot honour."""
    _check_common(body)
    if isinstance(body, ChatRequest):
        if body.tools:
            _refuse("tools", "asks for tool calls")
    else:
        if body.images:
            raise UnsupportedContent(
                f"'images' holds {len(body.images)} image(s); only text can be sent to a node"
            )
        if body.raw and body.system:
            _refuse("system", "cannot go with 'raw': true (no template to put it in)")
        for name in ("suffix", "template", "context", "width", "height", "steps"):
            if getattr(body, name):
                _refuse(name, "is set")
    given = body.options or OllamaOptions()
    max_tokens = given.num_predict
    if max_tokens == 0:
        # 0 reads as "an empty answer" to some servers and as "no bound" to others: refused.
        raise InvalidFields(
            "invalid request: options.num_predict is 0; give -1 (no bound) or at least 1"
        )
    stop = [given.stop] if isinstance(given.stop, str) else given.stop
    fmt: dict[str, Any] = {}
    if body.format == "json":
        fmt = {"format": "json"}
    elif isinstance(body.format, dict):
        fmt = {"format": "json", "json_schema": body.format}
    return Options(
        max_tokens=None if max_tokens == NO_TOKEN_BOUND else max_tokens,
        temperature=given.temperature,
        top_p=given.top_p,
        top_k=given.top_k,
        stop=stop or None,
        seed=given.seed,
        presence_penalty=given.presence_penalty,
        frequency_penalty=given.frequency_penalty,
        **fmt,
    )


def chat_messages(messages: list[ChatMessage]) -> list[Message]:
    """The conversation, roles and order kept; an image or a tool call is refused by name."""
    for index, message in enumerate(messages):
        if message.images:
            raise UnsupportedContent(
                f"messages[{index}].images holds {len(message.images)} image(s); only text"
                " can be sent to a node"
            )
        if message.tool_calls:
            _refuse(f"messages[{index}].tool_calls", "holds tool calls")
    return [Message(role=m.role, content=m.content or "") for m in messages]


def generate_input(body: GenerateRequest) -> tuple[str | None, list[Message] | None]:
    """(prompt, messages) of the task: as Ollama does, a prompt goes through the model's chat
    template (a user turn after the ``system`` one) unless ``raw``, when it is sent as is."""
    if body.raw:
        return body.prompt or "", None
    system = [Message(role="system", content=body.system)] if body.system else []
    return None, [*system, Message(role="user", content=body.prompt or "")]


def is_load_request(body: ChatRequest | GenerateRequest) -> bool:
    """Ollama's way to load a model without generating: no messages, or no prompt and no
    system."""
    if isinstance(body, ChatRequest):
        return not body.messages
    return not body.prompt and not body.system
