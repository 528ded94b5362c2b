"""Streamed answers of the OpenAI-compatible routes: server-sent events in OpenAI's chunk
formats (``chat.completion.chunk``, ``text_completion``), ending in ``data: [DONE]``.

Like the native stream (``task_runs``), the first event is awaited before answering 200, so a
task that fails before producing anything gets its real status and error body; a failure after
that is one ``{"error": {…}}`` chunk and the stream ends without ``[DONE]``. With
``stream_options.include_usage`` every chunk carries ``"usage": null`` and one last chunk with
no choices carries the usage (OpenAI's convention).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import msgspec
from quart import Response

from coordinator.api.openai.errors import openai_error_body, param_of, status_and_code
from coordinator.api.openai.schemas import (
    ChatCompletionChunk,
    ChunkChoice,
    ChunkDelta,
    TextChoice,
    TextCompletion,
    Usage,
)
from coordinator.api.sse import DeltaFrames, sse
from coordinator.api.task_runs import (
    STREAM_HEADERS,
    TaskAsk,
    open_stream,
    stream_events,
    task_headers,
)
from coordinator.errors import GemmaNetError
from coordinator.runtime.instance import Instance
from coordinator.runtime.requests.task_handle import ChunkEvent, DoneEvent, TaskHandle
from protocol import FinishReason
from protocol import Usage as TaskUsage

__all__ = [
    "CHAT_ID_PREFIX",
    "TEXT_ID_PREFIX",
    "ChatChunks",
    "TextChunks",
    "stream_task",
    "usage_of",
]

CHAT_ID_PREFIX = "chatcmpl-"
TEXT_ID_PREFIX = "cmpl-"
STREAM_END = b"data: [DONE]\n\n"


def usage_of(usage: TaskUsage | None) -> Usage | None:
    if usage is None:
        return None
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
    )


class Chunks(Protocol):
    """One route's chunk format."""

    def first(self, task_id: str) -> bytes | None: ...
    def deltas(self, task_id: str) -> DeltaFrames: ...
    def last(self, task_id: str, finish_reason: FinishReason) -> bytes: ...
    def usage(self, task_id: str, usage: Usage | None) -> bytes | None: ...


class ChatChunks:
    def __init__(self, model: str, created: int, include_usage: bool) -> None:
        self.model, self.created, self.include_usage = model, created, include_usage

    def _chunk(self, task_id: str, choices: list[ChunkChoice], usage: Usage | None) -> bytes:
        return sse(self._struct(task_id, choices, usage))

    def _struct(
        self, task_id: str, choices: list[ChunkChoice], usage: Usage | None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=CHAT_ID_PREFIX + task_id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage if self.include_usage else msgspec.UNSET,
        )

    def first(self, task_id: str) -> bytes | None:
        return self._chunk(task_id, [ChunkChoice(delta=ChunkDelta(role="assistant"))], None)

    def deltas(self, task_id: str) -> DeltaFrames:
        return DeltaFrames(
            lambda text: self._struct(task_id, [ChunkChoice(delta=ChunkDelta(content=text))], None)
        )

    def last(self, task_id: str, finish_reason: FinishReason) -> bytes:
        choice = ChunkChoice(delta=ChunkDelta(), finish_reason=finish_reason)
        return self._chunk(task_id, [choice], None)

    def usage(self, task_id: str, usage: Usage | None) -> bytes | None:
        return self._chunk(task_id, [], usage) if self.include_usage else None


class TextChunks:
    def __init__(self, model: str, created: int, include_usage: bool) -> None:
        self.model, self.created, self.include_usage = model, created, include_usage

    def _chunk(self, task_id: str, choices: list[TextChoice], usage: Usage | None) -> bytes:
        return sse(self._struct(task_id, choices, usage))

    def _struct(
        self, task_id: str, choices: list[TextChoice], usage: Usage | None
    ) -> TextCompletion:
        return TextCompletion(
            id=TEXT_ID_PREFIX + task_id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage if self.include_usage else msgspec.UNSET,
        )

    def first(self, task_id: str) -> bytes | None:
        return None

    def deltas(self, task_id: str) -> DeltaFrames:
        return DeltaFrames(lambda text: self._struct(task_id, [TextChoice(text=text)], None))

    def last(self, task_id: str, finish_reason: FinishReason) -> bytes:
        return self._chunk(task_id, [TextChoice(text="", finish_reason=finish_reason)], None)

    def usage(self, task_id: str, usage: Usage | None) -> bytes | None:
        return self._chunk(task_id, [], usage) if self.include_usage else None


async def stream_task(inst: Instance, key_id: str, ask: TaskAsk, chunks: Chunks) -> Response:
    handle, first = await open_stream(inst, key_id, ask)
    headers = {**STREAM_HEADERS, **task_headers(handle)}
    events = _events(inst, handle, first, chunks)
    return Response(events, 200, headers, content_type="text/event-stream")


async def _events(
    inst: Instance, handle: TaskHandle, first: ChunkEvent | DoneEvent, chunks: Chunks
) -> AsyncIterator[bytes]:
    task_id = handle.task_id
    opening = chunks.first(task_id)
    if opening is not None:
        yield opening
    delta = chunks.deltas(task_id)
    async for event in stream_events(inst, handle, first):
        if isinstance(event, ChunkEvent):
            if event.delta:
                yield delta(event.delta)
        elif isinstance(event, GemmaNetError):
            status, code = status_and_code(event)
            yield sse(openai_error_body(status, code, event.client_message, param_of(event)))
            return
        else:
            yield chunks.last(task_id, event.finish_reason or "stop")
            closing = chunks.usage(task_id, usage_of(event.usage))
            if closing is not None:
                yield closing
            yield STREAM_END
