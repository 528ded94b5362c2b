"""HTTP routes. Each handler authenticates, decodes strictly, then asks the instance."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

import msgspec
import trio
from quart import Quart, current_app, request
from quart_schema import document_request, document_response, security_scheme

from coordinator import __version__
from coordinator.api.schemas import (
    ErrorResponse,
    NodesResponse,
    RatingRequest,
    RatingResponse,
    StatusResponse,
    TaskRequest,
    TaskResponse,
)
from coordinator.errors import (
    Conflict,
    Forbidden,
    GemmaNetError,
    InvalidFields,
    MalformedJson,
    NotFound,
    Unauthorized,
)
from coordinator.runtime.instance import Instance
from coordinator.runtime.task_handle import ChunkEvent, DoneEvent, TaskHandle
from coordinator.store import AlreadyRated, ApiKey, TaskForbidden, TaskNotFound

S = TypeVar("S", bound=msgspec.Struct)
_json = msgspec.json.Encoder()
_BEARER = [{"bearer": []}]


def instance() -> Instance:
    return current_app.config["GEMMANET_INSTANCE"]  # type: ignore[no-any-return]


async def authenticate() -> ApiKey:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    api_key = await instance().store.authenticate_api_key(key.strip())
    if api_key is None:
        raise Unauthorized("unknown API key")
    return api_key


async def read_raw_body() -> bytes:
    """The whole request body. Read before any early error answer: Hypercorn cannot reuse a
    keep-alive connection whose request body was left unread, and the client's next request
    on it would hang (a 413 is the exception; it closes the connection)."""
    return await request.get_data(cache=False, as_text=False)


def decode_body(data: bytes, struct: type[S]) -> S:
    if not data:
        raise MalformedJson("request body is empty; expected a JSON object")
    try:
        return msgspec.json.decode(data, type=struct)
    except msgspec.ValidationError as exc:
        raise InvalidFields(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise MalformedJson(f"request body is not valid JSON: {exc}") from None


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + _json.encode(payload) + b"\n\n"


def register_routes(app: Quart) -> None:
    @app.get("/healthz")
    async def healthz() -> Any:
        return {"ok": True}

    @app.get("/api/v1/status")
    @document_response(StatusResponse)
    async def status() -> Any:
        counts = await instance().cluster_status()
        return {**counts, "version": __version__}

    @app.get("/api/v1/nodes")
    @security_scheme(_BEARER)
    @document_response(NodesResponse)
    @document_response(ErrorResponse, 401)
    async def nodes() -> Any:
        await authenticate()
        return {"nodes": await instance().cluster_nodes()}

    @app.post("/api/v1/request")
    @security_scheme(_BEARER)
    @document_request(TaskRequest)
    @document_response(TaskResponse)
    @document_response(ErrorResponse, 502)
    @document_response(ErrorResponse, 503)
    @document_response(ErrorResponse, 504)
    async def submit_request() -> Any:
        data = await read_raw_body()
        api_key = await authenticate()
        inst = instance()
        await inst.check_rate_limit(api_key.key_id)
        body = decode_body(data, TaskRequest)
        if body.stream:
            return await _stream(inst, api_key, body)
        async with inst.open_task(
            key_id=api_key.key_id,
            model=body.model,
            prompt=body.prompt,
            stream=False,
            timeout_s=body.timeout_s,
        ) as handle:
            output = await handle.result()
        return {"task_id": handle.task_id, "node_id": handle.node_id, "output": output}

    @app.post("/api/v1/tasks/<task_id>/rating")
    @security_scheme(_BEARER)
    @document_request(RatingRequest)
    @document_response(RatingResponse)
    @document_response(ErrorResponse, 404)
    @document_response(ErrorResponse, 409)
    async def rate(task_id: str) -> Any:
        data = await read_raw_body()
        api_key = await authenticate()
        body = decode_body(data, RatingRequest)
        try:
            await instance().rate_task(task_id, api_key.key_id, body.score)
        except TaskNotFound:
            raise NotFound(f"no task {task_id!r}", code="task_not_found") from None
        except TaskForbidden:
            raise Forbidden(f"task {task_id!r} was requested with another API key") from None
        except AlreadyRated:
            raise Conflict(f"task {task_id!r} is already rated", code="already_rated") from None
        return {"task_id": task_id, "score": body.score}


async def _stream(inst: Instance, api_key: ApiKey, body: TaskRequest) -> Any:
    """Server-sent events. The first event is awaited before answering 200, so a task that
    fails before producing anything still gets its proper status (502/503/504)."""
    handle = await inst.start_task(
        key_id=api_key.key_id,
        model=body.model,
        prompt=body.prompt,
        stream=True,
        timeout_s=body.timeout_s,
    )
    try:
        first = await handle.next_event()
    except GemmaNetError as exc:
        await inst.end_task(handle, exc.code)
        raise
    except BaseException:
        await inst.end_task(handle, "client_gone")
        raise
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return _events(inst, handle, first), 200, {"Content-Type": "text/event-stream", **headers}


async def _events(
    inst: Instance, handle: TaskHandle, first: ChunkEvent | DoneEvent
) -> AsyncIterator[bytes]:
    outcome = "client_gone"
    try:
        event = first
        while isinstance(event, ChunkEvent):
            yield _sse({"delta": event.delta})
            event = await handle.next_event()
        outcome = "ok"
    except GemmaNetError as exc:
        outcome = exc.code
        await inst.end_task(handle, outcome)
        yield _sse({"error": {"code": exc.code, "message": exc.message, "status": exc.status}})
        return
    finally:
        with trio.CancelScope(shield=True):
            await inst.end_task(handle, outcome)
    # The task is recorded (queued for the next batch write) before the final event.
    yield _sse(
        {"done": True, "task_id": handle.task_id, "node_id": handle.node_id, "output": event.output}
    )
