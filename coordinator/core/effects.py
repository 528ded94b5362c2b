"""What the cluster machines ask the shell to do, and what a waiting request is told.

The machines (``owner.py``, ``requests/requester.py``, joined in ``instance_machine.py``) never
do I/O: every method takes an event (and ``now``) and returns a list of these effects, which
the trio driver (``coordinator/runtime/instance.py``) carries out in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from coordinator.errors import GemmaNetError
from protocol import Assign, BusAssign, BusEnvelope, BusResult, Cancel, FinishReason, Timings, Usage

# -- what a request sees ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkEvent:
    delta: str


@dataclass(frozen=True, slots=True)
class DoneEvent:
    """The task's whole output, and what its model server reported of it (None: not said,
    by a v1 node or a server that does not count)."""

    output: str
    usage: Usage | None = None
    finish_reason: FinishReason | None = None
    timings: Timings | None = None

    @classmethod
    def of(cls, result: BusResult) -> DoneEvent:
        def given(value: object) -> object:
            return None if value is msgspec.UNSET else value

        return cls(
            result.output or "",
            given(result.usage),  # type: ignore[arg-type]
            given(result.finish_reason),  # type: ignore[arg-type]
            given(result.timings),  # type: ignore[arg-type]
        )


@dataclass(frozen=True, slots=True)
class FailedEvent:
    error: GemmaNetError


@dataclass(frozen=True, slots=True)
class MovedEvent:
    """The task was refused where it was first placed (that node never ran it) and now runs on
    another node; the request reports this node in its answer."""

    node_id: str
    conn_id: str
    owner_instance: str


TaskEvent = ChunkEvent | DoneEvent | FailedEvent | MovedEvent


# -- effects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendToNode:
    conn_id: str
    envelope: Assign | Cancel


@dataclass(frozen=True, slots=True)
class CloseNode:
    """Close a node connection with a WebSocket close code (4000 replaced, 4003 silent)."""

    conn_id: str
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Publish:
    """Send an envelope to another instance's inbox, queued and retried until ``give_up_at``.
    ``unreached_task``: when nobody receives it, the owner stops that forwarded task (its
    requester is gone)."""

    target: str
    envelope: BusEnvelope
    give_up_at: float
    unreached_task: str | None = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Hand a task to the instance owning its node. The shell reports back whether anybody
    received it (``InstanceMachine.dispatched``/``unreached``/``dispatch_failed``)."""

    target: str
    envelope: BusAssign
    placement: int  # which placement of the task this is (1 for the first)


@dataclass(frozen=True, slots=True)
class Deliver:
    """An event for the request waiting on ``task_id``."""

    task_id: str
    event: TaskEvent


@dataclass(frozen=True, slots=True)
class NodesChanged:
    """A node came or went here: republish the registry now, not at the next beat."""


@dataclass(frozen=True, slots=True)
class ReleaseOwnership:
    """This connection no longer speaks for its node: drop the shared owner record unless a
    newer connection already took it over."""

    node_id: str
    conn_id: str


@dataclass(frozen=True, slots=True)
class Reserve:
    """Take a capacity lease for the task (its ``attempt``-th placement) on one of the nodes
    ``Requester.candidates`` names, waiting in the shared admission queue while none has
    room. The shell reports the outcome (``Requester.reserved`` / ``reserve_failed``)."""

    task_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class ReleaseLease:
    """Give back what a request held in the shared store: its lease on ``lease`` (node id,
    lease id) if any, its queue entry for ``model`` and its entry in ``key_id``'s active set
    (empty ``model``/``key_id``: keep those, the request goes on). Instances with a request
    first in the queue of one of ``wake_models`` are told to try again."""

    task_id: str
    key_id: str
    model: str
    lease: tuple[str, str] | None
    wake_models: tuple[str, ...]
    #: (node id, lease id) of leases an unanswered ask may have been granted: ended if they exist
    maybe_leases: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class WakeQueue:
    """Capacity was freed for ``model``: this instance's first waiting request tries again."""

    model: str


@dataclass(frozen=True, slots=True)
class NodeFactsChanged:
    """Write (or, once the connection is gone, drop) the node's facts in the shared store,
    which capacity leases are checked against."""

    node_id: str
    conn_id: str
    gone: bool = False


@dataclass(frozen=True, slots=True)
class CallHost:
    """Run the task on a direct model host: this instance calls it over HTTP and reports what
    it answers as that host's chunks and result (``InstanceMachine.host_answer``)."""

    host_id: str
    envelope: BusAssign
    #: the task's deadline: the call never outlives it by more than a grace period
    deadline: float


@dataclass(frozen=True, slots=True)
class StopHostCall:
    """Nobody waits for the task's host call any more (answered elsewhere, client gone,
    timed out): cancel it, which drops its HTTP connection and stops the generation."""

    task_id: str


Effect = (
    SendToNode
    | CloseNode
    | Publish
    | Dispatch
    | Deliver
    | NodesChanged
    | ReleaseOwnership
    | Reserve
    | ReleaseLease
    | WakeQueue
    | NodeFactsChanged
    | CallHost
    | StopHostCall
)
