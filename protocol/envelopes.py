"""Envelope types of protocol v1.

Two families share one codec:

* the node protocol, spoken over ``WS /ws/node`` between a node agent and the instance that
  owns its connection;
* the instance bus, spoken between coordinator instances over Redis pub/sub (or streams).

Every envelope is a frozen Struct tagged by ``type``; the version travels in ``v``.
Unknown extra fields are ignored on decode so a newer minor peer can add fields.
Field limits live in ``protocol.constraints`` and are enforced at decode time only.
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from protocol.constraints import (
    AgentVersion,
    Count,
    ErrorCode,
    HeartbeatIntervalS,
    Identifier,
    ModelList,
    ModelName,
    ParallelSlots,
    ResidentModels,
    TimeoutS,
    Token,
    VramGb,
)

VERSION = 1


class _Envelope(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    v: int = VERSION


# --- node protocol -----------------------------------------------------------------------------


class Hello(_Envelope, tag="hello", frozen=True, kw_only=True):
    """node -> coordinator, first message of every connection."""

    node_id: Identifier
    token: Token
    models: ModelList
    max_parallel: ParallelSlots = 1
    vram_gb: VramGb | None = None
    agent_version: AgentVersion = ""

    def __repr__(self) -> str:
        # Envelopes end up in logs and tracebacks; the node's credential must not.
        return (
            f"Hello(v={self.v!r}, node_id={self.node_id!r}, token='***', models={self.models!r},"
            f" max_parallel={self.max_parallel!r}, vram_gb={self.vram_gb!r},"
            f" agent_version={self.agent_version!r})"
        )


class Welcome(_Envelope, tag="welcome", frozen=True, kw_only=True):
    """coordinator -> node, the hello was accepted."""

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


class Assign(_Envelope, tag="assign", frozen=True, kw_only=True):
    """coordinator -> node: run this task."""

    task_id: Identifier
    model: ModelName
    prompt: str
    stream: bool = False
    timeout_s: TimeoutS = 120.0


class Chunk(_Envelope, tag="chunk", frozen=True, kw_only=True):
    """node -> coordinator: one streamed piece; ``seq`` counts from 0 per task."""

    task_id: Identifier
    seq: Count
    delta: str


class Result(_Envelope, tag="result", frozen=True, kw_only=True):
    """node -> coordinator: the task's whole output; ``chunks`` is how many chunks preceded it."""

    task_id: Identifier
    output: str
    chunks: Count = 0


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
    prompt: str
    stream: bool = False
    timeout_s: TimeoutS = 120.0
    # The requester's instance id; bounded like every id, so MAX_PROMPT_BYTES can be derived.
    reply_to: Identifier


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
