"""The drain as pure decisions: the plan's phases on the time it is given (core/drain.py), and
the cluster machines moving a draining instance's nodes (core/owner.py): no new task goes to
them, from here or from a peer, and each is closed with 4004 once its tasks are done."""

from __future__ import annotations

import math

from coordinator.core.drain import ENDING_BOUND_S, Done, DrainPhase, DrainPlan, EndRemaining, Wait
from protocol import CloseCode, Result
from tests.coordinator.machine_harness import MachineCluster
from tests.coordinator.test_cluster_machine import outcome

IDLE = {"requests": 0, "nodes": 0, "releases": 0}


def test_serving_is_ready_and_admits() -> None:
    plan = DrainPlan()
    assert plan.ready and plan.admits
    assert plan.step(5.0, requests=3, nodes=2, releases=1) == Wait(math.inf)


def test_a_drain_refuses_at_once_and_waits_for_what_is_in_flight_until_the_window_ends() -> None:
    plan = DrainPlan()
    plan.begin(100.0, 30.0)
    assert not plan.ready and not plan.admits
    assert plan.step(100.0, requests=2, nodes=1, releases=0) == Wait(130.0)
    assert plan.step(120.0, requests=1, nodes=0, releases=0) == Wait(130.0)
    # Everything ended in time: done, clean, before the window is over.
    assert plan.step(121.0, **IDLE) == Done(clean=True)
    assert plan.phase is DrainPhase.DONE


def test_a_lease_release_still_unanswered_is_waited_for() -> None:
    plan = DrainPlan()
    plan.begin(0.0, 30.0)
    assert plan.step(1.0, requests=0, nodes=0, releases=1) == Wait(30.0)
    assert plan.step(1.1, **IDLE) == Done(clean=True)


def test_past_the_window_what_remains_is_ended_then_given_a_bound_to_go() -> None:
    plan = DrainPlan()
    plan.begin(0.0, 5.0)
    assert plan.step(5.0, requests=2, nodes=1, releases=0) == EndRemaining()
    assert plan.phase is DrainPhase.ENDING
    assert plan.step(5.1, requests=1, nodes=0, releases=1) == Wait(5.0 + ENDING_BOUND_S)
    assert plan.step(5.2, requests=0, nodes=0, releases=0) == Done(clean=False)


def test_requests_that_never_end_are_left_after_the_bound() -> None:
    plan = DrainPlan()
    plan.begin(0.0, 1.0)
    assert plan.step(1.0, requests=1, nodes=0, releases=0) == EndRemaining()
    assert plan.step(1.0 + ENDING_BOUND_S, requests=1, nodes=0, releases=0) == Done(clean=False)


def test_a_second_signal_ends_the_window_now() -> None:
    plan = DrainPlan()
    plan.begin(0.0, 30.0)
    plan.begin(2.0, 30.0)  # the second SIGTERM
    assert plan.deadline == 2.0
    assert plan.step(2.0, requests=1, nodes=0, releases=0) == EndRemaining()
    hurried = DrainPlan()
    hurried.hurry(7.0)  # SIGINT first: a drain with no window
    assert not hurried.admits and hurried.deadline == 7.0
    assert hurried.step(7.0, **IDLE) == Done(clean=True)


def test_a_negative_window_is_no_window() -> None:
    plan = DrainPlan()
    plan.begin(3.0, -1.0)
    assert plan.deadline == 3.0


def test_a_draining_instance_moves_each_node_once_idle_and_places_nothing_more_on_it() -> None:
    cluster = MachineCluster("A", "B")
    busy = cluster.connect("A", "busy", max_parallel=4)
    idle = cluster.connect("A", "idle", max_parallel=4, models=("other",))
    cluster.submit("B", "t1")  # on A's only node of model m, for B's client
    cluster.deliver()
    assert "t1" in busy.running
    a = cluster.machines["A"]
    cluster.apply("A", a.move_nodes(cluster.now))
    # The idle node moves at once; the busy one keeps its task.
    assert idle.closed_with == CloseCode.MOVE and busy.closed_with is None
    cluster.share_snapshots()
    # B still sees A's node serve the model (it is about to be back elsewhere), but no lease
    # is granted on it: B's new request looks again instead of hearing "no node serves it",
    # and runs on the first node that comes up.
    cluster.submit("B", "t2")
    cluster.deliver()
    assert list(busy.running) == ["t1"] and outcome(cluster, "t2") == []
    elsewhere = cluster.connect("B", "elsewhere", max_parallel=4)
    cluster.tick(0.3)
    cluster.deliver()
    assert "t2" in elsewhere.running
    # Its last task done, the busy node is told to move too; the answer reached B first.
    cluster.node_says(busy.conn_id, Result(task_id="t1", output="p", chunks=0))
    assert busy.closed_with == CloseCode.MOVE
    cluster.deliver()
    assert outcome(cluster, "t1") == [("done", "p")]


def test_a_placement_from_a_view_older_than_the_drain_goes_elsewhere() -> None:
    cluster = MachineCluster("A", "B")
    on_a = cluster.connect("A", "on-a", max_parallel=4)
    on_b = cluster.connect("B", "on-b", max_parallel=4)
    a = cluster.machines["A"]
    cluster.apply("A", a.move_nodes(cluster.now))
    assert on_a.closed_with == CloseCode.MOVE  # idle: moved at once
    # B has not read A's new snapshot yet; whatever it sends A for on-a is refused as
    # node_draining, a busy code: placed on B's node instead, never failed.
    for n in range(6):
        cluster.submit("B", f"t{n}")
        cluster.deliver()
    assert not on_a.running
    assert sorted(on_b.running) == [f"t{n}" for n in range(4)]


def test_a_node_may_move_with_its_tasks_when_the_window_is_over() -> None:
    cluster = MachineCluster("A")
    node = cluster.connect("A", "n1")
    cluster.submit("A", "t1")
    machine = cluster.machines["A"]
    cluster.apply("A", machine.move_nodes(cluster.now))
    assert node.closed_with is None
    cluster.apply("A", machine.move_nodes(cluster.now, at_once=True))
    assert node.closed_with == CloseCode.MOVE


def test_after_its_nodes_moved_it_stays_until_peers_have_read_where_they_went() -> None:
    plan = DrainPlan()
    plan.begin(0.0, 30.0, settle_s=1.0)
    assert plan.step(0.0, requests=0, nodes=3, releases=0) == Wait(30.0)
    assert plan.step(0.2, **IDLE) == Wait(1.2)  # the last node just moved
    assert plan.step(1.2, **IDLE) == Done(clean=True)
    # With no node to move there is nothing to wait for; nor past the window.
    bare = DrainPlan()
    bare.begin(0.0, 30.0, settle_s=1.0)
    assert bare.step(0.1, **IDLE) == Done(clean=True)
    late = DrainPlan()
    late.begin(0.0, 0.5, settle_s=1.0)
    late.step(0.0, requests=0, nodes=1, releases=0)
    assert late.step(0.4, **IDLE) == Wait(0.5)
    assert late.step(0.5, **IDLE) == Done(clean=True)


def test_a_moved_node_stays_listed_as_serving_its_model_until_the_instance_leaves() -> None:
    """The gap between a node leaving a draining instance and a peer reading its new one: the
    peer still sees the model served (by a moving node, no lease on it), so it looks again
    rather than answering no_node_for_model."""
    cluster = MachineCluster("A", "B")
    node = cluster.connect("A", "n1")
    a = cluster.machines["A"]
    cluster.apply("A", a.move_nodes(cluster.now))
    assert node.closed_with == CloseCode.MOVE
    cluster.apply("A", a.node_disconnected(node.conn_id, "moved", cluster.now))
    cluster.share_snapshots()
    [entry] = a.snapshot().nodes
    assert entry.node_id == "n1" and entry.models == ["m"]
    cluster.submit("B", "t1")  # no NoNodeForModel: it waits for the node to come back
    back = cluster.connect("B", "n1-again")
    cluster.tick(0.3)
    cluster.deliver()
    assert "t1" in back.running
