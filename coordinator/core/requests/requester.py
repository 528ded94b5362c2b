"""The requester side of the cluster protocol: tasks this instance accepted from its clients.

Pure: events in (a request arrived or ended, an answer or refusal came from an owner, owners
died, the bus was lost, a tick), effects out. The requester places each task on a node
(``attempts.py``), hands it to the node's owner (this instance or a peer), checks every answer
against the connection it assigned (``TaskTracker``), and ends each task exactly once: with its
output, or with an explicit error (502 when its node or owner went away, 504 at its deadline).
Each request's place in its lifecycle is one ``RequestState`` (``request_state.py``).

Placement never gives up while another node has room: an assign that reached nobody (the owner
is gone), that the owner refused (its node was full or gone: the requester's view was stale) or
that the node turned down as busy before producing anything is placed again elsewhere, since
no node ever ran it. Only when no other node can take it does the request get the error.
"""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.core.effects import (
    ChunkEvent,
    Deliver,
    DoneEvent,
    Effect,
    FailedEvent,
    Publish,
)
from coordinator.core.requests.attempts import CANCEL_GIVE_UP_S, PlacementAttempts
from coordinator.core.requests.request_state import HANDED_TO_NODE, RequestState
from coordinator.core.tracker import MAX_STREAMED_CHARS, PendingTask, Verdict
from coordinator.errors import (
    AllNodesBusy,
    GemmaNetError,
    NodeDisconnected,
    NodeFailed,
    TaskTimedOut,
)
from protocol import (
    BUSY_CODES,
    BusAccepted,
    BusCancel,
    BusChunk,
    BusNodeGone,
    BusRefused,
    BusResult,
    TaskErrorCode,
)


def failure_error(node_id: str, code: str, message: str) -> GemmaNetError:
    """The client-facing error for a task failure a node (or its owner instance) reported."""
    if code in BUSY_CODES:
        return AllNodesBusy(f"node {node_id} refused the task: {message}", retry_after_s=1)
    if code == TaskErrorCode.NODE_DISCONNECTED:
        return NodeDisconnected(message)
    return NodeFailed(f"node {node_id} failed the task ({code}): {message}")


#: chunk verdicts that fail the task (502), and why
_STREAM_FAILURES = {
    Verdict.OVERFLOW: "sent chunks too far out of order",
    Verdict.TOO_LARGE: f"streamed more than {MAX_STREAMED_CHARS:,} characters, more than a"
    " result can carry",
}


class Requester(PlacementAttempts):
    # -- answers ----------------------------------------------------------------------------

    def accepted(self, envelope: BusAccepted) -> list[Effect]:
        request = self._requests.get(envelope.task_id)
        task = self.tracker.get(envelope.task_id)
        if (
            request is not None
            and task is not None
            and task.conn_id == envelope.conn_id
            and request.state not in HANDED_TO_NODE
        ):
            request.move(RequestState.ACCEPTED)
        return []

    def chunk(self, envelope: BusChunk, now: float) -> list[Effect]:
        task_id = envelope.task_id
        verdict, deltas = self.tracker.on_chunk(
            task_id, envelope.conn_id, envelope.seq, envelope.delta
        )
        effects: list[Effect] = [Deliver(task_id, ChunkEvent(d)) for d in deltas]
        request = self._requests.get(task_id)
        if verdict is Verdict.ACCEPTED and request is not None:
            request.move(RequestState.STREAMING)  # the node runs it: no re-placement any more
        task = self.tracker.get(task_id)
        if verdict in _STREAM_FAILURES and task is not None:
            error = NodeFailed(f"node {task.node_id} {_STREAM_FAILURES[verdict]}")
            effects += self._finish(task_id, envelope.conn_id, FailedEvent(error))
            # Nobody reads its output any more: the owner stops it on the node.
            cancel = BusCancel(task_id=task_id, reason=error.code)
            effects.append(Publish(task.owner_instance, cancel, now + CANCEL_GIVE_UP_S))
        return effects

    def result(self, envelope: BusResult, now: float) -> list[Effect]:
        task_id, failure = envelope.task_id, envelope.failure
        if failure is None:
            return self._finish(task_id, envelope.conn_id, DoneEvent.of(envelope))
        error = failure_error(envelope.node_id, failure.code, failure.message)
        request = self._requests.get(task_id)
        task = self.tracker.get(task_id)
        if (
            failure.code in BUSY_CODES
            and request is not None
            and request.state is not RequestState.STREAMING
            and task is not None
            and task.conn_id == envelope.conn_id
        ):
            # The node turned it down before producing anything: it never ran. Another node
            # may take it; once every node serving the model has turned it down, the client
            # hears so now (503 with Retry-After) rather than at its deadline: a node busy
            # with work the leases do not see would otherwise be offered it again and again.
            request.full.add(envelope.conn_id)
            if failure.code == TaskErrorCode.BACKEND_UNAVAILABLE:
                request.gone_conns.add(envelope.conn_id)  # it serves nothing for now
            if all(v.conn_id in request.full for v in self._serving(request, now)):
                return self._fail(task_id, error)
            return self._place_again(request, error, now)
        return self._finish(task_id, envelope.conn_id, FailedEvent(error))

    def node_gone(self, envelope: BusNodeGone) -> list[Effect]:
        reason = envelope.reason or "disconnected"
        error = NodeDisconnected(f"node {envelope.node_id} went away during the task ({reason})")
        return self._finish(envelope.task_id, envelope.conn_id, FailedEvent(error))

    def refused(self, envelope: BusRefused, now: float) -> list[Effect]:
        """The owner did not start the task: its node was full or gone. Place it again."""
        request = self._requests.get(envelope.task_id)
        task = self.tracker.get(envelope.task_id)
        if request is None or task is None or task.conn_id != envelope.conn_id:
            return []
        request.report_due = False  # the owner answered: it received the assign
        # A node whose backend is down serves nothing for now: like a gone one, it is not
        # offered this task again (the client hears why when no other node can take it).
        down = envelope.code == TaskErrorCode.BACKEND_UNAVAILABLE
        if envelope.code in BUSY_CODES and not down:
            request.full.add(envelope.conn_id)
        else:
            request.gone_conns.add(envelope.conn_id)
        error = failure_error(envelope.node_id, envelope.code, envelope.message)
        return self._place_again(request, error, now, keep_why=down)

    def _finish(self, task_id: str, conn_id: str, event: DoneEvent | FailedEvent) -> list[Effect]:
        task = self.tracker.get(task_id)
        if self.tracker.on_finish(task_id, conn_id) is not Verdict.ACCEPTED:
            return []
        request = self._requests.get(task_id)
        if task is not None and request is not None and request.report_due:
            where = (task.node_id, task.conn_id, task.owner_instance)
            self._answered_while_dispatching[task_id] = where
        return [*self._close(task_id), Deliver(task_id, event)]

    # -- endings the requester decides ------------------------------------------------------

    def ended(self, task_id: str, outcome: str, now: float) -> list[Effect]:
        """The request is done with its task (answered, failed, or its client left): if the
        task still runs, its owner is told to stop it."""
        effects = self._close(task_id)
        self._answered_while_dispatching.pop(task_id, None)
        task = self.tracker.close(task_id)
        if task is None:
            return effects
        cancel = BusCancel(task_id=task_id, reason=outcome)
        return [*effects, Publish(task.owner_instance, cancel, now + CANCEL_GIVE_UP_S)]

    def owners_dead(
        self, dead: set[str], now: float, why: str | None = None, *, place_unaccepted: bool = True
    ) -> list[Effect]:
        """Tasks waiting on a dead owner end now with 502 — except those the owner never
        confirmed handing to a node (a PUBLISH can still reach a killed process's socket
        before Redis notices it closed): no node is known to run them, so they are placed
        again elsewhere. The owner is told to cancel either way, in case it was only frozen:
        it stops the task on its node when it resumes."""
        doomed = [t for t in self.tracker.pending() if t.owner_instance in dead]
        return self._owners_gone(doomed, now, why, place_unaccepted=place_unaccepted)

    def owners_reborn(self, incarnations: Mapping[str, str], now: float) -> list[Effect]:
        """``incarnations``: each peer's life as its registry entry reads now. A task placed on
        another life of its owner than the one registered now was lost with it: the owner was
        restarted with the same instance id (kill -9 and an immediate restart keep the inbox
        and the beat fresh, so neither tells the old life is dead), and the new life knows
        nothing of the task. It ends like a task of a dead owner."""
        doomed = [
            t
            for t in self.tracker.pending()
            if t.owner_instance != self.me
            and t.owner_incarnation
            and incarnations.get(t.owner_instance, t.owner_incarnation) != t.owner_incarnation
        ]
        why = "the instance serving the node was restarted; the task was lost with it"
        return self._owners_gone(doomed, now, why, place_unaccepted=True)

    def _owners_gone(
        self, doomed: list[PendingTask], now: float, why: str | None, *, place_unaccepted: bool
    ) -> list[Effect]:
        effects: list[Effect] = []
        for task in doomed:
            request = self._requests.get(task.task_id)
            if request is not None and request.report_due:
                # Whether the assign reached anybody is not known yet; the dispatch decides.
                request.owner_died_meanwhile = True
                continue
            cancel = BusCancel(task_id=task.task_id, reason="owner_considered_dead")
            effects.append(Publish(task.owner_instance, cancel, now + CANCEL_GIVE_UP_S))
            message = why or f"instance {task.owner_instance} serving node {task.node_id} went away"
            if place_unaccepted and request is not None and request.state not in HANDED_TO_NODE:
                request.gone_instances.add(task.owner_instance)
                # Its node may have got it just before the owner died: if no other node can
                # take it, the client hears that the owner went away (502).
                error = NodeDisconnected(message)
                effects += self._place_again(request, error, now, keep_why=True)
                continue
            effects += self._fail(task.task_id, NodeDisconnected(message))
        return effects

    def remote_tasks_lost(self, now: float) -> list[Effect]:
        """Our inbox was lost: answers from other instances may be lost; fail those tasks."""
        owners = {t.owner_instance for t in self.tracker.pending()} - {self.me}
        why = "lost the instance bus; the answer may be lost"
        return self.owners_dead(owners, now, why, place_unaccepted=False)

    def tick(self, now: float) -> list[Effect]:
        """Safety net for tasks nobody ended (a client gone before its stream began)."""
        effects: list[Effect] = []
        for task in self.tracker.expired(now):
            effects += self._close(task.task_id)
            error = TaskTimedOut(f"task {task.task_id} timed out")
            effects.append(Deliver(task.task_id, FailedEvent(error)))
            cancel = BusCancel(task_id=task.task_id, reason="task_timeout")
            effects.append(Publish(task.owner_instance, cancel, now + CANCEL_GIVE_UP_S))
        return effects

    # -- views ------------------------------------------------------------------------------

    def owners(self) -> set[str]:
        """The other instances this instance waits on."""
        return {t.owner_instance for t in self.tracker.pending()} - {self.me}

    def pending_per_remote_conn(self) -> dict[str, int]:
        pending: dict[str, int] = {}
        for task in self.tracker.pending():
            if task.owner_instance != self.me:
                pending[task.conn_id] = pending.get(task.conn_id, 0) + 1
        return pending

    def placement(self, task_id: str) -> tuple[str, str, str] | None:
        """(node, connection, owner instance) the task is placed on now, or was when it was
        answered before its dispatch returned (asked once, by the request placing it)."""
        task = self.tracker.get(task_id)
        if task is None:
            return self._answered_while_dispatching.pop(task_id, None)
        return (task.node_id, task.conn_id, task.owner_instance)
