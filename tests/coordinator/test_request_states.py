"""A request's lifecycle (coordinator/core/requests/request_state.py): the transition table, and
a requester driven through random interleavings of everything that can happen to its requests.

The table is checked on every move the product makes (``Request.move`` raises on any other), so
every test that runs a requester — the cluster machine tests, the model test, the simulator —
also checks that each transition it takes is in the table. Here: every pair outside the table
raises; whatever the shell reports and the peers say, in any order and however contradictory,
the requester never makes an illegal move and its record stays consistent with its state; and
every move in the table is one such runs actually take (no entry is dead)."""

from __future__ import annotations

import itertools
import random
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.effects import Deliver, Dispatch, DoneEvent, Effect, FailedEvent, Reserve
from coordinator.core.placement.choose import NodeView
from coordinator.core.requests.request_state import (
    PLACED,
    TRANSITIONS,
    IllegalTransition,
    Request,
    RequestState,
    check_transition,
)
from coordinator.core.requests.requester import Requester
from coordinator.errors import CoordinationDown
from protocol import (
    Assign,
    BusAccepted,
    BusChunk,
    BusNodeGone,
    BusRefused,
    BusResult,
    TaskErrorCode,
    TaskFailure,
)

S = RequestState
ME = "R"
#: three owners (this instance among them) and a spare connection nobody assigned
NODES = [
    NodeView(
        node_id=f"n{i}",
        instance_id=owner,
        conn_id=f"c{i}",
        models=frozenset({"m"}),
        max_parallel=2,
        in_flight=0,
        incarnation="life-1",
    )
    for i, owner in enumerate([ME, "A", "A", "B"])
]


# -- the table --------------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), list(itertools.product(S, S)))
def test_a_move_outside_the_table_raises(old: RequestState, new: RequestState) -> None:
    if new is old or new in TRANSITIONS[old]:
        check_transition(old, new)
    else:
        with pytest.raises(IllegalTransition, match=f"from {old.name} to {new.name}"):
            check_transition(old, new)


def test_every_state_lies_on_a_way_from_admitting_to_ended() -> None:
    def reachable(start: RequestState, edges: dict[RequestState, set[RequestState]]) -> set[S]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), set()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    forward = {old: set(new) for old, new in TRANSITIONS.items()}
    backward: dict[RequestState, set[RequestState]] = {}
    for old, targets in TRANSITIONS.items():
        for new in targets:
            backward.setdefault(new, set()).add(old)
    assert reachable(S.ADMITTING, forward) == set(S)
    assert reachable(S.ENDED, backward) == set(S)
    assert TRANSITIONS[S.ENDED] == frozenset()


# -- a requester under everything at once -----------------------------------------------------


class Driver:
    """Plays the shell, the peers and the clock around one ``Requester`` at random: every report
    the shell may give (late ones, for attempts and placements long gone, too) and every answer
    an owner may send, for the connection the task is on or another one, in any order."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now = 0.0
        self.requester = Requester(ME, views=lambda: list(NODES), rng=random.Random(0))
        self.count = 0
        self.reserves: list[tuple[str, int]] = []  # Reserve effects not yet reported on
        self.dispatches: list[tuple[str, int, str]] = []  # Dispatch effects likewise
        self.seqs: dict[str, int] = {}
        self.ends: dict[str, int] = {}

    def apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Reserve):
                self.reserves.append((effect.task_id, effect.attempt))
            elif isinstance(effect, Dispatch):
                task_id = effect.envelope.task_id
                self.dispatches.append((task_id, effect.placement, effect.target))
            elif isinstance(effect, Deliver) and isinstance(effect.event, DoneEvent | FailedEvent):
                self.ends[effect.task_id] = self.ends.get(effect.task_id, 0) + 1

    def live(self) -> list[str]:
        return sorted(self.requester._requests)

    def placed(self) -> list[str]:
        return sorted(t.task_id for t in self.requester.tracker.pending())

    def step(self) -> None:
        rng, r = self.rng, self.requester
        actions = ["submit", "tick", "owners"]
        actions += ["lease"] * 3 * bool(self.reserves)
        actions += ["report"] * 3 * bool(self.dispatches)
        actions += ["answer"] * 6 * bool(self.placed())
        actions += ["end"] * bool(self.live())
        action = rng.choice(actions)
        if action == "submit":
            self.count += 1
            assign = Assign(task_id=f"t{self.count}", model="m", prompt="p")
            self.apply(r.submit(assign, deadline=self.now + rng.choice([5.0, 30.0])))
        elif action == "tick":
            self.now += rng.choice([0.5, 3.0, 11.0])
            self.apply(r.tick(self.now))
        elif action == "owners":
            self.owners_event()
        elif action == "lease":
            self.lease_event()
        elif action == "report":
            self.report_event()
        elif action == "answer":
            self.answer_event()
        else:
            self.apply(r.ended(rng.choice(self.live()), "client_gone", self.now))

    def lease_event(self) -> None:
        rng, r = self.rng, self.requester
        ticket = rng.choice(self.reserves)
        task_id, attempt = ticket
        candidates = r.candidates(task_id, attempt, self.now)
        kind = rng.choice(["queued", "queued", "granted", "granted", "failed"])
        if kind == "queued" and candidates is not None:
            r.waiting(task_id)  # the admission of this ticket is still under way
            return
        self.reserves.remove(ticket)
        if kind == "failed" or candidates == []:
            error = CoordinationDown("no lease")
            self.apply(r.reserve_failed(task_id, attempt, error))
        else:
            # A late grant (the request moved on or ended meanwhile) is given back.
            view = rng.choice(candidates or NODES)
            self.apply(r.reserved(task_id, attempt, view, f"{task_id}.{attempt}"))

    def report_event(self) -> None:
        rng, r = self.rng, self.requester
        task_id, placement, target = report = rng.choice(self.dispatches)
        self.dispatches.remove(report)
        kind = rng.choice(["dispatched", "dispatched", "unreached", "failed"])
        if kind == "dispatched":
            self.apply(r.dispatched(task_id, placement))
        elif kind == "unreached":
            self.apply(r.unreached(task_id, placement, target, self.now))
        else:
            error = CoordinationDown("bus down")
            self.apply(r.dispatch_failed(task_id, placement, target, error, self.now))

    def answer_event(self) -> None:
        rng, r = self.rng, self.requester
        task_id = rng.choice(self.placed())
        task = r.tracker.get(task_id)
        assert task is not None
        conn = task.conn_id if rng.random() < 0.85 else rng.choice(NODES).conn_id
        kind = rng.choice(["accepted", "chunk", "chunk", "done", "busy", "failed", "gone"])
        kind = rng.choice([kind, kind, "refused_busy", "refused_gone"])
        node = task.node_id
        if kind == "accepted":
            self.apply(r.accepted(BusAccepted(task_id=task_id, conn_id=conn)))
        elif kind == "chunk":
            seq = self.seqs.get(task_id, 0)
            self.seqs[task_id] = seq + 1
            envelope = BusChunk(task_id=task_id, conn_id=conn, seq=seq, delta="x")
            self.apply(r.chunk(envelope, self.now))
        elif kind == "done":
            self.apply(r.result(BusResult(task_id=task_id, node_id=node, conn_id=conn), self.now))
        elif kind in ("busy", "failed"):
            code = TaskErrorCode.ALL_NODES_BUSY if kind == "busy" else "boom"
            failure = TaskFailure(code=code, message="no")
            result = BusResult(task_id=task_id, node_id=node, conn_id=conn, failure=failure)
            self.apply(r.result(result, self.now))
        elif kind == "gone":
            self.apply(r.node_gone(BusNodeGone(task_id=task_id, node_id=node, conn_id=conn)))
        else:
            code = TaskErrorCode.ALL_NODES_BUSY if kind == "refused_busy" else "node_disconnected"
            refusal = BusRefused(task_id=task_id, node_id=node, conn_id=conn, code=code, message="")
            self.apply(r.refused(refusal, self.now))

    def owners_event(self) -> None:
        rng, r = self.rng, self.requester
        kind = rng.choice(["dead", "dead", "reborn", "bus_lost"])
        if kind == "dead":
            dead = set(rng.sample(["A", "B"], rng.randint(1, 2)))
            self.apply(r.owners_dead(dead, self.now))
        elif kind == "reborn":
            self.apply(r.owners_reborn({rng.choice(["A", "B"]): "life-2"}, self.now))
        else:
            self.apply(r.remote_tasks_lost(self.now))

    def check(self) -> None:
        """The record agrees with its state, and no task ends twice."""
        pending = {t.task_id for t in self.requester.tracker.pending()}
        for task_id, request in self.requester._requests.items():
            placed = request.state in PLACED
            assert request.state is not S.ENDED, task_id
            assert (request.lease is not None) == placed, (task_id, request)
            assert (task_id in pending) == placed, (task_id, request)
            if request.state is S.DISPATCHING:
                assert request.report_due, request
            if request.state is S.ASSIGNED:
                assert not request.report_due, request
        assert pending <= set(self.requester._requests)
        assert all(n == 1 for n in self.ends.values()), self.ends


def drive(rng: random.Random, steps: int) -> None:
    driver = Driver(rng)
    for _ in range(steps):
        driver.step()
        driver.check()


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False))
def test_no_interleaving_makes_an_illegal_move(rng: random.Random) -> None:
    drive(rng, 80)


def late_report_while_queued() -> Requester:
    """The placement's node turned the task down as busy before the dispatch reported back,
    so the request waits for the lease of its next attempt when the report comes: the assign
    reached nobody. That still counts (as it did when the lifecycle was booleans): another
    attempt starts (the admission of the one before leaves, its ``candidates`` being None)."""
    r = Requester(ME, views=lambda: list(NODES), rng=random.Random(0))
    r.submit(Assign(task_id="t1", model="m", prompt="p"), deadline=100.0)
    [dispatch] = r.reserved("t1", 1, NODES[1], "t1.1")
    assert isinstance(dispatch, Dispatch) and r.state_of("t1") is S.DISPATCHING
    busy = TaskFailure(code=TaskErrorCode.ALL_NODES_BUSY, message="full")
    r.result(BusResult(task_id="t1", node_id="n1", conn_id="c1", failure=busy), 1.0)
    r.waiting("t1")
    assert r.state_of("t1") is S.QUEUED
    effects = r.unreached("t1", dispatch.placement, "A", 2.0)
    assert effects == [Reserve("t1", 3)] and r.state_of("t1") is S.ADMITTING
    assert r.candidates("t1", 2) is None
    return r


def test_a_late_report_of_a_placement_answered_as_busy_still_counts() -> None:
    late_report_while_queued()


def test_every_move_in_the_table_is_taken() -> None:
    taken: set[tuple[RequestState, RequestState]] = set()
    original = Request.move

    def recording(self: Request, new: RequestState) -> None:
        if new is not self.state:
            taken.add((self.state, new))
        original(self, new)

    with mock.patch.object(Request, "move", recording):
        for seed in range(200):
            drive(random.Random(seed), 80)
        late_report_while_queued()  # a rare interleaving: it took a thousand seeds
    table = {(old, new) for old, targets in TRANSITIONS.items() for new in targets}
    assert taken == table, (sorted(table - taken), sorted(taken - table))
