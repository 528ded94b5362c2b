"""HTTP routes. Each handler authenticates, decodes strictly, then asks the instance; every
JSON body it answers with is a Struct of ``schemas``, and each route documents every status it
can answer with (``_errors``), so /openapi.json describes what the API really returns."""

from __future__ import annotations

import html
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import msgspec
from quart import Quart, Response, current_app, request
from quart_schema import document_request, document_response, security_scheme

from coordinator import __version__
from coordinator.api.rate_charge import new_rate_charge
from coordinator.api.responses import json_response
from coordinator.api.schemas import (
    DeltaEvent,
    DoneEvent,
    ErrorResponse,
    HealthResponse,
    NodeInfo,
    NodesResponse,
    NodeTelemetryResponse,
    RatingRequest,
    RatingResponse,
    RootResponse,
    StatusResponse,
    StreamErrorDetail,
    StreamErrorEvent,
    TaskRequest,
    TaskResponse,
    TaskTimings,
    TokenUsage,
)
from coordinator.api.sse import DeltaFrames, sse
from coordinator.api.task_runs import (
    STREAM_HEADERS,
    TaskAsk,
    open_stream,
    run_whole,
    stream_events,
)
from coordinator.core.cluster_view import public_status
from coordinator.errors import GemmaNetError, InvalidFields, MalformedJson, Unauthorized
from coordinator.runtime import instance_status
from coordinator.runtime.instance import Instance
from coordinator.runtime.log_context import bind_log_ids, request_id_var
from coordinator.runtime.requests.task_handle import ChunkEvent, TaskHandle
from coordinator.runtime.requests.task_handle import DoneEvent as TaskDone
from coordinator.store import ApiKey

S = TypeVar("S", bound=msgspec.Struct)
F = TypeVar("F", bound=Callable[..., Any])
_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]


def _errors(*statuses: int) -> Callable[[F], F]:
    """Document ErrorResponse for each status, plus 500 (an unexpected error) for every route."""

    def decorate(func: F) -> F:
        for status in (*statuses, 500):
            func = document_response(ErrorResponse, status)(func)
        return func

    return decorate


def instance() -> Instance:
    inst: Instance = current_app.config["GEMMANET_INSTANCE"]
    return inst


async def authenticate() -> ApiKey:
    header = request.headers.get("Authorization", "").strip()
    if not header:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        # Whatever it holds is not echoed: it may be the key itself, without its scheme.
        raise Unauthorized(
            "the Authorization header must be 'Bearer <key>' (the word Bearer, a space, then "
            "the API key)"
        )
    api_key = await instance().store.authenticate_api_key(key.strip())
    if api_key is None:
        raise Unauthorized("unknown, revoked or expired API key")
    return api_key


async def read_raw_body() -> bytes:
    """The whole request body. Read before any early error answer: Hypercorn cannot reuse a
    keep-alive connection whose request body was left unread, and the client's next request
    on it would hang (a 413 is the exception; it closes the connection)."""
    data = await request.get_data(cache=False, as_text=False)
    return data if isinstance(data, bytes) else data.encode()


def decode_body(data: bytes, struct: type[S]) -> S:
    if not data:
        raise MalformedJson("request body is empty; expected a JSON object")
    try:
        return msgspec.json.decode(data, type=struct)
    except msgspec.ValidationError as exc:
        raise InvalidFields(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise MalformedJson(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        # msgspec gives up on nesting deeper than its recursion limit (about 1,000 levels),
        # even in a field it would ignore: the client's mistake, not an internal error.
        raise MalformedJson("request body is nested too deeply to be a request") from None


async def task_request(struct: type[S]) -> tuple[Instance, ApiKey, S]:
    """The opening of every route that runs a task, in its order: the whole body read (a
    keep-alive connection must not be left with an unread body), the key authenticated, its
    rate limit charged (one budget across every route), then the body decoded strictly.

    The charge is counted by the task's admission ask (``RateCharge``: the rate limit and the
    lease in one store round trip); a request refused before that counts it then, and is
    answered 429 first when over the limit (``rate_first``), as if counted on arrival."""
    data = await read_raw_body()
    inst = instance()
    # A draining instance refuses before any work (no key lookup, no rate limit spent): a
    # load balancer retries it elsewhere (docs/operations.md).
    refusal = inst.drain.refusal()
    if refusal is not None:
        raise refusal
    api_key = await authenticate()
    new_rate_charge(api_key.key_id)
    inst.admissions.note_key(api_key.key_id, api_key.name, api_key.priority)
    return inst, api_key, decode_body(data, struct)


def register_routes(app: Quart) -> None:
    @app.before_request
    async def bind_request_log_ids() -> None:
        # Every line logged while this request is handled carries its id (and its instance's).
        inst = current_app.config.get("GEMMANET_INSTANCE")
        bind_log_ids(
            request_id="r-" + secrets.token_hex(8),
            instance_id=inst.instance_id if inst is not None else None,
            task_id=None,
            node_id=None,
        )

    @app.after_request
    async def send_request_id(response: Response) -> Response:
        # The same id in the answer, so a client's report can be matched with the logs.
        request_id = request_id_var.get()
        if request_id is not None:
            response.headers["X-Request-Id"] = request_id
        return response

    @app.get("/")
    @document_response(RootResponse)
    @_errors()
    async def root() -> Response:
        """Where to start: the API's description, the docs, the System Health page, the
        health and status routes. A browser (Accept: text/html first) gets them as links."""
        body = RootResponse(
            service="GemmaNet coordinator",
            version=__version__,
            docs=ROOT_DOCS,
            links=dict(ROOT_LINKS),
        )
        best = request.accept_mimetypes.best_match(["application/json", "text/html"])
        if best == "text/html":
            return Response(
                _root_page(), 200, _ROOT_PAGE_HEADERS, content_type="text/html; charset=utf-8"
            )
        return json_response(body)

    @app.get("/healthz")
    @document_response(HealthResponse)
    @_errors()
    async def healthz() -> Response:
        """Liveness: 200 while the process serves (draining included)."""
        return json_response(HealthResponse(ok=True))

    @app.get("/readyz")
    @document_response(HealthResponse)
    @_errors(503)
    async def readyz() -> Response:
        """Readiness: 200 while this instance takes requests; 503 `instance_draining` from
        the moment it starts draining (SIGTERM), so a load balancer stops sending to it."""
        refusal = instance().drain.refusal()
        if refusal is not None:
            raise refusal
        return json_response(HealthResponse(ok=True))

    @app.get("/api/v1/status")
    @document_response(StatusResponse)
    @_errors()
    async def status() -> Response:
        """Nodes, instances, tasks in flight and queued across all live instances (no model
        names: this route needs no key)."""
        counts = await instance_status.cluster_status(instance())
        return json_response(msgspec.convert(public_status(counts, __version__), StatusResponse))

    @app.get("/api/v1/nodes")
    @security_scheme(_BEARER)
    @document_response(NodesResponse)
    @_errors(401, 503)
    async def nodes() -> Response:
        """Every online node, on any instance."""
        await authenticate()
        found = msgspec.convert(await instance_status.cluster_nodes(instance()), list[NodeInfo])
        return json_response(NodesResponse(nodes=found))

    @app.get("/api/v1/nodes/<node_id>/telemetry")
    @security_scheme(_BEARER)
    @document_response(NodeTelemetryResponse)
    @_errors(401, 404, 503)
    async def node_telemetry(node_id: str) -> Response:
        """The node's host telemetry history (oldest first); 404 `unknown_node` when the node
        is neither online nor has any."""
        await authenticate()
        samples = await instance_status.node_telemetry(instance(), node_id)
        return json_response(NodeTelemetryResponse(node_id=node_id, samples=samples))

    @app.post("/api/v1/request")
    @security_scheme(_BEARER)
    @document_request(TaskRequest)
    @document_response(TaskResponse)
    @_errors(400, 401, 413, 422, 429, 502, 503, 504)
    async def submit_request() -> Response:
        """Run one task on a node serving the model: on `prompt`, or on `messages` (a
        conversation), with sampling `options`.

        With `stream: true` the 200 is `text/event-stream` instead: `{"delta"}` events, then
        `{"done": true, "task_id", "node_id", "output", "usage", "finish_reason", "timings"}`,
        or an `{"error": {"code", "message", "status"}}` event when the task fails after the
        stream began.
        """
        inst, api_key, body = await task_request(TaskRequest)
        if (body.prompt is None) == (body.messages is None):
            raise InvalidFields("invalid request: give exactly one of 'prompt' and 'messages'")
        ask = TaskAsk(
            model=body.model,
            prompt=body.prompt,
            messages=body.messages,
            options=body.options,
            timeout_s=body.timeout_s,
        )
        if body.stream:
            handle, first = await open_stream(inst, api_key.key_id, ask)
            events = _events(inst, handle, first)
            return Response(events, 200, STREAM_HEADERS, content_type="text/event-stream")
        handle, done = await run_whole(inst, api_key.key_id, ask)
        return json_response(TaskResponse(**_answer(handle, done)))

    @app.post("/api/v1/tasks/<task_id>/rating")
    @security_scheme(_BEARER)
    @document_request(RatingRequest)
    @document_response(RatingResponse)
    @_errors(400, 401, 403, 404, 409, 413, 422, 503)
    async def rate(task_id: str) -> Response:
        """Rate a task once, with the key that requested it."""
        data = await read_raw_body()
        api_key = await authenticate()
        body = decode_body(data, RatingRequest)
        # The ids the OpenAI-compatible routes hand out rate their task too.
        task_id = task_id.removeprefix("chatcmpl-").removeprefix("cmpl-")
        # TaskNotFound (404), TaskForbidden (403) and AlreadyRated (409) answer for themselves.
        await instance().requests.rate(task_id, api_key.key_id, body.score)
        return json_response(RatingResponse(task_id=task_id, score=body.score))


ROOT_DOCS = (
    "GET /openapi.json describes every route; docs/interface.md in the GemmaNet source is the "
    "whole interface (commands, settings, the HTTP API, the node protocol)"
)
ROOT_LINKS = (
    ("openapi", "/openapi.json"),
    ("system_health", "/system-health"),
    ("healthz", "/healthz"),
    ("readyz", "/readyz"),
    ("status", "/api/v1/status"),
)
_ROOT_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


def _root_page() -> str:
    items = "".join(f'<li><a href="{path}">{path}</a> ({name})</li>' for name, path in ROOT_LINKS)
    return (
        "<!doctype html><html lang=en><meta charset=utf-8><title>GemmaNet coordinator</title>"
        f"<h1>GemmaNet coordinator {html.escape(__version__)}</h1><ul>{items}</ul>"
        f"<p>{html.escape(ROOT_DOCS)}</p></html>"
    )


def _answer(handle: TaskHandle, done: TaskDone) -> dict[str, Any]:
    """What the answer and the stream's done event say of the finished task."""
    return {
        "task_id": handle.task_id,
        "node_id": handle.node_id,
        "output": done.output,
        "usage": TokenUsage.of(done.usage),
        "finish_reason": done.finish_reason,
        "timings": TaskTimings.of(done.timings),
    }


async def _events(
    inst: Instance, handle: TaskHandle, first: ChunkEvent | TaskDone
) -> AsyncIterator[bytes]:
    delta = DeltaFrames(_delta_event)
    async for event in stream_events(inst, handle, first, whole_as_chunk=False):
        if isinstance(event, ChunkEvent):
            yield delta(event.delta)
        elif isinstance(event, GemmaNetError):
            detail = StreamErrorDetail(
                code=event.code, message=event.client_message, status=event.status
            )
            yield sse(StreamErrorEvent(error=detail))
        else:
            # The task is recorded (queued for the next batch write) before this event.
            yield sse(DoneEvent(**_answer(handle, event)))


def _delta_event(text: str) -> DeltaEvent:
    return DeltaEvent(delta=text)
