"""The OpenAI-compatible API: ``POST /v1/chat/completions`` and ``GET /v1/models``.

A thin translation over the native request path: the same API keys (Bearer), the same rate
limit bucket as ``POST /api/v1/request`` (one budget per key across both APIs), and the same
``Instance.start_task`` / ``open_task`` (placement on any instance's nodes, admission queue,
timeouts). Only the shapes differ: the messages become one prompt (``openai_prompt``), the
answer and the errors take OpenAI's shapes (``openai_schemas``, ``openai_errors``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, TypeVar

import msgspec
import trio
from quart import Blueprint, Quart, Response
from quart_schema import document_request, document_response, security_scheme

from coordinator.api.openai_errors import (
    install_openai_error_handlers,
    openai_error_body,
    status_and_code,
)
from coordinator.api.openai_prompt import build_prompt
from coordinator.api.openai_schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    ChunkDelta,
    CompletionChoice,
    ModelCard,
    ModelList,
    OpenAIErrorResponse,
    Usage,
)
from coordinator.api.responses import json_response
from coordinator.api.routes import authenticate, decode_body, instance, read_raw_body
from coordinator.api.schemas import NodeInfo
from coordinator.errors import GemmaNetError
from coordinator.runtime import instance_status
from coordinator.runtime.instance import Instance
from coordinator.runtime.task_handle import ChunkEvent, DoneEvent, TaskHandle

F = TypeVar("F", bound=Callable[..., Any])
_json = msgspec.json.Encoder()
_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]
COMPLETION_ID_PREFIX = "chatcmpl-"
STREAM_END = b"data: [DONE]\n\n"


def _openai_errors(*statuses: int) -> Callable[[F], F]:
    """Document OpenAIErrorResponse for each status, plus 500, like routes._errors."""

    def decorate(func: F) -> F:
        for status in (*statuses, 500):
            func = document_response(OpenAIErrorResponse, status)(func)
        return func

    return decorate


def completion_id(task_id: str) -> str:
    """``chatcmpl-<task id>``: the task id is what ``/api/v1/tasks/{task_id}/rating`` takes."""
    return COMPLETION_ID_PREFIX + task_id


def _task_headers(handle: TaskHandle) -> dict[str, str]:
    return {"X-GemmaNet-Task-Id": handle.task_id, "X-GemmaNet-Node-Id": handle.node_id}


def _sse(body: msgspec.Struct) -> bytes:
    return b"data: " + _json.encode(body) + b"\n\n"


def register_openai_routes(app: Quart) -> None:
    blueprint = Blueprint("openai", __name__, url_prefix="/v1")
    install_openai_error_handlers(blueprint)

    @blueprint.post("/chat/completions")
    @security_scheme(_BEARER)
    @document_request(ChatCompletionRequest)
    @document_response(ChatCompletion)
    @_openai_errors(400, 401, 404, 413, 422, 429, 502, 503, 504)
    async def chat_completions() -> Response:
        """OpenAI's chat completion, run as one task on a node serving the model.

        With `stream: true` the 200 is `text/event-stream`: `chat.completion.chunk` objects
        (the role, then the content deltas, then an empty delta with `finish_reason: "stop"`)
        and `data: [DONE]`; a failure after the stream began is one `{"error": {…}}` chunk in
        this route's error shape, and the stream ends without `[DONE]`.
        """
        data = await read_raw_body()
        api_key = await authenticate()
        inst = instance()
        await inst.check_rate_limit(api_key.key_id)
        body = decode_body(data, ChatCompletionRequest)
        prompt = build_prompt(body.messages)
        created = int(time.time())
        if body.stream:
            return await _stream(inst, api_key.key_id, body, prompt, created)
        async with inst.open_task(
            key_id=api_key.key_id,
            model=body.model,
            prompt=prompt,
            stream=False,
            timeout_s=body.timeout_s,
        ) as handle:
            done = await handle.result()
        choice = CompletionChoice(message=AssistantMessage(content=done.output))
        completion = ChatCompletion(
            id=completion_id(handle.task_id),
            created=created,
            model=body.model,
            choices=[choice],
            usage=Usage(),
        )
        return json_response(completion, headers=_task_headers(handle))

    @blueprint.get("/models")
    @security_scheme(_BEARER)
    @document_response(ModelList)
    @_openai_errors(401)
    async def models() -> Response:
        """Every model an online node serves, on any instance."""
        await authenticate()
        nodes = msgspec.convert(await instance_status.cluster_nodes(instance()), list[NodeInfo])
        first_seen: dict[str, int] = {}
        for node in nodes:
            connected = int(node.connected_at or 0)
            for model in node.models:
                first_seen[model] = min(first_seen.get(model, connected), connected)
        cards = [ModelCard(id=model, created=first_seen[model]) for model in sorted(first_seen)]
        return json_response(ModelList(data=cards))

    app.register_blueprint(blueprint)


async def _stream(
    inst: Instance, key_id: str, body: ChatCompletionRequest, prompt: str, created: int
) -> Response:
    """Like the native stream: the first event is awaited before answering 200, so a task that
    fails before producing anything gets its real status and error body."""
    handle = await inst.start_task(
        key_id=key_id, model=body.model, prompt=prompt, stream=True, timeout_s=body.timeout_s
    )
    try:
        first = await handle.next_event()
    except GemmaNetError as exc:
        await inst.end_task(handle, exc.code)
        raise
    except BaseException:
        await inst.end_task(handle, "client_gone")
        raise
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **_task_headers(handle)}
    chunks = _chunks(inst, handle, first, model=body.model, created=created)
    return Response(chunks, 200, headers, content_type="text/event-stream")


async def _chunks(
    inst: Instance,
    handle: TaskHandle,
    first: ChunkEvent | DoneEvent,
    *,
    model: str,
    created: int,
) -> AsyncIterator[bytes]:
    def chunk(delta: ChunkDelta, finish_reason: Literal["stop"] | None = None) -> bytes:
        choice = ChunkChoice(delta=delta, finish_reason=finish_reason)
        return _sse(
            ChatCompletionChunk(
                id=completion_id(handle.task_id), created=created, model=model, choices=[choice]
            )
        )

    outcome = "client_gone"
    try:
        yield chunk(ChunkDelta(role="assistant"))
        streamed = False
        event = first
        while isinstance(event, ChunkEvent):
            if event.delta:
                streamed = True
                yield chunk(ChunkDelta(content=event.delta))
            event = await handle.next_event()
        outcome = "ok"
    except GemmaNetError as exc:
        outcome = exc.code
        await inst.end_task(handle, outcome)
        status, code = status_and_code(exc)
        yield _sse(openai_error_body(status, code, exc.client_message))
        return
    finally:
        with trio.CancelScope(shield=True):
            await inst.end_task(handle, outcome)
    if not streamed and event.output:
        # A backend that answered in one piece: its output is the one content delta.
        yield chunk(ChunkDelta(content=event.output))
    yield chunk(ChunkDelta(), "stop")
    yield STREAM_END
