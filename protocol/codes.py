"""Codes that travel on the wire: WebSocket close codes and task error codes.

Each is written here once; the coordinator, the node agent, the simulator and the tests import
them. The values are part of the external contract (INTERFACE.md fixes 4000, 4001 and 4002;
the rest are this project's documented extensions), so a value never changes once released.
"""

from __future__ import annotations

import enum


class CloseCode(enum.IntEnum):
    """Close codes of ``WS /ws/node``. ``int`` subclass: compares equal to the bare number."""

    # RFC 6455
    NORMAL = 1000
    GOING_AWAY = 1001
    # Never sent: what a side reports when the connection dropped without a close frame.
    ABNORMAL_CLOSURE = 1006
    # The server hit a condition it did not expect (our own bug, never the peer's).
    INTERNAL_ERROR = 1011
    # The coordination store is unavailable: reconnect later (the agent backs off).
    TRY_AGAIN_LATER = 1013
    # INTERFACE.md: a newer connection of the same node identity exists (on any instance).
    # The agent exits instead of reconnecting, or two agents would displace each other forever.
    REPLACED = 4000
    # INTERFACE.md: unknown node or wrong token. The agent exits.
    AUTH_FAILED = 4001
    # INTERFACE.md: protocol error or unsupported version.
    PROTOCOL_ERROR = 4002
    # Extension: the node stayed silent past its heartbeat deadline; the agent reconnects.
    HEARTBEAT_TIMEOUT = 4003
    # Extension: the coordinator instance is going away (a drain, e.g. on SIGTERM) once the
    # node's tasks are done: reconnect now, to another coordinator (no backoff).
    MOVE = 4004


# A node agent closed with one of these must not reconnect.
FINAL_CLOSE_CODES: frozenset[int] = frozenset({CloseCode.REPLACED, CloseCode.AUTH_FAILED})


class TaskErrorCode(enum.StrEnum):
    """``code`` of an ``Error`` envelope (node -> coordinator) and of a bus ``TaskFailure``
    (owner -> requester). A ``str`` subclass: compares equal to the bare string, and a peer may
    send codes not listed here (they fail the task with 502 ``node_error``)."""

    # The node has no free slot for the task (its max parallel is reached).
    NODE_BUSY = "node_busy"
    # The node is shutting down and takes no new task.
    NODE_DRAINING = "node_draining"
    # The owner instance found every slot of the chosen node taken.
    ALL_NODES_BUSY = "all_nodes_busy"
    # The node (or the instance owning its connection) went away during the task.
    NODE_DISCONNECTED = "node_disconnected"
    # The node does not serve the model of the task.
    MODEL_NOT_SERVED = "model_not_served"
    # The model backend behind the node failed or timed out.
    BACKEND_ERROR = "backend_error"
    BACKEND_TIMEOUT = "backend_timeout"
    # Extension: the node cannot reach its model backend, so the task never ran there (the
    # node says so in its hello and heartbeats, ``backend_down``, and refuses tasks meanwhile).
    BACKEND_UNAVAILABLE = "backend_unavailable"
    # The model's output grew past MAX_OUTPUT_BYTES, the most a result envelope can carry.
    OUTPUT_TOO_LARGE = "output_too_large"


# Errors that mean "not now" rather than "this task is broken": the task is placed on another
# node, or the client gets 503 with Retry-After (all_nodes_busy), not 502.
BUSY_CODES: frozenset[str] = frozenset(
    {
        TaskErrorCode.NODE_BUSY,
        TaskErrorCode.NODE_DRAINING,
        TaskErrorCode.ALL_NODES_BUSY,
        TaskErrorCode.BACKEND_UNAVAILABLE,
    }
)
