"""One task as every API route runs it, whatever the shape of its answer: the native,
OpenAI-compatible and Ollama-compatible routes differ only in how they write the events.

* ``run_whole``: the task to its end; its final event (output, usage, finish reason).
* ``open_stream`` + ``stream_events``: a streamed task. The first event is awaited before the
  route answers 200, so a task that fails before producing anything gets its real status and
  error body; after that the events come as they arrive, and a failure is the last of them.
  The task is ended in every case (the client leaving included), and recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio

from coordinator.api.rate_charge import rate_charge
from coordinator.errors import GemmaNetError
from coordinator.runtime.instance import Instance
from coordinator.runtime.requests.task_handle import ChunkEvent, DoneEvent, TaskHandle
from protocol import Message, Options

__all__ = [
    "STREAM_HEADERS",
    "TaskAsk",
    "open_stream",
    "run_whole",
    "stream_events",
    "task_headers",
]

#: headers of every streamed answer: no cache, no proxy buffering between the chunks
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True, slots=True)
class TaskAsk:
    """What a route asks a node to do: a prompt or messages (exactly one), options, a bound."""

    model: str
    prompt: str | None = None
    messages: list[Message] | None = None
    options: Options | None = None
    timeout_s: float | None = None


def task_headers(handle: TaskHandle) -> dict[str, str]:
    return {"X-GemmaNet-Task-Id": handle.task_id, "X-GemmaNet-Node-Id": handle.node_id}


async def _start(inst: Instance, key_id: str, ask: TaskAsk, *, stream: bool) -> TaskHandle:
    return await inst.requests.start(
        key_id=key_id,
        model=ask.model,
        prompt=ask.prompt,
        messages=ask.messages,
        options=ask.options,
        stream=stream,
        timeout_s=ask.timeout_s,
        rate=rate_charge(),
    )


async def run_whole(inst: Instance, key_id: str, ask: TaskAsk) -> tuple[TaskHandle, DoneEvent]:
    async with inst.requests.open(
        key_id=key_id,
        model=ask.model,
        prompt=ask.prompt,
        messages=ask.messages,
        options=ask.options,
        stream=False,
        timeout_s=ask.timeout_s,
        rate=rate_charge(),
    ) as handle:
        done = await handle.result()
    return handle, done


async def open_stream(
    inst: Instance, key_id: str, ask: TaskAsk
) -> tuple[TaskHandle, ChunkEvent | DoneEvent]:
    """Start a streamed task and wait for its first event; a failure until then ends the task
    and is raised (the route answers it with its own status)."""
    handle = await _start(inst, key_id, ask, stream=True)
    try:
        first = await handle.next_event()
    except GemmaNetError as exc:
        await inst.requests.end(handle, exc.code)
        raise
    except BaseException:
        await inst.requests.end(handle, "client_gone")
        raise
    return handle, first


async def stream_events(
    inst: Instance,
    handle: TaskHandle,
    first: ChunkEvent | DoneEvent,
    *,
    whole_as_chunk: bool = True,
) -> AsyncIterator[ChunkEvent | DoneEvent | GemmaNetError]:
    """The task's chunks, then its final event, or the error that ended it (the task is
    ended, and recorded, before the last event is given). With ``whole_as_chunk`` a backend
    that answered in one piece (no chunk with text) gives its output as one chunk too."""
    outcome = "client_gone"
    try:
        streamed = False
        event = first
        while isinstance(event, ChunkEvent):
            streamed = streamed or bool(event.delta)
            yield event
            event = await handle.next_event()
        outcome = "ok"
    except GemmaNetError as exc:
        outcome = exc.code
        await inst.requests.end(handle, outcome)
        yield exc
        return
    finally:
        with trio.CancelScope(shield=True):
            await inst.requests.end(handle, outcome)
    if whole_as_chunk and not streamed and event.output:
        yield ChunkEvent(event.output)
    yield event
