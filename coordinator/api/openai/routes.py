"""The OpenAI-compatible API: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models`` and ``GET /v1/models/{id}``.

A thin translation over the native request path: the same API keys (Bearer), the same rate
limit bucket as ``POST /api/v1/request`` (one budget per key across the APIs), and the same
task path (``task_runs``: placement on any instance's nodes, admission queue,
timeouts). The messages and parameters pass through to the node as a conversation and options
(``openai_params``); the answer, its usage and the errors take OpenAI's shapes
(``openai_schemas``, ``openai_errors``); the streams are ``openai_streams``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from quart import Blueprint, Quart, Response
from quart_schema import document_request, document_response, security_scheme

from coordinator.api.openai.errors import install_openai_error_handlers
from coordinator.api.openai.params import chat_messages, completion_prompt, options_of
from coordinator.api.openai.schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    OpenAIErrorResponse,
    TextChoice,
    TextCompletion,
)
from coordinator.api.openai.streams import (
    CHAT_ID_PREFIX,
    TEXT_ID_PREFIX,
    ChatChunks,
    TextChunks,
    stream_task,
    usage_of,
)
from coordinator.api.responses import json_response
from coordinator.api.routes import authenticate, instance, task_request
from coordinator.api.schemas import NodeInfo
from coordinator.api.task_runs import TaskAsk, run_whole, task_headers
from coordinator.errors import NoNodeForModel
from coordinator.runtime import instance_status

F = TypeVar("F", bound=Callable[..., Any])
_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]


def _openai_errors(*statuses: int) -> Callable[[F], F]:
    """Document OpenAIErrorResponse for each status, plus 500, like routes._errors."""

    def decorate(func: F) -> F:
        for status in (*statuses, 500):
            func = document_response(OpenAIErrorResponse, status)(func)
        return func

    return decorate


def completion_id(task_id: str) -> str:
    """``chatcmpl-<task id>``: ``/api/v1/tasks/{id}/rating`` takes it (or the bare task id)."""
    return CHAT_ID_PREFIX + task_id


async def _served_models() -> list[ModelCard]:
    nodes = msgspec.convert(await instance_status.cluster_nodes(instance()), list[NodeInfo])
    first_seen: dict[str, int] = {}
    for node in nodes:
        connected = int(node.connected_at or 0)
        for model in node.models:
            first_seen[model] = min(first_seen.get(model, connected), connected)
    return [ModelCard(id=model, created=first_seen[model]) for model in sorted(first_seen)]


def register_openai_routes(app: Quart) -> None:
    blueprint = Blueprint("openai", __name__, url_prefix="/v1")
    install_openai_error_handlers(blueprint)

    @blueprint.post("/chat/completions")
    @security_scheme(_BEARER)
    @document_request(ChatCompletionRequest)
    @document_response(ChatCompletion)
    @_openai_errors(400, 401, 404, 413, 422, 429, 502, 503, 504)
    async def chat_completions() -> Response:
        """OpenAI's chat completion, run as one task on a node serving the model: the
        messages and sampling parameters reach the node's model server as they are.

        With `stream: true` the 200 is `text/event-stream`: `chat.completion.chunk` objects
        (the role, then the content deltas, then an empty delta with the `finish_reason`),
        with `stream_options.include_usage` a last chunk with no choices and the `usage`,
        then `data: [DONE]`; a failure after the stream began is one `{"error": {…}}` chunk
        in this route's error shape, and the stream ends without `[DONE]`.
        """
        inst, api_key, body = await task_request(ChatCompletionRequest)
        options = options_of(body)
        messages = chat_messages(body.messages)
        created = int(time.time())
        ask = TaskAsk(
            model=body.model, messages=messages, options=options, timeout_s=body.timeout_s
        )
        if body.stream:
            chunks = ChatChunks(body.model, created, body.include_usage)
            return await stream_task(inst, api_key.key_id, ask, chunks)
        handle, done = await run_whole(inst, api_key.key_id, ask)
        choice = CompletionChoice(
            message=AssistantMessage(content=done.output),
            finish_reason=done.finish_reason or "stop",
        )
        completion = ChatCompletion(
            id=completion_id(handle.task_id),
            created=created,
            model=body.model,
            choices=[choice],
            usage=usage_of(done.usage),
        )
        return json_response(completion, headers=task_headers(handle))

    @blueprint.post("/completions")
    @security_scheme(_BEARER)
    @document_request(CompletionRequest)
    @document_response(TextCompletion)
    @_openai_errors(400, 401, 404, 413, 422, 429, 502, 503, 504)
    async def completions() -> Response:
        """OpenAI's (legacy) text completion: the raw `prompt` reaches the node's model server
        without a chat template (Ollama's `/api/generate`, a server's `/v1/completions`).

        With `stream: true` the 200 is `text/event-stream`: `text_completion` objects with the
        text deltas, then one with the `finish_reason`, with `stream_options.include_usage` a
        last one with no choices and the `usage`, then `data: [DONE]`.
        """
        inst, api_key, body = await task_request(CompletionRequest)
        options = options_of(body)
        prompt = completion_prompt(body)
        created = int(time.time())
        ask = TaskAsk(model=body.model, prompt=prompt, options=options, timeout_s=body.timeout_s)
        if body.stream:
            chunks = TextChunks(body.model, created, body.include_usage)
            return await stream_task(inst, api_key.key_id, ask, chunks)
        handle, done = await run_whole(inst, api_key.key_id, ask)
        completion = TextCompletion(
            id=TEXT_ID_PREFIX + handle.task_id,
            created=created,
            model=body.model,
            choices=[TextChoice(text=done.output, finish_reason=done.finish_reason or "stop")],
            usage=usage_of(done.usage),
        )
        return json_response(completion, headers=task_headers(handle))

    @blueprint.get("/models")
    @security_scheme(_BEARER)
    @document_response(ModelList)
    @_openai_errors(401)
    async def models() -> Response:
        """Every model an online node serves, on any instance."""
        await authenticate()
        return json_response(ModelList(data=await _served_models()))

    @blueprint.get("/models/<path:model_id>")
    @security_scheme(_BEARER)
    @document_response(ModelCard)
    @_openai_errors(401, 404)
    async def model(model_id: str) -> Response:
        """One model, if an online node serves it (on any instance); 404 `model_not_found`
        otherwise. Model names may hold `/` and `:` (`org/model`, `gemma3:4b`)."""
        await authenticate()
        for card in await _served_models():
            if card.id == model_id:
                return json_response(card)
        raise NoNodeForModel(f"no online node serves model {model_id!r}")

    app.register_blueprint(blueprint)
