"""Request and response bodies. Requests are decoded strictly with msgspec; every JSON body the
API sends is one of these Structs, and the same Structs document the API in /openapi.json (so
the document describes what the routes really return; tests/e2e/test_openapi.py checks it).

Response Structs forbid unknown fields: their JSON schema says ``additionalProperties: false``,
and a dict from the runtime with a field the schema does not list fails loudly when converted
instead of leaving the document behind.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from protocol import FinishReason, Options, Timings, Usage
from protocol.constraints import MAX_MODEL_NAME_LENGTH, MAX_TIMEOUT_S
from protocol.conversation import Messages
from protocol.telemetry import TelemetrySample

# The limits of the Assign envelope the request becomes (protocol.constraints), except that a
# model name is not checked for visible characters here: an unknown model is a 503, not a 422.
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_MODEL_NAME_LENGTH)]
TimeoutS = Annotated[float, msgspec.Meta(gt=0, le=MAX_TIMEOUT_S)]


class _Response(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


# --- requests ----------------------------------------------------------------------------------


class TaskRequest(msgspec.Struct, kw_only=True):
    """``prompt`` (one string, sent as is) or ``messages`` (a conversation the node's model
    server applies its chat template to): exactly one. ``options``: sampling controls, each
    range-checked here (422) so no node sees a value its server refuses."""

    model: ModelName
    prompt: str | None = None
    messages: Messages | None = None
    options: Options | None = None
    stream: bool = False
    timeout_s: TimeoutS | None = None


class RatingRequest(msgspec.Struct, kw_only=True):
    score: Annotated[int, msgspec.Meta(ge=1, le=5)]


# --- responses ---------------------------------------------------------------------------------


class HealthResponse(_Response):
    ok: bool


class RootResponse(_Response):
    """``GET /``: what this server is and where to start."""

    service: str
    version: str
    # Where the documentation lives: the API (/openapi.json) and the source's interface guide.
    docs: str
    # name -> path on this server: openapi, system_health, healthz, readyz, status.
    links: dict[str, str]


class TokenUsage(_Response):
    """Tokens as the node's model server counted them."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage | None) -> TokenUsage | None:
        if usage is None:
            return None
        return cls(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        )


class TaskTimings(_Response):
    """Measured by the node: to its first output (None: there was none) and to its end."""

    ttft_s: float | None
    total_s: float

    @classmethod
    def of(cls, timings: Timings | None) -> TaskTimings | None:
        return None if timings is None else cls(ttft_s=timings.ttft_s, total_s=timings.total_s)


class TaskResponse(_Response, kw_only=True):
    task_id: str
    node_id: str
    output: str
    # None when the node did not say (a protocol v1 node, a server that does not count).
    usage: TokenUsage | None = None
    finish_reason: FinishReason | None = None
    timings: TaskTimings | None = None

    __event_stream__ = (
        'with "stream": true: `data: {"delta"}` events, then `data: {"done": true, "task_id",'
        ' "node_id", "output", "usage", "finish_reason", "timings"}` or `data: {"error":'
        ' {"code", "message", "status"}}`'
    )


class RatingResponse(_Response):
    task_id: str
    score: int


class Diagnostics(_Response):
    """Counters of the answering instance only (an extension of INTERFACE.md)."""

    local_nodes: int
    local_in_flight: int
    # Node answers refused (by the owner or the requester), by reason: wrong_source (not the
    # connection the task was assigned to), duplicate (a replay, or after the task ended),
    # unknown_task, overflow.
    dropped_answers: dict[str, int]
    # Tasks this instance's nodes run for other instances.
    forwarded_in_flight: int
    liveness_lost: int
    bus_losses: int
    # Requests of this instance waiting in the admission queue (all models: the route needs no
    # key, so it names no model); capacity leases that had expired when this instance came to
    # renew them.
    local_queue_depth: int
    lost_leases: int


class StatusResponse(_Response):
    online_nodes: int
    instances: int
    in_flight: int
    version: str
    instance_id: str
    # Requests waiting for capacity in the shared admission queue, all instances and models
    # (None when the coordination store cannot be read). Per model only in /api/v1/cluster, to
    # an operator key: the model names are the operator's business.
    queue_depth: int | None
    diagnostics: Diagnostics


class NodeInfo(_Response):
    node_id: str
    instance_id: str
    models: list[str]
    max_parallel: int
    in_flight: int
    vram_gb: float | None
    # Mean of the node's ratings (None until it has one) and how many there are.
    rating: float | None
    ratings: int
    agent_version: str
    connected_at: float | None
    # From the capacity leases in the shared store (None when it cannot be read): leases held
    # now (requests running or about to run on the node, from any instance) and the memory
    # they and the resident models use against ``vram_gb``, in GB.
    leases: int | None
    memory_in_use_gb: float | None
    # The node's latest host telemetry sample from its heartbeats (docs/observability.md "Host telemetry"),
    # as stored by its owner instance; None when it sent none (or the store cannot be read).
    telemetry: TelemetrySample | None = None
    # "agent": a node connected over WebSocket; "direct": a direct model host of the operator
    # file, called by the requesting instance itself (``instance_id`` is then "direct",
    # ``agent_version`` the host's kind, ``vram_gb`` its memory budget).
    kind: str = "agent"
    # Direct hosts only: "ok" (placement may use it), or why not: "no_facts", "unreachable",
    # "old_epoch" (written under an earlier monitor epoch), "stale" (older than
    # GEMMANET_RESIDENCY_STALE_S).
    host_state: str | None = None
    # Why ``host_state`` is not "ok" (None while it is, or null): an agent node's own account
    # of its backend (``backend_down``), or why a direct host's facts are not trusted.
    host_reason: str | None = None


class NodesResponse(_Response):
    nodes: list[NodeInfo]


class NodeTelemetryResponse(_Response):
    node_id: str
    #: oldest first, at most 60
    samples: list[TelemetrySample]


class ErrorDetail(_Response):
    code: str
    message: str


class ErrorResponse(_Response):
    """Every error, whatever its status (INTERFACE.md)."""

    error: ErrorDetail


# --- server-sent events of a streamed request (text/event-stream, one per ``data:`` line) ------


class DeltaEvent(_Response):
    delta: str


class DoneEvent(_Response, kw_only=True):
    done: Literal[True] = True
    task_id: str
    node_id: str
    output: str
    usage: TokenUsage | None = None
    finish_reason: FinishReason | None = None
    timings: TaskTimings | None = None


class StreamErrorDetail(_Response):
    code: str
    message: str
    status: int


class StreamErrorEvent(_Response):
    error: StreamErrorDetail
