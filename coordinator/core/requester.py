"""The requester side of the cluster protocol: tasks this instance accepted from its clients.

Pure: events in (a request arrived or ended, an answer or refusal came from an owner, owners
died, the bus was lost, a tick), effects out. The requester places each task on a node, hands it
to the node's owner (this instance or a peer), checks every answer against the connection it
assigned (``TaskTracker``), and ends each task exactly once: with its output, or with an
explicit error (502 when its node or owner went away, 504 at its deadline).

Placement never gives up while another node has room: an assign that reached nobody (the owner
is gone), that the owner refused (its node was full or gone: the requester's view was stale) or
that the node turned down as busy before producing anything is placed again elsewhere, since
no node ever ran it. Only when no other node can take it does the request get the error.

Capacity is reserved before a task is sent: each placement asks the shell for a lease
(``Reserve``) on one of the ``candidates``, best first; the shell takes it atomically in the
shared store, or waits in the shared admission queue while no candidate has room, and reports
back (``reserved`` / ``reserve_failed``). Whatever a request holds there (lease, queue entry,
active-set entry of its API key) is given back when it ends (``ReleaseLease``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from coordinator.core.candidates import Candidates
from coordinator.core.effects import (
    ChunkEvent,
    Deliver,
    Dispatch,
    DoneEvent,
    Effect,
    FailedEvent,
    MovedEvent,
    Publish,
    ReleaseLease,
    Reserve,
)
from coordinator.core.placement import NodeView
from coordinator.core.task_content import bus_assign_for
from coordinator.core.tracker import MAX_STREAMED_CHARS, PendingTask, TaskTracker, Verdict
from coordinator.errors import (
    AllNodesBusy,
    GemmaNetError,
    NodeDisconnected,
    NodeFailed,
    NoNodeForModel,
    TaskTimedOut,
)
from protocol import (
    BUSY_CODES,
    Assign,
    BusAccepted,
    BusCancel,
    BusChunk,
    BusNodeGone,
    BusRefused,
    BusResult,
    TaskErrorCode,
)

# An upper bound on placements of one task (each one excludes a node, so this only matters
# in a very large network whose nodes all turn the task down).
MAX_PLACEMENTS = 32
# Candidates offered per lease attempt: the lease script tries them in order in one call.
CANCEL_GIVE_UP_S = 5.0


def failure_error(node_id: str, code: str, message: str) -> GemmaNetError:
    """The client-facing error for a task failure a node (or its owner instance) reported."""
    if code in BUSY_CODES:
        return AllNodesBusy(f"node {node_id} refused the task: {message}", retry_after_s=1)
    if code == TaskErrorCode.NODE_DISCONNECTED:
        return NodeDisconnected(message)
    return NodeFailed(f"node {node_id} failed the task ({code}): {message}")


def no_node_serves(model: str) -> NoNodeForModel:
    return NoNodeForModel(f"no online node serves model {model!r}", retry_after_s=5)


#: chunk verdicts that fail the task (502), and why
_STREAM_FAILURES = {
    Verdict.OVERFLOW: "sent chunks too far out of order",
    Verdict.TOO_LARGE: f"streamed more than {MAX_STREAMED_CHARS:,} characters, more than a"
    " result can carry",
}


@dataclass
class Request:
    assign: Assign
    deadline: float
    key_id: str = ""
    placements: int = 0
    #: the lease attempt in progress (each placement takes a new lease)
    attempt: int = 0
    #: (node id, lease id) and the models of that node, while a lease is held
    lease: tuple[str, str] | None = None
    lease_models: tuple[str, ...] = ()
    #: it waited in the admission queue (its entry is removed when it ends)
    queued: bool = False
    # Connections that turned this task down as full, and instances it could not reach.
    full: set[str] = field(default_factory=set)
    gone_conns: set[str] = field(default_factory=set)
    gone_instances: set[str] = field(default_factory=set)
    # The assign is on its way to a peer; whether anybody received it is not known yet.
    dispatching: bool = False
    owner_died_meanwhile: bool = False
    # The owner handed it to the node (bus.accepted, or an answer came): from now on a dead
    # owner means a lost task (502), before it an assign nobody ran (placed again).
    accepted: bool = False
    started: bool = False  # a chunk arrived: the node runs it, no re-placement any more


class Requester:
    def __init__(
        self,
        instance_id: str,
        *,
        views: Callable[[], list[NodeView]],
        rng: random.Random,
        tracks_keys: bool = False,
        host_views: Callable[[float], list[NodeView]] | None = None,
        serves: Callable[[str], bool] | None = None,
        sample: Callable[[str, int, random.Random], list[NodeView] | None] | None = None,
    ) -> None:
        self.me = instance_id
        # API keys have an active-request limit: every request holds an entry in the store.
        self._tracks_keys = tracks_keys
        self.tracker = TaskTracker()
        self._candidates = Candidates(
            views, rng=rng, host_views=host_views, serves=serves, sample=sample
        )
        self._requests: dict[str, Request] = {}
        # Where tasks were placed whose answer overtook their own dispatch (it can: the answer
        # comes in on the subscription while the PUBLISH reply is still on its way); their
        # requests read it once, in ``placement``, right after the dispatch returns.
        self._answered_while_dispatching: dict[str, tuple[str, str, str]] = {}

    def __len__(self) -> int:
        return len(self.tracker)

    # -- placement --------------------------------------------------------------------------

    def submit(
        self, assign: Assign, deadline: float, key_id: str = "", now: float | None = None
    ) -> list[Effect]:
        """Take a new task: ask for a lease on a node serving its model. Raises NoNodeForModel
        when no online node (nor, given ``now``, direct host) serves it (refused at once,
        never queued)."""
        if not self._candidates.any_serves(assign.model, now):
            raise no_node_serves(assign.model)
        request = Request(assign, deadline, key_id=key_id, attempt=1)
        self._requests[assign.task_id] = request
        return [Reserve(assign.task_id, 1)]

    def candidates(
        self, task_id: str, attempt: int, now: float | None = None
    ) -> list[NodeView] | None:
        """The nodes to try for the lease, best first (None: the attempt is over). Nodes
        that refused this task as full come last; gone ones not at all. Direct hosts are
        candidates only given ``now`` (their facts must be fresh at that time)."""
        request = self._requests.get(task_id)
        if request is None or request.attempt != attempt or request.lease is not None:
            return None
        return self._candidates.ranked(
            request.assign.model,
            gone_conns=request.gone_conns,
            gone_instances=request.gone_instances,
            full=request.full,
            now=now,
        )

    def reserved(self, task_id: str, attempt: int, view: NodeView, lease_id: str) -> list[Effect]:
        """A lease on ``view``'s node was granted: send the task there."""
        request = self._requests.get(task_id)
        lease = (view.node_id, lease_id)
        if request is None or request.attempt != attempt or request.lease is not None:
            # Nobody wants it any more (the request ended while the lease was being taken).
            return [ReleaseLease(task_id, "", "", lease, tuple(sorted(view.models)))]
        request.lease, request.lease_models = lease, tuple(sorted(view.models))
        effects: list[Effect] = []
        if request.placements:
            moved = MovedEvent(view.node_id, view.conn_id, view.instance_id)
            effects.append(Deliver(task_id, moved))
        return effects + self._place_on(request, view)

    def waiting(self, task_id: str) -> None:
        """The request waits in the admission queue."""
        request = self._requests.get(task_id)
        if request is not None:
            request.queued = True

    def reserve_failed(self, task_id: str, attempt: int, error: GemmaNetError) -> list[Effect]:
        """No lease: the store refused, could not be reached, or the wait timed out."""
        request = self._requests.get(task_id)
        if request is None or request.attempt != attempt:
            return []
        return self._fail(task_id, error)

    def model_of(self, task_id: str) -> str | None:
        request = self._requests.get(task_id)
        return None if request is None else request.assign.model

    def key_of(self, task_id: str) -> str:
        request = self._requests.get(task_id)
        return "" if request is None else request.key_id

    def deadline_of(self, task_id: str) -> float | None:
        request = self._requests.get(task_id)
        return None if request is None else request.deadline

    def leases(self) -> list[tuple[str, str]]:
        """Every lease this instance holds, to renew."""
        return [r.lease for r in self._requests.values() if r.lease is not None]

    def _place_on(self, request: Request, view: NodeView) -> list[Effect]:
        assign = request.assign
        self.tracker.open(
            assign.task_id,
            node_id=view.node_id,
            conn_id=view.conn_id,
            owner_instance=view.instance_id,
            deadline=request.deadline,
            owner_incarnation=view.incarnation,
        )
        request.placements += 1
        request.dispatching = True
        # A new placement is unconfirmed until its owner confirms it (an earlier owner's
        # confirmation says nothing of this one).
        request.accepted = False
        envelope = bus_assign_for(assign, view.node_id, view.conn_id, reply_to=self.me)
        return [Dispatch(view.instance_id, envelope, request.placements)]

    def _place_again(
        self, request: Request, why: GemmaNetError, now: float, *, keep_why: bool = False
    ) -> list[Effect]:
        """The last placement never reached a node: take a lease elsewhere (waiting for room
        if need be), or end with an error — that no other node serves the model, or with
        ``keep_why`` the reason it was moved."""
        task_id = request.assign.task_id
        self.tracker.forget(task_id)
        effects = self._give_back_lease(request)
        if now >= request.deadline or request.placements >= MAX_PLACEMENTS:
            return effects + self._fail(task_id, why)
        request.attempt += 1
        if not self.candidates(task_id, request.attempt, now):
            error = why if keep_why else no_node_serves(request.assign.model)
            return effects + self._fail(task_id, error)
        return [*effects, Reserve(task_id, request.attempt)]

    def _serving(self, request: Request, now: float | None) -> list[NodeView]:
        """The nodes that serve the request's model and are not known gone for it."""
        return self._candidates.serving(
            request.assign.model,
            gone_conns=request.gone_conns,
            gone_instances=request.gone_instances,
            now=now,
        )

    def _give_back_lease(self, request: Request) -> list[Effect]:
        """The request goes on elsewhere: its lease only is released."""
        if request.lease is None:
            return []
        lease, request.lease = request.lease, None
        return [ReleaseLease(request.assign.task_id, "", "", lease, request.lease_models)]

    def _close(self, task_id: str) -> list[Effect]:
        """The request is over: forget it and give back everything it holds in the store."""
        request = self._requests.pop(task_id, None)
        if request is None or not (request.lease or request.queued or self._tracks_keys):
            return []
        model = request.assign.model
        wake = set(request.lease_models) | ({model} if request.queued else set())
        return [ReleaseLease(task_id, request.key_id, model, request.lease, tuple(sorted(wake)))]

    def _fail(self, task_id: str, error: GemmaNetError) -> list[Effect]:
        effects = self._close(task_id)
        self.tracker.close(task_id)
        return [*effects, Deliver(task_id, FailedEvent(error))]

    def _dispatching(self, task_id: str, placement: int) -> Request | None:
        """The request whose ``placement``-th assign is on its way (an answer may already have
        overtaken the dispatch's own report and placed the task again)."""
        request = self._requests.get(task_id)
        if request is None or not request.dispatching or request.placements != placement:
            return None
        return request

    def dispatched(self, task_id: str, placement: int) -> list[Effect]:
        """The owner received the assign. If it was declared dead meanwhile, the 502 is due."""
        request = self._dispatching(task_id, placement)
        if request is None:
            return []
        request.dispatching = False
        if request.owner_died_meanwhile:
            task = self.tracker.get(task_id)
            owner = task.owner_instance if task else "?"
            return self._fail(task_id, NodeDisconnected(f"instance {owner} went away"))
        return []

    def unreached(self, task_id: str, placement: int, instance_id: str, now: float) -> list[Effect]:
        """Nobody received the assign (its owner is gone), so no node saw it: place again."""
        request = self._dispatching(task_id, placement)
        if request is None:
            return []
        request.dispatching = request.owner_died_meanwhile = False
        request.gone_instances.add(instance_id)
        why = NodeDisconnected(f"the instances serving model {request.assign.model!r} went away")
        return self._place_again(request, why, now)

    def dispatch_failed(
        self, task_id: str, placement: int, instance_id: str, error: GemmaNetError, now: float
    ) -> list[Effect]:
        """The bus could not be reached: whether the owner got the assign is unknown. Fail the
        request (503) and tell the owner, in case it did, that nobody waits for it."""
        if self._dispatching(task_id, placement) is None:
            return []
        cancel = BusCancel(task_id=task_id, reason="coordination_unavailable")
        return [*self._fail(task_id, error), Publish(instance_id, cancel, now + CANCEL_GIVE_UP_S)]

    # -- answers ----------------------------------------------------------------------------

    def accepted(self, envelope: BusAccepted) -> list[Effect]:
        request = self._requests.get(envelope.task_id)
        task = self.tracker.get(envelope.task_id)
        if request is not None and task is not None and task.conn_id == envelope.conn_id:
            request.accepted = True
        return []

    def chunk(self, envelope: BusChunk, now: float) -> list[Effect]:
        task_id = envelope.task_id
        verdict, deltas = self.tracker.on_chunk(
            task_id, envelope.conn_id, envelope.seq, envelope.delta
        )
        effects: list[Effect] = [Deliver(task_id, ChunkEvent(d)) for d in deltas]
        request = self._requests.get(task_id)
        if verdict is Verdict.ACCEPTED and request is not None:
            request.started = request.accepted = True
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
            and not request.started
            and task is not None
            and task.conn_id == envelope.conn_id
        ):
            # The node turned it down before producing anything: it never ran. Another node
            # may take it; once every node serving the model has turned it down, the client
            # hears so now (503 with Retry-After) rather than at its deadline: a node busy
            # with work the leases do not see would otherwise be offered it again and again.
            request.full.add(envelope.conn_id)
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
        request.dispatching = False
        if envelope.code in BUSY_CODES:
            request.full.add(envelope.conn_id)
        else:
            request.gone_conns.add(envelope.conn_id)
        error = failure_error(envelope.node_id, envelope.code, envelope.message)
        return self._place_again(request, error, now)

    def _finish(self, task_id: str, conn_id: str, event: DoneEvent | FailedEvent) -> list[Effect]:
        task = self.tracker.get(task_id)
        if self.tracker.on_finish(task_id, conn_id) is not Verdict.ACCEPTED:
            return []
        request = self._requests.get(task_id)
        if task is not None and request is not None and request.dispatching:
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
            if request is not None and request.dispatching:
                # Whether the assign reached anybody is not known yet; the dispatch decides.
                request.owner_died_meanwhile = True
                continue
            cancel = BusCancel(task_id=task.task_id, reason="owner_considered_dead")
            effects.append(Publish(task.owner_instance, cancel, now + CANCEL_GIVE_UP_S))
            message = why or f"instance {task.owner_instance} serving node {task.node_id} went away"
            if place_unaccepted and request is not None and not request.accepted:
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
