"""What the fake Ollama accepts and answers, in the ``ollama`` library's own types (0.6.3).

The requests are the library's ``ChatRequest`` / ``GenerateRequest`` with its ``Options`` and
``Message``, made strict: no key they do not name (the library's models ignore unknown keys,
and so does the Ollama server, silently: a misspelt option is just lost), and ``options`` /
``messages`` as those models (the library also takes any mapping there). A message's role is
one of those Ollama documents: ``system``, ``user``, ``assistant``, ``tool``.

The answers are built as ``ChatResponse`` / ``GenerateResponse`` records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ollama import ChatResponse, GenerateResponse
from ollama import Message as OllamaMessage
from ollama._types import ChatRequest, GenerateRequest
from ollama._types import Options as OllamaOptions
from pydantic import ConfigDict

from tools.fakes._checks import check_model

__all__ = [
    "StrictChat",
    "StrictGenerate",
    "chat_record",
    "check_chat",
    "check_generate",
    "generate_record",
]

_FORBID = ConfigDict(extra="forbid")


class StrictOptions(OllamaOptions):
    model_config = _FORBID


class StrictMessage(OllamaMessage):
    model_config = _FORBID
    role: Literal["system", "user", "assistant", "tool"]


class StrictChat(ChatRequest):
    model_config = _FORBID
    options: StrictOptions | None = None
    messages: Sequence[StrictMessage] | None = None


class StrictGenerate(GenerateRequest):
    model_config = _FORBID
    options: StrictOptions | None = None


def check_chat(body: object) -> StrictChat:
    return check_model(StrictChat, body)


def check_generate(body: object) -> StrictGenerate:
    return check_model(StrictGenerate, body)


def chat_record(
    model: str, created_at: str, content: str, *, done: bool, **stats: Any
) -> dict[str, Any]:
    """One ``/api/chat`` record: a piece of the answer, or (``done``) the last, with stats."""
    message = OllamaMessage(role="assistant", content=content)
    response = ChatResponse(model=model, created_at=created_at, message=message, done=done, **stats)
    record: dict[str, Any] = response.model_dump(exclude_none=True)
    return record


def generate_record(
    model: str, created_at: str, response: str, *, done: bool, **stats: Any
) -> dict[str, Any]:
    """One ``/api/generate`` record: a piece of the answer, or (``done``) the last."""
    record = GenerateResponse(
        model=model, created_at=created_at, response=response, done=done, **stats
    )
    dumped: dict[str, Any] = record.model_dump(exclude_none=True)
    return dumped
