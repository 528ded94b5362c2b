"""Envelope types of protocols v1 and v2.

Two families share one codec:

* the node protocol, spoken over ``WS /ws/node`` between a node agent and the instance that
  owns its connection;
* the instance bus, spoken between coordinator instances over Redis pub/sub (or streams).

Every envelope is a frozen Struct tagged by ``type``; the version travels in ``v``: the lowest
protocol version that defines every field the envelope uses (``lowest_version``), so that a
peer of that version can read it. Version 2 adds conversations, sampling options, usage, the
finish reason and timings (``protocol.conversation``) to the task envelopes; every other
envelope is the same in both and travels as v1. A node says in its hello which versions it
speaks (``Hello.protocols``; the hello itself is v1, so any coordinator reads it), and the
welcome's ``v`` is the version chosen for the connection.

Unknown extra fields are ignored on decode so a newer minor peer can add fields.
Field limits live in ``protocol.constraints`` and ``protocol.conversation`` and are enforced at
decode time only.
"""

from __future__ import annotations

from typing import Annotated, TypeAlias, TypeVar

import msgspec
from msgspec import Meta

from protocol.constraints import (
    MAX_PROTOCOLS,
    AgentVersion,
    Count,
    ErrorCode,
    HeartbeatIntervalS,
    Identifier,
    ModelList,
    ModelName,
    ParallelSlots,
    Problem,
    ResidentModels,
    TimeoutS,
    Token,
    VramGb,
)
from protocol.conversation import FinishReason, Messages, Options, Timings, Usage

#: the versions this side speaks; ``VERSION`` is the newest
VERSIONS = (1, 2)
VERSION = 2
#: what an envelope says when it uses nothing of v2 (the default of every envelope)
BASE_VERSION = 1

E = TypeVar("E", bound="_Envelope")


class _Envelope(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    v: int = BASE_VERSION


# --- node protocol -----------------------------------------------------------------------------


class Hello(_Envelope, tag="hello", frozen=True, kw_only=True):
    """node -> coordinator, first message of every connection."""

    node_id: Identifier
    token: Token
    models: ModelList
    max_parallel: ParallelSlots = 1
    vram_gb: VramGb | None = None
    agent_version: AgentVersion = ""
    #: the protocol versions the node speaks (absent: only ``v``, i.e. an old v1 node). A v1
    #: field extension: a v1 coordinator ignores it and welcomes the node at v1.
    protocols: (
        Annotated[
            list[Annotated[int, Meta(ge=1, le=1000)]], Meta(min_length=1, max_length=MAX_PROTOCOLS)
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    #: why the node's model backend cannot serve now, in one line (its URL, what failed);
    #: see ``Heartbeat.backend_down``. A v1 field extension: absent, the backend answers.
    backend_down: Problem | msgspec.UnsetType = msgspec.UNSET

    def speaks(self) -> frozenset[int]:
        """The versions the node speaks."""
        return (
            frozenset(self.protocols)
            if self.protocols is not msgspec.UNSET
            else frozenset({self.v})
        )

    def __repr__(self) -> str:
        # Envelopes end up in logs and tracebacks; the node's credential must not.
        return (
            f"Hello(v={self.v!r}, node_id={self.node_id!r}, token='***', models={self.models!r},"
            f" max_parallel={self.max_parallel!r}, vram_gb={self.vram_gb!r},"
            f" agent_version={self.agent_version!r}, protocols={self.protocols!r},"
            f" backend_down={self.backend_down!r})"
        )


class Welcome(_Envelope, tag="welcome", frozen=True, kw_only=True):
    """coordinator -> node, the hello was accepted. Its ``v`` is the connection's protocol
    version: the newest the node's hello lists that the coordinator speaks."""

    instance_id: Identifier
    conn_id: Identifier
    heartbeat_interval_s: HeartbeatIntervalS


class Heartbeat(_Envelope, tag="heartbeat", frozen=True, kw_only=True):
    """Either direction; proves the peer is alive. ``in_flight`` is the sender's view."""

    in_flight: Count = 0
    #: node -> coordinator: the models loaded in memory now (None: the node does not say).
    #: Placement counts their resident size against the node's memory budget.
    resident: ResidentModels | None = None
    #: node -> coordinator, optional: the host's telemetry sample (``protocol.telemetry``),
    #: left unparsed here so that a bad sample is dropped by the coordinator
    #: (``parse_sample``) without failing the heartbeat. Absent unless set (old peers ignore it).
    telemetry: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    #: coordinator -> node, optional: heartbeat every ``interval_s`` from now on, and expect
    #: ours as often (an instance holding many nodes stretches the interval of the welcome:
    #: GEMMANET_HEARTBEAT_RATE). Absent unless set (old peers ignore it).
    interval_s: HeartbeatIntervalS | msgspec.UnsetType = msgspec.UNSET
    #: node -> coordinator, optional: why the node's model backend cannot serve now, in one
    #: line (which URL, what failed). Set, in the hello or a heartbeat, the node serves none of
    #: its models and refuses tasks (``backend_unavailable``); each heartbeat says the state
    #: anew, so one without it means the backend answers again. A v1 field extension: an old
    #: coordinator ignores it, an old node never sets it (its backend counts as answering).
    backend_down: Problem | msgspec.UnsetType = msgspec.UNSET


class Assign(_Envelope, tag="assign", frozen=True, kw_only=True):
    """coordinator -> node: run this task, on ``prompt`` (v1 and v2) or ``messages`` (v2),
    exactly one of them, with ``options`` (v2)."""

    task_id: Identifier
    model: ModelName
    prompt: str | None = None
    stream: bool = False
    timeout_s: TimeoutS = 120.0
    messages: Messages | msgspec.UnsetType = msgspec.UNSET
    options: Options | msgspec.UnsetType = msgspec.UNSET


class Chunk(_Envelope, tag="chunk", frozen=True, kw_only=True):
    """node -> coordinator: one streamed piece; ``seq`` counts from 0 per task."""

    task_id: Identifier
    seq: Count
    delta: str


class Result(_Envelope, tag="result", frozen=True, kw_only=True):
    """node -> coordinator: the task's whole output; ``chunks`` is how many chunks preceded it.
    v2: what the model server reported of it (any of them may be absent)."""

    task_id: Identifier
    output: str
    chunks: Count = 0
    usage: Usage | msgspec.UnsetType = msgspec.UNSET
    finish_reason: FinishReason | msgspec.UnsetType = msgspec.UNSET
    timings: Timings | msgspec.UnsetType = msgspec.UNSET


class Error(_Envelope, tag="error", frozen=True, kw_only=True):
    """node -> coordinator: the task failed (or, with no task_id, the node reports a problem)."""

    task_id: Identifier | None = None
    code: ErrorCode
    message: str


class Cancel(_Envelope, tag="cancel", frozen=True, kw_only=True):
    """coordinator -> node: stop working on this task; nobody waits for it any more."""

    task_id: Identifier
    reason: str = ""


NodeEnvelope: TypeAlias = Hello | Welcome | Heartbeat | Assign | Chunk | Result | Error | Cancel


# --- instance bus ------------------------------------------------------------------------------


class TaskFailure(msgspec.Struct, frozen=True, kw_only=True):
    """Why a task failed, as carried between instances."""

    code: ErrorCode
    message: str


class BusAssign(_Envelope, tag="bus.assign", frozen=True, kw_only=True):
    """requester -> owner: hand this task to the node connection you own."""

    task_id: Identifier
    node_id: Identifier
    conn_id: Identifier
    model: ModelName
    prompt: str | None = None
    stream: bool = False
    timeout_s: TimeoutS = 120.0
    # The requester's instance id; bounded like every id, so MAX_PROMPT_BYTES can be derived.
    reply_to: Identifier
    messages: Messages | msgspec.UnsetType = msgspec.UNSET
    options: Options | msgspec.UnsetType = msgspec.UNSET


class BusChunk(_Envelope, tag="bus.chunk", frozen=True, kw_only=True):
    """owner -> requester: a chunk of a task the requester waits for. ``conn_id`` is the node
    connection that produced it; the requester checks it is the one it assigned."""

    task_id: Identifier
    conn_id: Identifier
    seq: Count
    delta: str


class BusResult(_Envelope, tag="bus.result", frozen=True, kw_only=True):
    """owner -> requester: the task ended, with ``output`` or with ``failure``."""

    task_id: Identifier
    node_id: Identifier
    conn_id: Identifier
    output: str | None = None
    chunks: Count = 0
    failure: TaskFailure | None = None
    usage: Usage | msgspec.UnsetType = msgspec.UNSET
    finish_reason: FinishReason | msgspec.UnsetType = msgspec.UNSET
    timings: Timings | msgspec.UnsetType = msgspec.UNSET


class BusNodeGone(_Envelope, tag="bus.node_gone", frozen=True, kw_only=True):
    """owner -> requester: the node of this task disconnected (or was never there)."""

    task_id: Identifier
    node_id: Identifier
    conn_id: Identifier
    reason: str = ""


class BusReplace(_Envelope, tag="bus.replace", frozen=True, kw_only=True):
    """new owner -> old owner: close ``conn_id`` of ``node_id`` with 4000."""

    node_id: Identifier
    conn_id: Identifier
    new_instance: Identifier


class BusCancel(_Envelope, tag="bus.cancel", frozen=True, kw_only=True):
    """requester -> owner: nobody waits for this task any more; cancel it on the node."""

    task_id: Identifier
    reason: str = ""


class BusAccepted(_Envelope, tag="bus.accepted", frozen=True, kw_only=True):
    """owner -> requester: the assign was handed to the node. Until this arrives, no node is
    known to run the task: if the owner dies first, the requester places it elsewhere."""

    task_id: Identifier
    conn_id: Identifier


class BusRefused(_Envelope, tag="bus.refused", frozen=True, kw_only=True):
    """owner -> requester: the assign was not started (``code`` ``all_nodes_busy``: the node is
    full; ``node_disconnected``: the connection is no longer here). No node saw the task, so
    the requester places it again elsewhere."""

    task_id: Identifier
    node_id: Identifier
    conn_id: Identifier
    code: ErrorCode
    message: str = ""


class BusWake(_Envelope, tag="bus.wake", frozen=True, kw_only=True):
    """any instance -> the instance whose request is first in ``model``'s admission queue:
    capacity was freed, try to place it now."""

    model: ModelName


BusEnvelope: TypeAlias = (
    BusAssign
    | BusAccepted
    | BusChunk
    | BusResult
    | BusNodeGone
    | BusRefused
    | BusReplace
    | BusCancel
    | BusWake
)


# --- versions ----------------------------------------------------------------------------------

_TaskIn = Assign | BusAssign
_TaskOut = Result | BusResult


def lowest_version(envelope: msgspec.Struct) -> int:
    """The lowest protocol version defining every field ``envelope`` uses."""
    if isinstance(envelope, _TaskIn):
        if envelope.messages is not msgspec.UNSET or envelope.options is not msgspec.UNSET:
            return 2
    elif isinstance(envelope, _TaskOut) and (
        envelope.usage is not msgspec.UNSET
        or envelope.finish_reason is not msgspec.UNSET
        or envelope.timings is not msgspec.UNSET
    ):
        return 2
    return BASE_VERSION


def stamped(envelope: E) -> E:
    """``envelope`` with ``v`` set to its ``lowest_version``: what every sender sends."""
    version = lowest_version(envelope)
    return envelope if envelope.v == version else msgspec.structs.replace(envelope, v=version)


def content_problem(envelope: msgspec.Struct) -> str | None:
    """Why a decoded envelope is invalid beyond its field types, or None. A task envelope
    carries exactly one of ``prompt`` and ``messages``; no envelope uses fields newer than
    its ``v`` (a reader of that version would misread it)."""
    if isinstance(envelope, _TaskIn):
        has_messages = envelope.messages is not msgspec.UNSET
        if has_messages == (envelope.prompt is not None):
            return "a task carries exactly one of 'prompt' and 'messages'"
    needed = lowest_version(envelope)
    if needed > envelope.v:  # type: ignore[attr-defined]
        return f"fields of protocol v{needed} in a v{envelope.v} envelope"  # type: ignore[attr-defined]
    return None
