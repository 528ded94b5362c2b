"""What the fake OpenAI-compatible server accepts and answers, in the ``openai`` library's own
types (3.51.0).

The requests are the SDK's ``CompletionCreateParamsStreaming`` / ``...NonStreaming``
TypedDicts of ``/v1/chat/completions`` and of ``/v1/completions``, checked with
``pydantic.TypeAdapter``, no key they do not name. vLLM takes a few parameters OpenAI lacks
(an SDK client sends them in ``extra_body``); the ones a GemmaNet node may send are added here
under vLLM's names and types, and nothing else: ``top_k``, and on ``/v1/completions`` the
``response_format`` of a chat.

The answers are built as ``ChatCompletionChunk`` / ``ChatCompletion`` / ``Completion``.
"""

from __future__ import annotations

from typing import Any

from openai.types import Completion, CompletionUsage
from openai.types import completion_create_params as text_params
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import completion_create_params as chat_params
from pydantic import BaseModel, ConfigDict, TypeAdapter, with_config

from tools.fakes._checks import check_typed

__all__ = [
    "chat_chunk",
    "chat_completion_body",
    "check_chat",
    "check_completion",
    "completion_body",
    "completion_chunk",
    "usage",
    "usage_chunk",
]

_FORBID = ConfigDict(extra="forbid")


@with_config(_FORBID)
class _ChatStreaming(chat_params.CompletionCreateParamsStreaming, total=False):
    top_k: int  # vLLM


@with_config(_FORBID)
class _ChatWhole(chat_params.CompletionCreateParamsNonStreaming, total=False):
    top_k: int  # vLLM


@with_config(_FORBID)
class _TextStreaming(text_params.CompletionCreateParamsStreaming, total=False):
    top_k: int  # vLLM
    response_format: chat_params.ResponseFormat  # vLLM


@with_config(_FORBID)
class _TextWhole(text_params.CompletionCreateParamsNonStreaming, total=False):
    top_k: int  # vLLM
    response_format: chat_params.ResponseFormat  # vLLM


_CHAT: dict[bool, TypeAdapter[Any]] = {
    True: TypeAdapter(_ChatStreaming),
    False: TypeAdapter(_ChatWhole),
}
_TEXT: dict[bool, TypeAdapter[Any]] = {
    True: TypeAdapter(_TextStreaming),
    False: TypeAdapter(_TextWhole),
}


def check_chat(body: dict[str, Any]) -> dict[str, Any]:
    return check_typed(_CHAT[body.get("stream") is True], body)


def check_completion(body: dict[str, Any]) -> dict[str, Any]:
    return check_typed(_TEXT[body.get("stream") is True], body)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return _built(
        CompletionUsage,
        {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    )


def _built(model: type[BaseModel], fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` as the SDK's ``model`` sees them, back as JSON: only the fields given, None
    ones included (the servers send those as null)."""
    return model.model_validate(fields).model_dump(mode="json", exclude_unset=True)


def chat_chunk(
    head: dict[str, Any], delta: dict[str, Any], reason: str | None, *, with_usage: bool
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of the answer (``usage: null`` when usage was asked)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    extra = {"usage": None} if with_usage else {}
    chunk = {**head, "object": "chat.completion.chunk", "choices": [choice], **extra}
    return _built(ChatCompletionChunk, chunk)


def usage_chunk(head: dict[str, Any], counted: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """The last chunk of a stream that asked for usage: no choices, the counts."""
    if chat:
        chunk = {**head, "object": "chat.completion.chunk", "choices": [], "usage": counted}
        return _built(ChatCompletionChunk, chunk)
    chunk = {**head, "object": "text_completion", "choices": [], "usage": counted}
    return _built(Completion, chunk)


def chat_completion_body(
    head: dict[str, Any], answer: str, reason: str, counted: dict[str, Any]
) -> dict[str, Any]:
    message = {"role": "assistant", "content": answer, "refusal": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
    body = {**head, "object": "chat.completion", "choices": [choice], "usage": counted}
    return _built(ChatCompletion, body)


def completion_chunk(
    head: dict[str, Any], text: str, reason: str | None, *, with_usage: bool
) -> dict[str, Any]:
    """One streamed ``text_completion``. The SDK's type demands a finish reason in every
    choice; the servers (OpenAI, vLLM) send null until the last chunk, and the SDK reads
    stream chunks without checking them. So the chunk is checked with a reason, sent as is."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason or "stop"}
    extra = {"usage": None} if with_usage else {}
    chunk = _built(Completion, {**head, "object": "text_completion", "choices": [choice], **extra})
    chunk["choices"][0]["finish_reason"] = reason
    return chunk


def completion_body(
    head: dict[str, Any], answer: str, reason: str, counted: dict[str, Any]
) -> dict[str, Any]:
    choice = {"index": 0, "text": answer, "logprobs": None, "finish_reason": reason}
    body = {**head, "object": "text_completion", "choices": [choice], "usage": counted}
    return _built(Completion, body)
