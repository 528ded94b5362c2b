"""A request's placement attempts: a lease on a node, the assign sent to the node's owner, and
placing it again elsewhere when no node ran it.

Capacity is reserved before a task is sent: each placement asks the shell for a lease
(``Reserve``) on one of the ``candidates``, best first; the shell takes it atomically in the
shared store, or waits in the shared admission queue while no candidate has room, and reports
back (``reserved`` / ``waiting`` / ``reserve_failed``). The assign then goes to the node's owner
(``Dispatch``), and the shell reports whether anybody received it (``dispatched`` /
``unreached`` / ``dispatch_failed``). Whatever a request holds in the store (lease, queue entry,
active-set entry of its API key) is given back when it ends (``ReleaseLease``).

``PlacementAttempts`` keeps the requests and their states (``request_state.py``); the
``Requester`` (``requester.py``) adds what the owners answer and how requests end.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from coordinator.core.effects import (
    Deliver,
    Dispatch,
    Effect,
    FailedEvent,
    MovedEvent,
    Publish,
    ReleaseLease,
    Reserve,
)
from coordinator.core.placement.affinity import PrefixPrediction
from coordinator.core.placement.choose import NodeView
from coordinator.core.requests.candidates import Candidates
from coordinator.core.requests.request_state import Request, RequestState
from coordinator.core.task_content import bus_assign_for
from coordinator.core.tracker import TaskTracker
from coordinator.errors import GemmaNetError, NodeDisconnected, NoNodeForModel
from protocol import Assign, BusCancel

# An upper bound on placements of one task (each one excludes a node, so this only matters
# in a very large network whose nodes all turn the task down).
MAX_PLACEMENTS = 32
# How long a cancel for the owner is retried on the bus (it only saves the node some work).
CANCEL_GIVE_UP_S = 5.0


def no_node_serves(model: str) -> NoNodeForModel:
    return NoNodeForModel(f"no online node serves model {model!r}", retry_after_s=5)


class PlacementAttempts:
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
        named: Callable[[Iterable[str]], list[NodeView]] | None = None,
    ) -> None:
        self.me = instance_id
        # API keys have an active-request limit: every request holds an entry in the store.
        self._tracks_keys = tracks_keys
        self.tracker = TaskTracker()
        self._candidates = Candidates(
            views, rng=rng, host_views=host_views, serves=serves, sample=sample, named=named
        )
        self._requests: dict[str, Request] = {}
        # Where tasks were placed whose answer overtook their own dispatch (it can: the answer
        # comes in on the subscription while the PUBLISH reply is still on its way); their
        # requests read it once, in ``placement``, right after the dispatch returns.
        self._answered_while_dispatching: dict[str, tuple[str, str, str]] = {}

    def __len__(self) -> int:
        return len(self.tracker)

    # -- the lease --------------------------------------------------------------------------

    def submit(
        self,
        assign: Assign,
        deadline: float,
        key_id: str = "",
        now: float | None = None,
        prediction: PrefixPrediction | None = None,
    ) -> list[Effect]:
        """Take a new task: ask for a lease on a node serving its model, its candidates
        ranked with ``prediction`` (which nodes hold how much of its prefix) if given. Raises
        NoNodeForModel when no online node (nor, given ``now``, direct host) serves it
        (refused at once, never queued)."""
        if not self._candidates.any_serves(assign.model, now):
            raise no_node_serves(assign.model)
        request = Request(assign, deadline, key_id=key_id, attempt=1, prediction=prediction)
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
            prediction=request.prediction,
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
        """The request waits in the admission queue (said again at every look while it does),
        or may hold an entry there (an ask went unanswered): either way it is given back at
        the end."""
        request = self._requests.get(task_id)
        if request is not None:
            request.may_hold_queue_entry = True
            request.move(RequestState.QUEUED)

    def may_hold_lease(self, task_id: str, lease_id: str, nodes: Iterable[str]) -> None:
        """An ask that got no answer may have been granted ``lease_id`` on one of ``nodes``:
        the request gives each back when it ends or goes on elsewhere, so a lease nobody heard
        of is not held until its TTL."""
        request = self._requests.get(task_id)
        if request is not None:
            request.maybe_leases.update((node_id, lease_id) for node_id in nodes)

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

    def state_of(self, task_id: str) -> RequestState | None:
        """Where the request is in its lifecycle (None: no such request here, or it ended)."""
        request = self._requests.get(task_id)
        return None if request is None else request.state

    def leases(self) -> list[tuple[str, str]]:
        """Every lease this instance holds, to renew."""
        return [r.lease for r in self._requests.values() if r.lease is not None]

    # -- the placement ----------------------------------------------------------------------

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
        request.report_due = True
        # A new placement is unconfirmed until its owner confirms it (an earlier owner's
        # confirmation says nothing of this one).
        request.move(RequestState.DISPATCHING)
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
        request.move(RequestState.ADMITTING)
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
        """The request goes on elsewhere: its lease only is released (and any it may hold
        unheard of)."""
        maybe = _unheard(request)
        if request.lease is None and not maybe:
            return []
        lease, request.lease = request.lease, None
        request.maybe_leases.clear()
        wake = set(request.lease_models) | ({request.assign.model} if maybe else set())
        task_id = request.assign.task_id
        return [ReleaseLease(task_id, "", "", lease, tuple(sorted(wake)), maybe)]

    def _close(self, task_id: str) -> list[Effect]:
        """The request is over: forget it and give back everything it holds in the store."""
        request = self._requests.pop(task_id, None)
        if request is None:
            return []
        request.move(RequestState.ENDED)
        if not (request.lease or request.may_hold_queue_entry or self._tracks_keys):
            return []
        model = request.assign.model
        wake = set(request.lease_models) | ({model} if request.may_hold_queue_entry else set())
        lease, maybe = request.lease, _unheard(request)
        return [ReleaseLease(task_id, request.key_id, model, lease, tuple(sorted(wake)), maybe)]

    def _fail(self, task_id: str, error: GemmaNetError) -> list[Effect]:
        effects = self._close(task_id)
        self.tracker.close(task_id)
        return [*effects, Deliver(task_id, FailedEvent(error))]

    # -- the dispatch's report --------------------------------------------------------------

    def _dispatching(self, task_id: str, placement: int) -> Request | None:
        """The request whose ``placement``-th assign is on its way (an answer may already have
        overtaken the dispatch's own report and placed the task again)."""
        request = self._requests.get(task_id)
        if request is None or not request.report_due or request.placements != placement:
            return None
        return request

    def awaits_dispatch(self, task_id: str, placement: int) -> bool:
        """Whether the request still waits to hear that its ``placement``-th assign reached the
        owner, with no word from the owner yet (the shell may then send it again)."""
        request = self._dispatching(task_id, placement)
        return request is not None and request.state is RequestState.DISPATCHING

    def dispatched(self, task_id: str, placement: int) -> list[Effect]:
        """The owner received the assign. If it was declared dead meanwhile, the 502 is due."""
        request = self._dispatching(task_id, placement)
        if request is None:
            return []
        request.report_due = False
        if request.owner_died_meanwhile:
            task = self.tracker.get(task_id)
            owner = task.owner_instance if task else "?"
            return self._fail(task_id, NodeDisconnected(f"instance {owner} went away"))
        if request.state is RequestState.DISPATCHING:
            request.move(RequestState.ASSIGNED)  # (an answer that overtook it said more)
        return []

    def unreached(self, task_id: str, placement: int, instance_id: str, now: float) -> list[Effect]:
        """Nobody received the assign (its owner is gone), so no node saw it: place again."""
        request = self._dispatching(task_id, placement)
        if request is None:
            return []
        request.report_due = request.owner_died_meanwhile = False
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


def _unheard(request: Request) -> tuple[tuple[str, str], ...]:
    """The leases the request may hold unheard of, but the one it holds."""
    return tuple(
        sorted(request.maybe_leases - {request.lease} if request.lease else request.maybe_leases)
    )
