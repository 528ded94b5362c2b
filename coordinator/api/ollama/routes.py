"""The Ollama-compatible API: ``POST /api/chat``, ``POST /api/generate``, ``GET /api/tags``,
``GET /api/ps`` and ``GET /api/version``, so Ollama clients (the ``ollama`` library, Open WebUI,
LangChain's ChatOllama) use the whole network as one Ollama server (docs/ollama-api.md).

A thin translation over the native request path, like the OpenAI-compatible routes: the same
API keys (Bearer), the same rate limit bucket per key, the same task path (``task_runs``:
placement on any instance's nodes, admission queue, leases, timeouts). Requests
become a conversation and options (``ollama_schemas``); answers are Ollama's NDJSON records;
errors are ``{"error": …}`` (``ollama_errors``).

These routes are left out of /openapi.json (``hide``): Ollama's API is specified by Ollama, and
the document there describes GemmaNet's own shapes; tests/e2e/test_ollama_api.py checks these
answers against the ollama library's own response models instead.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import msgspec
from quart import Blueprint, Quart, Response
from quart_schema import hide

from coordinator import __version__
from coordinator.api.ollama.errors import error_line, install_ollama_error_handlers
from coordinator.api.ollama.schemas import (
    AssistantMessage,
    ChatRecord,
    ChatRequest,
    GenerateRecord,
    GenerateRequest,
    PsResponse,
    RunningModel,
    TagModel,
    TagsResponse,
    VersionResponse,
    chat_messages,
    generate_input,
    is_load_request,
    request_options,
)
from coordinator.api.responses import json_response
from coordinator.api.routes import authenticate, instance, task_request
from coordinator.api.schemas import NodeInfo
from coordinator.api.task_runs import (
    STREAM_HEADERS,
    TaskAsk,
    open_stream,
    run_whole,
    stream_events,
    task_headers,
)
from coordinator.errors import GemmaNetError, NoNodeForModel
from coordinator.runtime import instance_status
from coordinator.runtime.instance import Instance
from coordinator.runtime.requests.task_handle import ChunkEvent, DoneEvent, TaskHandle
from protocol import Message, Options

__all__ = ["register_ollama_routes"]

NDJSON = "application/x-ndjson"
_json = msgspec.json.Encoder()


def _timestamp(seconds: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama writes ``created_at`` and ``modified_at``."""
    moment = datetime.now(UTC) if seconds is None else datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


class _Records:
    """The records of one answer: chat's carry a ``message``, generate's a ``response``."""

    def __init__(self, *, chat: bool, model: str, began: float) -> None:
        self.chat, self.model, self.began = chat, model, began

    def record(self, text: str, *, done: bool = False, **stats: Any) -> ChatRecord | GenerateRecord:
        common: dict[str, Any] = {"model": self.model, "created_at": _timestamp(), "done": done}
        if self.chat:
            return ChatRecord(message=AssistantMessage(content=text), **common, **stats)
        return GenerateRecord(response=text, **common, **stats)

    def final(self, text: str, result: DoneEvent) -> ChatRecord | GenerateRecord:
        """The done record: what the node reported of the task, each number left out when
        the node did not report what it is made of (a protocol v1 node)."""
        stats: dict[str, Any] = {
            "total_duration": _ns(time.monotonic() - self.began),
            "load_duration": 0,
        }
        if result.finish_reason is not None:
            stats["done_reason"] = result.finish_reason
        if result.usage is not None:
            stats["prompt_eval_count"] = result.usage.prompt_tokens
            stats["eval_count"] = result.usage.completion_tokens
        if result.timings is not None:
            # Without any output the whole time went into reading the prompt.
            first = result.timings.ttft_s
            first = result.timings.total_s if first is None else first
            stats["prompt_eval_duration"] = _ns(first)
            stats["eval_duration"] = _ns(result.timings.total_s - first)
        return self.record(text, done=True, **stats)

    def line(self, record: msgspec.Struct) -> bytes:
        return _json.encode(record) + b"\n"


async def _online_nodes(*, usable_only: bool = False) -> list[NodeInfo]:
    nodes = msgspec.convert(await instance_status.cluster_nodes(instance()), list[NodeInfo])
    if usable_only:
        # A direct host placement may not use now (unreachable, stale facts) serves nothing.
        nodes = [n for n in nodes if n.kind == "agent" or n.host_state == "ok"]
    return nodes


def _models_of(nodes: list[NodeInfo]) -> dict[str, float]:
    """Each model served, with when its earliest node still online connected (0: unknown)."""
    first: dict[str, float] = {}
    for node in nodes:
        for model in node.models:
            seen = first.get(model)
            if node.connected_at and (not seen or node.connected_at < seen):
                first[model] = node.connected_at
            else:
                first.setdefault(model, 0.0)
    return dict(sorted(first.items()))


def _digest(model: str) -> str:
    return "sha256:" + hashlib.sha256(model.encode()).hexdigest()


async def _answer(
    inst: Instance,
    key_id: str,
    body: ChatRequest | GenerateRequest,
    records: _Records,
    *,
    prompt: str | None = None,
    messages: list[Message] | None = None,
    options: Options,
) -> Response:
    if is_load_request(body):
        # Ollama's "load the model": nothing to generate; a node that serves it is loaded.
        if body.model not in _models_of(await _online_nodes(usable_only=True)):
            raise NoNodeForModel(f"no online node serves model {body.model!r}")
        return json_response(records.record("", done=True, done_reason="load"))
    ask = TaskAsk(
        model=body.model,
        prompt=prompt,
        messages=messages,
        options=options,
        timeout_s=body.timeout_s,
    )
    if body.stream:
        handle, first = await open_stream(inst, key_id, ask)
        headers = {**STREAM_HEADERS, **task_headers(handle)}
        lines = _lines(inst, handle, first, records)
        return Response(lines, 200, headers, content_type=NDJSON)
    handle, done = await run_whole(inst, key_id, ask)
    return json_response(records.final(done.output, done), headers=task_headers(handle))


async def _lines(
    inst: Instance, handle: TaskHandle, first: ChunkEvent | DoneEvent, records: _Records
) -> AsyncIterator[bytes]:
    async for event in stream_events(inst, handle, first):
        if isinstance(event, ChunkEvent):
            if event.delta:
                yield records.line(records.record(event.delta))
        elif isinstance(event, GemmaNetError):
            yield error_line(event)
        else:
            yield records.line(records.final("", event))


def register_ollama_routes(app: Quart) -> None:
    blueprint = Blueprint("ollama", __name__, url_prefix="/api")
    install_ollama_error_handlers(blueprint)

    @blueprint.post("/chat")
    @hide
    async def chat() -> Response:
        """Ollama's chat: the messages and options reach the node's model server as a
        conversation. Streams NDJSON unless `"stream": false`."""
        began = time.monotonic()
        inst, api_key, body = await task_request(ChatRequest)
        options = request_options(body)
        messages = chat_messages(body.messages)
        records = _Records(chat=True, model=body.model, began=began)
        return await _answer(
            inst, api_key.key_id, body, records, messages=messages, options=options
        )

    @blueprint.post("/generate")
    @hide
    async def generate() -> Response:
        """Ollama's generate: the prompt (after the `system` message, if any) goes through
        the model's chat template, or as it is with `"raw": true`."""
        began = time.monotonic()
        inst, api_key, body = await task_request(GenerateRequest)
        options = request_options(body)
        prompt, messages = generate_input(body)
        records = _Records(chat=False, model=body.model, began=began)
        return await _answer(
            inst, api_key.key_id, body, records, prompt=prompt, messages=messages, options=options
        )

    @blueprint.get("/tags")
    @hide
    async def tags() -> Response:
        """Every model an online node serves, on any instance."""
        await authenticate()
        models = [
            TagModel(name=m, model=m, modified_at=_timestamp(seen), digest=_digest(m))
            for m, seen in _models_of(await _online_nodes()).items()
        ]
        return json_response(TagsResponse(models=models))

    @blueprint.get("/ps")
    @hide
    async def ps() -> Response:
        """The models placement can use now (on a connected node, or a direct host in a usable
        state). Sizes are 0: nodes do not report what their weights take."""
        await authenticate()
        models = [
            RunningModel(name=m, model=m, digest=_digest(m))
            for m in _models_of(await _online_nodes(usable_only=True))
        ]
        return json_response(PsResponse(models=models))

    @blueprint.get("/version")
    @hide
    async def version() -> Response:
        """The coordinator's version, without a key (as Ollama's: clients probe it)."""
        return json_response(VersionResponse(version=__version__))

    app.register_blueprint(blueprint)
