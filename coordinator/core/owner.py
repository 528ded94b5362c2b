"""The owner side of the cluster protocol: this instance's node connections and the tasks they
run for requesters (other instances, or this one).

Pure: events in (a node connected, spoke or went away; an assign or cancel arrived; a tick),
effects out. The owner enforces that only the connection a task was assigned to may answer it,
refuses an assign its node cannot take (the requester then places the task elsewhere), and
stops work nobody waits for any more (a cancel, a dead requester, an expired task).
"""

from __future__ import annotations

import msgspec

from coordinator.core.effects import (
    CloseNode,
    Effect,
    NodeFactsChanged,
    NodesChanged,
    Publish,
    ReleaseOwnership,
    SendToNode,
)
from coordinator.core.forwarding import Forward, ForwardingTable
from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.core.registry import InstanceSnapshot, NodeEntry
from coordinator.core.task_content import assign_for
from coordinator.core.tracker import Verdict
from protocol import (
    BusAccepted,
    BusAssign,
    BusChunk,
    BusNodeGone,
    BusRefused,
    BusReplace,
    BusResult,
    Cancel,
    Chunk,
    CloseCode,
    Error,
    Heartbeat,
    Result,
    TaskErrorCode,
    TaskFailure,
    stamped,
)

# How long a reply that is not tied to a task's deadline keeps being retried on the bus.
REPLY_GIVE_UP_S = 5.0
# How long a replace keeps being retried: a lost one is made good by the owner records, which
# every instance checks each beat.
REPLACE_GIVE_UP_S = 5.0


class Owner:
    def __init__(self, instance_id: str, *, forward_grace_s: float, incarnation: str = "") -> None:
        self.me = instance_id
        self.incarnation = incarnation
        self.forward_grace_s = forward_grace_s
        self.nodes = NodeTable()
        self.forwarding = ForwardingTable()
        # conn id -> its entry in the last snapshot (``snapshot`` reuses the unchanged ones)
        self._entries: dict[str, NodeEntry] = {}
        # (NodeTable.changes, snapshot) of the last ``snapshot``
        self._last_snapshot: tuple[int, InstanceSnapshot] | None = None
        # Answers dropped before they reached any requester, by why.
        self.dropped: dict[Verdict, int] = {
            Verdict.WRONG_SOURCE: 0,
            Verdict.UNKNOWN_TASK: 0,
            Verdict.DUPLICATE: 0,
        }
        #: the instance drains (``move_nodes``): its nodes take no new task, and each is told
        #: to move (4004) once its tasks are done
        self.moving = False
        # Connections that moved away while draining: still listed in the snapshot (as
        # moving) until this instance leaves, so a peer that has not yet read the node's new
        # instance looks again rather than finding no node for its model.
        self._moved: dict[str, NodeConnection] = {}

    # -- node connections -------------------------------------------------------------------

    def connected(self, conn: NodeConnection) -> list[Effect]:
        """An authenticated connection; an older one of the same identity here is replaced."""
        replaced = self.nodes.register(conn)
        effects: list[Effect] = [NodesChanged(), NodeFactsChanged(conn.node_id, conn.conn_id)]
        if replaced is not None:
            effects.append(self._replaced_close(replaced))
            effects += self._lose(replaced, "was replaced by a newer connection")
        return effects

    def disconnected(self, conn_id: str, why: str) -> list[Effect]:
        """The socket of ``conn_id`` closed: its tasks end now (502), not at their timeout."""
        conn = self.nodes.unregister(conn_id)
        return [] if conn is None else self._lose(conn, why)

    def replaced(self, conn_id: str, node_id: str) -> list[Effect]:
        """A newer connection of ``node_id`` lives on another instance: close ours with 4000."""
        conn = self.nodes.by_conn(conn_id)
        if conn is None or conn.node_id != node_id:
            return []
        self.nodes.unregister(conn_id)
        return [self._replaced_close(conn), *self._lose(conn, "was replaced by a newer connection")]

    def claimed(
        self, conn: NodeConnection, previous: tuple[str, str] | None, now: float
    ) -> list[Effect]:
        """``conn``'s owner record names it now; ``previous``: the (instance, connection) it named
        before. A connection of the node on another instance is told to close there."""
        if previous is None or previous[0] == self.me:
            return []  # a connection of it here was replaced when this one connected
        old_instance, old_conn = previous
        replace = BusReplace(node_id=conn.node_id, conn_id=old_conn, new_instance=self.me)
        return [Publish(old_instance, replace, give_up_at=now + REPLACE_GIVE_UP_S)]

    def move_nodes(self, *, now: bool = False) -> list[Effect]:
        """The instance drains: no new task goes to its nodes (here or from peers, whose
        placements see them serve nothing), and each is told to move once idle; ``now``: every
        one at once, tasks or not."""
        self.moving = True
        effects: list[Effect] = [NodesChanged()]
        for conn in self.nodes.connections():
            if not conn.moving:
                self.nodes.withdraw(conn)
                # No lease is granted on it any more, whoever asks (leases check the facts).
                effects.append(NodeFactsChanged(conn.node_id, conn.conn_id, gone=True))
        self._entries = {}  # the snapshot's entries list their models: all made again
        for conn in self.nodes.connections():
            if now or not conn.tasks:
                effects.append(_move_close(conn))
        return effects

    def _moved_if_idle(self, conn: NodeConnection) -> list[Effect]:
        return [_move_close(conn)] if self.moving and not conn.tasks else []

    def _replaced_close(self, conn: NodeConnection) -> CloseNode:
        reason = f"replaced by a newer connection of node {conn.node_id}"
        return CloseNode(conn.conn_id, CloseCode.REPLACED, reason)

    def _lose(self, conn: NodeConnection, why: str) -> list[Effect]:
        if self.moving:
            self._moved[conn.conn_id] = conn
        effects: list[Effect] = [
            ReleaseOwnership(conn.node_id, conn.conn_id),
            NodesChanged(),
            NodeFactsChanged(conn.node_id, conn.conn_id, gone=True),
        ]
        for forward in self.forwarding.of_connection(conn.conn_id):
            gone = BusNodeGone(
                task_id=forward.task_id, node_id=conn.node_id, conn_id=conn.conn_id, reason=why
            )
            effects.append(Publish(forward.reply_to, gone, give_up_at=forward.expires_at))
        self.nodes.end_all_tasks(conn)
        return effects

    def node_envelope(self, conn_id: str, envelope: object, now: float) -> list[Effect]:
        """An envelope from a node: heartbeats refresh it, answers go to their requester."""
        conn = self.nodes.by_conn(conn_id)
        if conn is None:
            return []  # a connection already dropped: what it says means nothing now
        conn.last_seen = now
        if isinstance(envelope, Heartbeat):
            effects: list[Effect] = []
            # Every heartbeat says whether the backend is down: one without it, it answers.
            down = envelope.backend_down
            if self.nodes.set_backend_down(conn, None if down is msgspec.UNSET else down):
                effects.append(NodesChanged())  # its models are off (or back) for the peers
            resident = envelope.resident
            if resident is not None and frozenset(resident) != conn.resident:
                conn.resident = frozenset(resident)
                effects.append(NodeFactsChanged(conn.node_id, conn.conn_id))
            return effects
        if not isinstance(envelope, Chunk | Result | Error):
            return []
        task_id = envelope.task_id
        if task_id is None:
            return []  # a node-level complaint; the shell logs it
        verdict, forward = self.forwarding.check(task_id, conn_id)
        if forward is None:
            self.dropped[verdict] += 1
            return []
        out: BusChunk | BusResult
        moved: list[Effect] = []
        if isinstance(envelope, Chunk):
            out = BusChunk(task_id=task_id, conn_id=conn_id, seq=envelope.seq, delta=envelope.delta)
        else:
            self.forwarding.remove(task_id)
            self.nodes.end_task(conn, task_id)
            moved = self._moved_if_idle(conn)
            if isinstance(envelope, Result):
                out = stamped(
                    BusResult(
                        task_id=task_id,
                        node_id=conn.node_id,
                        conn_id=conn_id,
                        output=envelope.output,
                        chunks=envelope.chunks,
                        usage=envelope.usage,
                        finish_reason=envelope.finish_reason,
                        timings=envelope.timings,
                    )
                )
            else:
                failure = TaskFailure(code=envelope.code, message=envelope.message)
                out = BusResult(
                    task_id=task_id, node_id=conn.node_id, conn_id=conn_id, failure=failure
                )
        return [
            Publish(forward.reply_to, out, give_up_at=forward.expires_at, unreached_task=task_id),
            *moved,
        ]

    # -- requests from requesters -----------------------------------------------------------

    def assign(self, envelope: BusAssign, now: float) -> list[Effect]:
        """Run a task on the connection the requester chose, or refuse it (never started)."""
        conn = self.nodes.by_node(envelope.node_id)
        if conn is None or conn.conn_id != envelope.conn_id:
            return [
                self._refuse(
                    envelope, TaskErrorCode.NODE_DISCONNECTED, "the node's connection is gone", now
                )
            ]
        if self.forwarding.known(envelope.task_id, envelope.conn_id):
            return []  # a replayed assign
        if self.moving:
            message = f"node {conn.node_id} is moving: its instance is draining"
            return [self._refuse(envelope, TaskErrorCode.NODE_DRAINING, message, now)]
        if conn.backend_down is not None:
            # Placed from a view older than the node's word: the requester places it elsewhere.
            message = f"node {conn.node_id} cannot reach its model backend: {conn.backend_down}"
            return [self._refuse(envelope, TaskErrorCode.BACKEND_UNAVAILABLE, message, now)]
        if conn.in_flight >= conn.max_parallel:
            message = f"node {conn.node_id} is at capacity"
            return [self._refuse(envelope, TaskErrorCode.ALL_NODES_BUSY, message, now)]
        self.forwarding.add(
            Forward(
                task_id=envelope.task_id,
                node_id=conn.node_id,
                conn_id=conn.conn_id,
                reply_to=envelope.reply_to,
                expires_at=now + envelope.timeout_s + self.forward_grace_s,
            )
        )
        self.nodes.add_task(conn, envelope.task_id)
        assign = assign_for(conn.protocol, envelope)
        accepted = BusAccepted(task_id=envelope.task_id, conn_id=conn.conn_id)
        return [
            SendToNode(conn.conn_id, assign),
            Publish(envelope.reply_to, accepted, give_up_at=now + envelope.timeout_s),
        ]

    def _refuse(self, envelope: BusAssign, code: str, message: str, now: float) -> Publish:
        refusal = BusRefused(
            task_id=envelope.task_id,
            node_id=envelope.node_id,
            conn_id=envelope.conn_id,
            code=code,
            message=message,
        )
        return Publish(envelope.reply_to, refusal, give_up_at=now + REPLY_GIVE_UP_S)

    def cancel(self, task_id: str, reason: str) -> list[Effect]:
        """Nobody waits for ``task_id`` any more: stop it on its node and free the slot."""
        forward = self.forwarding.remove(task_id)
        return [] if forward is None else self._stop(forward, reason)

    def _stop(self, forward: Forward, reason: str) -> list[Effect]:
        conn = self.nodes.by_conn(forward.conn_id)
        if conn is None:
            return []
        self.nodes.end_task(conn, forward.task_id)
        cancel = SendToNode(conn.conn_id, Cancel(task_id=forward.task_id, reason=reason))
        return [cancel, *self._moved_if_idle(conn)]

    # -- supervision ------------------------------------------------------------------------

    def requesters_dead(self, dead: set[str], now: float) -> list[Effect]:
        """Tasks requested by dead instances are stopped on their nodes; a requester that was
        only frozen reads a node_gone when it resumes (502, not 504)."""
        effects: list[Effect] = []
        for forward in self.forwarding.of_requesters(dead):
            effects += self._stop(forward, "requester_gone")
            gone = BusNodeGone(
                task_id=forward.task_id,
                node_id=forward.node_id,
                conn_id=forward.conn_id,
                reason="the requesting instance was considered dead",
            )
            effects.append(Publish(forward.reply_to, gone, give_up_at=now + REPLY_GIVE_UP_S))
        return effects

    def drop_remote(self, reason: str) -> list[Effect]:
        """Stop every task requested by another instance (their answers can no longer be
        trusted to arrive: our inbox was lost, or peers declared us dead)."""
        effects: list[Effect] = []
        for forward in self.forwarding.not_of(self.me):
            effects += self._stop(forward, reason)
        return effects

    def tick(self, now: float, *, silence_deadline_s: float | None) -> list[Effect]:
        """Expired tasks stop; with ``silence_deadline_s``, nodes silent that long are closed."""
        effects: list[Effect] = []
        for forward in self.forwarding.expired(now):
            effects += self._stop(forward, "task_timeout")
        if silence_deadline_s is not None:
            for conn in self.nodes.silent(now, silence_deadline_s):
                self.nodes.unregister(conn.conn_id)
                effects.append(
                    CloseNode(conn.conn_id, CloseCode.HEARTBEAT_TIMEOUT, "heartbeat timeout")
                )
                effects += self._lose(conn, "stopped sending heartbeats")
        return effects

    def answer_unreached(self, task_id: str) -> list[Effect]:
        """An answer reached nobody: its requester is gone, so stop the task on the node."""
        return self.cancel(task_id, "requester_gone")

    def remote_requesters(self) -> set[str]:
        return self.forwarding.requesters() - {self.me}

    def snapshot(self, in_flight: int) -> InstanceSnapshot:
        # Asked for every beat. While no connection came, went or changed its load
        # (``NodeTable.changes``) it is the very same object: an idle beat costs nothing per
        # node. Otherwise a connection's entry is made again only when its load or its
        # backend's state moved (the rest of it is fixed for the connection's life).
        last = self._last_snapshot
        if last is not None and last[0] == self.nodes.changes and last[1].in_flight == in_flight:
            return last[1]
        entries: dict[str, NodeEntry] = {}
        for c in [*self.nodes.connections(), *self._moved.values()]:
            entry = self._entries.get(c.conn_id)
            if (
                entry is None
                or entry.in_flight != c.in_flight
                or entry.backend_down != c.backend_down
            ):
                entry = NodeEntry(
                    node_id=c.node_id,
                    conn_id=c.conn_id,
                    # A moving node still says what it serves: peers asking for its model
                    # look again (its lease facts are gone) until it is back elsewhere,
                    # rather than hearing that no node serves the model at all.
                    models=sorted(c.advertised if c.moving and not c.backend_down else c.models),
                    max_parallel=c.max_parallel,
                    in_flight=c.in_flight,
                    vram_gb=c.vram_gb,
                    agent_version=c.agent_version,
                    connected_at=c.connected_at,
                    backend_down=c.backend_down,
                )
            entries[c.conn_id] = entry
        self._entries = entries
        snapshot = InstanceSnapshot(
            instance_id=self.me,
            incarnation=self.incarnation,
            in_flight=in_flight,
            nodes=list(entries.values()),
        )
        self._last_snapshot = (self.nodes.changes, snapshot)
        return snapshot


def _move_close(conn: NodeConnection) -> CloseNode:
    reason = "coordinator instance draining: reconnect to another one now"
    return CloseNode(conn.conn_id, CloseCode.MOVE, reason)
