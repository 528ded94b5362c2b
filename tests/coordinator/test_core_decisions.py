"""The pure core: placement, task tracking, the node table."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.core.placement.choose import NodeView, choose_node
from coordinator.core.tracker import TaskTracker, Verdict
from coordinator.errors import AllNodesBusy, NoNodeForModel
from protocol import TaskErrorCode


def view(node_id: str, *, models=("m",), in_flight=0, max_parallel=2, rating=None) -> NodeView:
    return NodeView(
        node_id=node_id,
        instance_id="i",
        conn_id=f"c-{node_id}",
        models=frozenset(models),
        max_parallel=max_parallel,
        in_flight=in_flight,
        rating=rating,
    )


# -- placement -------------------------------------------------------------------------------


def test_unserved_model_is_refused_not_queued() -> None:
    with pytest.raises(NoNodeForModel) as info:
        choose_node([view("a", models=("other",))], "m")
    assert info.value.status == 503 and info.value.code == "no_node_for_model"


def test_all_busy_is_a_503_with_its_own_code() -> None:
    with pytest.raises(AllNodesBusy) as info:
        choose_node([view("a", in_flight=2, max_parallel=2)], "m")
    assert info.value.status == 503 and info.value.code == TaskErrorCode.ALL_NODES_BUSY


def test_fewest_in_flight_wins_over_rating() -> None:
    nodes = [view("a", in_flight=1, rating=5.0), view("b", in_flight=0, rating=1.0)]
    assert choose_node(nodes, "m").node_id == "b"


def test_rating_breaks_ties_and_unrated_is_neutral() -> None:
    nodes = [view("a", rating=2.0), view("b"), view("c", rating=4.5)]
    assert choose_node(nodes, "m").node_id == "c"
    assert choose_node([view("a", rating=2.0), view("b")], "m").node_id == "b"


def test_full_node_is_skipped() -> None:
    nodes = [view("a", in_flight=1, max_parallel=1), view("b", in_flight=1, max_parallel=4)]
    assert choose_node(nodes, "m").node_id == "b"


def test_ties_spread_with_rng_and_are_deterministic_without() -> None:
    nodes = [view(n) for n in "abcd"]
    assert {choose_node(nodes, "m").node_id for _ in range(20)} == {"a"}
    rng = random.Random(7)
    assert len({choose_node(nodes, "m", rng=rng).node_id for _ in range(50)}) == 4


@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 4), st.none() | st.floats(1, 5)),
        min_size=1,
        max_size=8,
    )
)
@settings(max_examples=200, deadline=None)
def test_choice_always_has_capacity_and_minimal_load(specs) -> None:
    nodes = [
        view(f"n{i}", in_flight=min(f, p), max_parallel=p, rating=r)
        for i, (f, p, r) in enumerate(specs)
    ]
    free = [n for n in nodes if n.in_flight < n.max_parallel]
    if not free:
        with pytest.raises(AllNodesBusy):
            choose_node(nodes, "m")
        return
    chosen = choose_node(nodes, "m")
    assert chosen.has_capacity
    assert chosen.in_flight == min(n.in_flight for n in free)


# -- tracker ---------------------------------------------------------------------------------


def tracker_with(task_id="t1", conn_id="c1", owner="i1", deadline=10.0) -> TaskTracker:
    tracker = TaskTracker()
    tracker.open(task_id, node_id="n1", conn_id=conn_id, owner_instance=owner, deadline=deadline)
    return tracker


def test_only_the_assigned_connection_may_answer() -> None:
    tracker = tracker_with()
    assert tracker.on_chunk("t1", "c-other", 0, "x") == (Verdict.WRONG_SOURCE, [])
    assert tracker.on_finish("t1", "c-other") is Verdict.WRONG_SOURCE
    assert "t1" in tracker
    assert tracker.on_finish("t1", "c1") is Verdict.ACCEPTED
    assert tracker.dropped[Verdict.WRONG_SOURCE] == 2


def test_replayed_chunks_and_late_results_are_dropped() -> None:
    tracker = tracker_with()
    assert tracker.on_chunk("t1", "c1", 0, "a") == (Verdict.ACCEPTED, ["a"])
    assert tracker.on_chunk("t1", "c1", 0, "a") == (Verdict.DUPLICATE, [])
    assert tracker.on_finish("t1", "c1") is Verdict.ACCEPTED
    assert tracker.on_finish("t1", "c1") is Verdict.DUPLICATE
    assert tracker.on_chunk("t1", "c1", 1, "b") == (Verdict.DUPLICATE, [])
    assert tracker.on_finish("never", "c1") is Verdict.UNKNOWN_TASK


def test_reordered_chunks_are_delivered_in_order() -> None:
    tracker = tracker_with()
    assert tracker.on_chunk("t1", "c1", 2, "c") == (Verdict.ACCEPTED, [])
    assert tracker.on_chunk("t1", "c1", 1, "b") == (Verdict.ACCEPTED, [])
    assert tracker.on_chunk("t1", "c1", 0, "a") == (Verdict.ACCEPTED, ["a", "b", "c"])


@given(st.permutations(list(range(12))))
def test_any_order_of_chunks_reassembles_exactly(order) -> None:
    tracker = tracker_with()
    delivered: list[str] = []
    for seq in order:
        delivered += tracker.on_chunk("t1", "c1", seq, f"<{seq}>")[1]
    assert delivered == [f"<{i}>" for i in range(12)]


def test_connection_loss_fails_only_its_tasks() -> None:
    tracker = TaskTracker()
    tracker.open("t1", node_id="n1", conn_id="c1", owner_instance="i", deadline=9)
    tracker.open("t2", node_id="n2", conn_id="c2", owner_instance="i", deadline=9)
    assert [t.task_id for t in tracker.fail_connection("c1")] == ["t1"]
    assert "t2" in tracker and "t1" not in tracker


def test_dead_owners_and_deadlines() -> None:
    tracker = TaskTracker()
    tracker.open("t1", node_id="n1", conn_id="c1", owner_instance="A", deadline=5)
    tracker.open("t2", node_id="n2", conn_id="c2", owner_instance="B", deadline=50)
    assert [t.task_id for t in tracker.fail_tasks_of_dead_owners({"B"})] == ["t1"]
    assert tracker.expired(49.9) == []
    assert [t.task_id for t in tracker.expired(50)] == ["t2"]


def test_task_ids_cannot_be_reused() -> None:
    tracker = tracker_with()
    tracker.close("t1")
    with pytest.raises(ValueError):
        tracker.open("t1", node_id="n", conn_id="c", owner_instance="i", deadline=1)


# -- node table ------------------------------------------------------------------------------


def conn(conn_id: str, node_id: str, last_seen: float = 0.0) -> NodeConnection:
    return NodeConnection(
        conn_id=conn_id,
        node_id=node_id,
        models=frozenset({"m"}),
        max_parallel=1,
        vram_gb=None,
        agent_version="t",
        connected_at=0.0,
        last_seen=last_seen,
    )


def test_second_connection_replaces_first_and_old_unregister_is_harmless() -> None:
    table = NodeTable()
    first, second = conn("c1", "n"), conn("c2", "n")
    assert table.register(first) is None
    assert table.register(second) is first
    table.unregister("c1")  # the old socket's cleanup must not remove the new connection
    assert table.by_node("n") is second and len(table) == 1


def test_silent_connections_are_found() -> None:
    table = NodeTable()
    table.register(conn("c1", "a", last_seen=0.0))
    table.register(conn("c2", "b", last_seen=0.0))
    table.touch("c2", 5.0)
    assert [c.conn_id for c in table.silent(now=6.5, deadline_s=6.0)] == ["c1"]


def test_a_connection_told_a_longer_interval_may_be_silent_longer_never_shorter() -> None:
    table = NodeTable()
    table.register(first := conn("c1", "a", last_seen=0.0))
    table.lengthen_silence(first, 9.0)
    assert table.silent(now=8.0, deadline_s=6.0) == []
    table.lengthen_silence(first, 3.0)  # a shorter one is not taken: the scan plans on that
    assert first.silent_after_s == 9.0
    assert [c.conn_id for c in table.silent(now=9.5, deadline_s=6.0)] == ["c1"]


# -- a restarted owner is a new life -----------------------------------------------------------


def test_a_restarted_owner_is_a_dead_owner_for_tasks_placed_on_its_previous_life() -> None:
    from dataclasses import replace

    from coordinator.core.effects import Deliver, FailedEvent
    from coordinator.core.requests.requester import Requester
    from protocol import Assign, BusAccepted

    on_a = replace(view("n1"), instance_id="A", incarnation="life-1")
    requester = Requester("B", views=lambda: [on_a], rng=None)
    requester.submit(Assign(task_id="t1", model="m", prompt="p"), deadline=100.0)
    requester.reserved("t1", 1, on_a, "lease-1")
    requester.dispatched("t1", 1)
    requester.accepted(BusAccepted(task_id="t1", conn_id="c-n1"))
    # the same life, a peer this task does not depend on, an unknown life: nothing ends
    assert requester.owners_reborn({"A": "life-1", "C": "x"}, now=1.0) == []
    assert requester.owners_reborn({}, now=1.0) == []
    # A was restarted with the same id: the task was lost with its first life
    effects = requester.owners_reborn({"A": "life-2"}, now=2.0)
    [failed] = [e for e in effects if isinstance(e, Deliver)]
    assert isinstance(failed.event, FailedEvent) and failed.event.error.status == 502
    assert "t1" not in requester.tracker
