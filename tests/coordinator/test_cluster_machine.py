"""The cluster protocol as pure machines: event sequences in, effects out (no trio, no Redis).

The harness (machine_harness.py) plays the bus, the nodes and the clock."""

from __future__ import annotations

import pytest

from coordinator.core.effects import ChunkEvent, DoneEvent, FailedEvent, MovedEvent
from coordinator.core.tracker import MAX_STREAMED_CHARS
from coordinator.errors import AllNodesBusy, NodeDisconnected, NoNodeForModel, TaskTimedOut
from protocol import Chunk, Error, Heartbeat, Result
from tests.coordinator.machine_harness import MachineCluster


def outcome(cluster: MachineCluster, task_id: str) -> list[object]:
    """What the request saw, simplified: ('chunk', d) / ('done', out) / ('failed', code) / ('moved', node)."""
    seen: list[object] = []
    for event in cluster.events[task_id]:
        if isinstance(event, ChunkEvent):
            seen.append(("chunk", event.delta))
        elif isinstance(event, DoneEvent):
            seen.append(("done", event.output))
        elif isinstance(event, FailedEvent):
            seen.append(("failed", event.error.code))
        elif isinstance(event, MovedEvent):
            seen.append(("moved", event.node_id))
    return seen


# -- one instance: the same machine with no peers ------------------------------------------------


def test_single_instance_runs_a_task_on_its_own_node_without_any_bus_traffic() -> None:
    cluster = MachineCluster("A")
    node = cluster.connect("A", "n1")
    cluster.submit("A", "t1", prompt="hello")
    assert node.running["t1"].prompt == "hello"
    cluster.node_says(node.conn_id, Chunk(task_id="t1", seq=0, delta="hel"))
    cluster.node_says(node.conn_id, Result(task_id="t1", output="hello", chunks=1))
    assert outcome(cluster, "t1") == [("chunk", "hel"), ("done", "hello")]
    assert not cluster.in_flight and not cluster.unreached_publishes
    assert cluster.machines["A"].owner.nodes.by_conn(node.conn_id).in_flight == 0


def test_only_the_assigned_connection_may_answer_and_replays_are_dropped() -> None:
    cluster = MachineCluster("A")
    good = cluster.connect("A", "n1", max_parallel=1)
    forger = cluster.connect("A", "n2", models=("other",))
    cluster.submit("A", "t1")
    cluster.node_says(forger.conn_id, Result(task_id="t1", output="forged"))
    cluster.node_says(forger.conn_id, Chunk(task_id="t1", seq=0, delta="forged"))
    cluster.node_says(good.conn_id, Chunk(task_id="t1", seq=0, delta="a"))
    cluster.node_says(good.conn_id, Chunk(task_id="t1", seq=0, delta="a"))  # replayed
    cluster.node_says(good.conn_id, Result(task_id="t1", output="a", chunks=1))
    cluster.node_says(good.conn_id, Result(task_id="t1", output="again", chunks=1))
    assert outcome(cluster, "t1") == [("chunk", "a"), ("done", "a")]
    dropped = cluster.machines["A"].dropped_answers()
    assert dropped["wrong_source"] == 2 and dropped["duplicate"] == 2


def test_a_node_that_disconnects_fails_its_tasks_at_once() -> None:
    cluster = MachineCluster("A")
    node = cluster.connect("A", "n1")
    cluster.submit("A", "t1")
    cluster.apply("A", cluster.machines["A"].node_disconnected(node.conn_id, "disconnected", 0.0))
    assert outcome(cluster, "t1") == [("failed", "node_disconnected")]


def test_the_client_leaving_cancels_the_task_on_its_node() -> None:
    cluster = MachineCluster("A")
    node = cluster.connect("A", "n1")
    cluster.submit("A", "t1")
    cluster.ended("A", "t1", "client_gone")
    assert node.cancelled == ["t1"] and not node.running
    assert cluster.machines["A"].owner.nodes.by_conn(node.conn_id).in_flight == 0


def test_a_task_past_its_deadline_fails_504_and_stops_on_its_node() -> None:
    cluster = MachineCluster("A")
    node = cluster.connect("A", "n1")
    cluster.submit("A", "t1", timeout_s=2.0)
    cluster.tick(1.0)
    assert outcome(cluster, "t1") == []
    cluster.tick(1.5)
    assert outcome(cluster, "t1") == [("failed", TaskTimedOut.code)]
    assert node.cancelled == ["t1"]


def test_a_silent_node_is_closed_with_4003_and_its_task_fails() -> None:
    cluster = MachineCluster("A")
    quiet = cluster.connect("A", "n1")
    cluster.submit("A", "t1")
    chatty = cluster.connect("A", "n2")
    cluster.tick(4.0)
    cluster.node_says(chatty.conn_id, Heartbeat())
    cluster.tick(3.0)  # no silence deadline: the shell was frozen, nobody is judged
    assert quiet.closed_with is None
    cluster.tick(0.1, silence_deadline_s=6.0)
    assert quiet.closed_with == 4003 and chatty.closed_with is None
    assert outcome(cluster, "t1") == [("failed", NodeDisconnected.code)]


def test_unserved_model_is_refused_at_submit_and_leaves_nothing_behind() -> None:
    cluster = MachineCluster("A")
    cluster.connect("A", "n1", models=("other",))
    with pytest.raises(NoNodeForModel):
        cluster.submit("A", "t1")
    assert len(cluster.machines["A"].requester) == 0


# -- across instances ----------------------------------------------------------------------------


def test_a_request_on_b_runs_on_a_node_of_a_and_streams_back_in_order() -> None:
    cluster = MachineCluster("A", "B")
    node = cluster.connect("A", "n1")
    cluster.submit("B", "t1", prompt="xyz")
    cluster.deliver()
    assert node.running["t1"].prompt == "xyz"
    for seq, delta in enumerate("xyz"):
        cluster.node_says(node.conn_id, Chunk(task_id="t1", seq=seq, delta=delta))
    cluster.node_says(node.conn_id, Result(task_id="t1", output="xyz", chunks=3))
    cluster.deliver()
    assert outcome(cluster, "t1") == [
        ("chunk", "x"),
        ("chunk", "y"),
        ("chunk", "z"),
        ("done", "xyz"),
    ]
    assert len(cluster.machines["A"].owner.forwarding) == 0


def test_a_stale_view_refused_by_the_owner_is_placed_on_another_node_not_503() -> None:
    cluster = MachineCluster("A", "B", "C")
    full = cluster.connect("A", "busy", models=("m", "x"), max_parallel=1)
    spare = cluster.connect("C", "spare", max_parallel=1)
    # A's own client fills its node after B read A's snapshot: B's view is stale.
    cluster.submit("A", "local", model="x")
    assert "local" in full.running
    b = cluster.machines["B"]
    b.set_peers([cluster.machines["A"].owner.snapshot(0), cluster.machines["C"].snapshot()])
    # Both look free to B; whichever it picks first, the task must end up running.
    cluster.submit("B", "t1")
    cluster.deliver()
    cluster.deliver()
    assert "t1" in spare.running
    if ("moved", "spare") in outcome(cluster, "t1"):
        assert len(full.running) == 1  # the refusal never reached the full node
    cluster.node_says(spare.conn_id, Result(task_id="t1", output="ok"))
    cluster.deliver()
    assert outcome(cluster, "t1")[-1] == ("done", "ok")


def test_a_stale_view_never_overcommits_a_node_the_request_waits_for_its_lease() -> None:
    cluster = MachineCluster("A", "B")
    full = cluster.connect("A", "busy", max_parallel=1)
    stale = cluster.machines["A"].snapshot()
    cluster.submit("A", "local")
    assert "local" in full.running
    cluster.machines["B"].set_peers([stale])  # B sees the node free
    cluster.submit("B", "t1")
    cluster.deliver()
    # The lease, not B's view, decides: t1 waits in the queue, nothing reached the node.
    assert outcome(cluster, "t1") == [] and list(full.running) == ["local"]
    assert [e.task_id for _, e, _ in cluster.waiting] == ["t1"]
    cluster.node_says(full.conn_id, Result(task_id="local", output="ok"))
    cluster.ended("A", "local")
    cluster.deliver()
    assert list(full.running) == ["t1"]  # placed as soon as the lease was released


def test_a_node_busy_answer_before_any_output_is_placed_again() -> None:
    cluster = MachineCluster("A")
    first = cluster.connect("A", "n1", max_parallel=4)
    second = cluster.connect("A", "n2", max_parallel=4)
    cluster.submit("A", "t1")
    where = first if "t1" in first.running else second
    other = second if where is first else first
    cluster.node_says(where.conn_id, Error(task_id="t1", code="node_draining", message="bye"))
    assert "t1" in other.running
    assert outcome(cluster, "t1") == [("moved", other.node_id)]
    # After output began, a failure is the task's failure, not a reason to move it.
    cluster.node_says(other.conn_id, Chunk(task_id="t1", seq=0, delta="a"))
    cluster.node_says(other.conn_id, Error(task_id="t1", code="node_busy", message="x"))
    assert outcome(cluster, "t1")[-1] == ("failed", AllNodesBusy.code)


def test_an_assign_that_reaches_nobody_is_placed_on_a_live_instance() -> None:
    cluster = MachineCluster("A", "B", "C")
    cluster.connect("A", "gone", max_parallel=8)
    live = cluster.connect("C", "live", max_parallel=1)
    cluster.machines["B"].set_ratings({"gone": (5.0, 10)})  # B prefers A's node
    cluster.kill("A")  # B still has A's snapshot
    cluster.submit("B", "t0")
    cluster.deliver()
    assert "t0" in live.running and outcome(cluster, "t0") == [("moved", "live")]
    cluster.submit("B", "t1")  # A's node is forgotten; C's only node is busy: t1 waits
    cluster.deliver()
    assert list(live.running) == ["t0"] and [e.task_id for _, e, _ in cluster.waiting] == ["t1"]


def test_owner_killed_fails_its_tasks_on_the_next_judgement_and_tells_it_to_stop() -> None:
    cluster = MachineCluster("A", "B")
    node = cluster.connect("A", "n1")
    cluster.submit("B", "t1")
    cluster.deliver()
    assert "t1" in node.running
    cluster.kill("A")
    assert outcome(cluster, "t1") == []
    cluster.judge()
    assert outcome(cluster, "t1") == [("failed", NodeDisconnected.code)]
    # B also told A (in case it was only frozen) to stop the task.
    assert any(
        t == "A" and getattr(e, "task_id", None) == "t1" for t, e in cluster.unreached_publishes
    )


def test_owner_declared_dead_while_its_assign_is_in_flight_waits_for_the_dispatch() -> None:
    cluster = MachineCluster("A", "B", "C")
    cluster.connect("A", "n1")
    b = cluster.machines["B"]
    effects = b.submit(
        __import__("protocol").Assign(task_id="t1", model="m", prompt="p", timeout_s=10), 10.0, 0.0
    )
    (reserve,) = effects
    (dispatch,) = cluster.granted("B", reserve)
    cluster.events["t1"] = []
    cluster.apply("B", b.peers_dead({"A"}, 0.0))
    assert cluster.events["t1"] == []  # not failed: whether anybody got it is not known yet
    cluster.connect("C", "n2")
    cluster.apply("B", b.unreached("t1", dispatch.placement, "A", 0.0))
    assert outcome(cluster, "t1") == [("moved", "n2")]


def test_an_answer_that_overtakes_its_own_dispatch_still_reaches_the_request() -> None:
    """The owner's answer can come in on the subscription before the requester's PUBLISH of
    the assign has returned (a fast bus client, a 0 ms node): the request placing the task
    must still find where it ran, and get the answer, not a 'could not be placed' 502."""
    cluster = MachineCluster("A", "B")
    node = cluster.connect("A", "n1")
    b = cluster.machines["B"]
    effects = b.submit(
        __import__("protocol").Assign(task_id="t1", model="m", prompt="p", timeout_s=10), 10.0, 0.0
    )
    (reserve,) = effects
    (dispatch,) = cluster.granted("B", reserve)
    cluster.events["t1"] = []
    cluster.in_flight.append(("B", "A", dispatch.envelope))  # received; PUBLISH not returned
    cluster.deliver()
    cluster.node_says(node.conn_id, Result(task_id="t1", output="p", chunks=0))
    cluster.deliver()
    assert outcome(cluster, "t1") == [("done", "p")]
    assert b.dispatched("t1", dispatch.placement, 0.0) == []
    assert b.requester.placement("t1") == ("n1", node.conn_id, "A")
    assert b.requester.placement("t1") is None  # read once: nothing kept behind
    cluster.ended("B", "t1")


def test_requester_killed_frees_the_node_on_the_owner() -> None:
    cluster = MachineCluster("A", "B")
    node = cluster.connect("A", "n1", max_parallel=1)
    cluster.submit("B", "t1")
    cluster.deliver()
    cluster.kill("B")
    cluster.judge()
    assert node.cancelled == ["t1"]
    assert cluster.machines["A"].owner.nodes.by_conn(node.conn_id).in_flight == 0
    # The node answers anyway: dropped as a late answer, counted.
    cluster.node_says(node.conn_id, Result(task_id="t1", output="late"))
    assert cluster.machines["A"].dropped_answers()["duplicate"] == 1


def test_an_answer_that_reaches_nobody_stops_the_task_on_the_node() -> None:
    cluster = MachineCluster("A", "B")
    node = cluster.connect("A", "n1")
    cluster.submit("B", "t1")
    cluster.deliver()
    cluster.kill("B")
    cluster.node_says(node.conn_id, Chunk(task_id="t1", seq=0, delta="a"))
    assert node.cancelled == ["t1"]


def test_bus_lost_fails_remote_tasks_and_keeps_local_ones() -> None:
    cluster = MachineCluster("A", "B")
    remote = cluster.connect("A", "n1")
    local = cluster.connect("B", "n2", models=("local",))
    cluster.submit("B", "far")
    cluster.submit("B", "near", model="local")
    cluster.deliver()
    cluster.apply("B", cluster.machines["B"].bus_lost(0.0))
    assert outcome(cluster, "far") == [("failed", NodeDisconnected.code)]
    assert outcome(cluster, "near") == []
    cluster.node_says(local.conn_id, Result(task_id="near", output="fine"))
    assert outcome(cluster, "near") == [("done", "fine")]
    assert "far" in remote.running  # A does not know yet; B's cancel is on its way
    cluster.deliver()
    assert "far" in remote.cancelled


def test_a_node_reconnecting_elsewhere_closes_the_old_connection_with_4000() -> None:
    cluster = MachineCluster("A", "B")
    old = cluster.connect("A", "n1")
    cluster.submit("A", "t1")
    new = cluster.connect("B", "n1")
    from protocol import BusReplace

    envelope = BusReplace(node_id="n1", conn_id=old.conn_id, new_instance="B")
    cluster.apply("A", cluster.machines["A"].bus_envelope(envelope, 0.0))
    assert old.closed_with == 4000 and new.closed_with is None
    assert outcome(cluster, "t1") == [("failed", NodeDisconnected.code)]


def test_claiming_a_node_owned_by_another_instance_closes_the_connection_there() -> None:
    cluster = MachineCluster("A", "B")
    old = cluster.connect("A", "n1")
    cluster.submit("A", "t1")
    new = cluster.connect("B", "n1")
    b = cluster.machines["B"]
    conn = b.owner.nodes.by_conn(new.conn_id)
    assert conn is not None
    # Nothing to close elsewhere: no previous owner, or a connection here (replaced already).
    assert b.node_claimed(conn, None, 0.0) == []
    assert b.node_claimed(conn, ("B", "c-older"), 0.0) == []
    cluster.apply("B", b.node_claimed(conn, ("A", old.conn_id), 0.0))
    cluster.deliver()
    assert old.closed_with == 4000 and new.closed_with is None
    assert outcome(cluster, "t1") == [("failed", NodeDisconnected.code)]


def test_owner_killed_before_it_confirmed_the_assign_is_placed_again_not_502() -> None:
    """A PUBLISH can still reach a just-killed process (Redis has not seen its socket close),
    so "received" does not mean a node runs the task; only the owner's bus.accepted does."""
    cluster = MachineCluster("A", "B", "C")
    cluster.machines["B"].set_ratings({"doomed": (5.0, 10)})  # B prefers A's node
    cluster.connect("A", "doomed")
    spare = cluster.connect("C", "spare")
    cluster.submit("B", "t1")
    cluster.kill("A")  # the assign is "delivered" to A's inbox, but A is gone
    cluster.deliver()
    cluster.judge()
    assert outcome(cluster, "t1") == [("moved", "spare")]
    cluster.deliver()
    assert "t1" in spare.running
    cluster.node_says(spare.conn_id, Result(task_id="t1", output="fine"))
    cluster.deliver()
    assert outcome(cluster, "t1")[-1] == ("done", "fine")


def test_owner_killed_after_it_confirmed_the_assign_fails_the_task() -> None:
    cluster = MachineCluster("A", "B", "C")
    cluster.machines["B"].set_ratings({"doomed": (5.0, 10)})
    doomed = cluster.connect("A", "doomed")
    cluster.connect("C", "spare")
    cluster.submit("B", "t1")
    cluster.deliver()  # the assign, then A's bus.accepted
    assert "t1" in doomed.running
    cluster.kill("A")
    cluster.judge()
    assert outcome(cluster, "t1") == [("failed", NodeDisconnected.code)]


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_node_streaming_more_than_a_result_can_carry_fails_and_is_stopped(where: str) -> None:
    """Issue 13, item 4: streamed output is bounded per task (waiting chunks included), so a
    node streaming without end cannot grow the requester's memory behind a stalled client."""
    cluster = MachineCluster("A", "B")
    node = cluster.connect("A", "n1")
    requester = "A" if where == "local" else "B"
    cluster.submit(requester, "t1")
    cluster.deliver()
    piece = "x" * (MAX_STREAMED_CHARS // 4)
    # An early chunk (seq 4, ahead of 0..3) counts as much as a delivered one.
    for seq in (4, 0, 1, 2, 3):
        cluster.node_says(node.conn_id, Chunk(task_id="t1", seq=seq, delta=piece))
        cluster.deliver()
    seen = outcome(cluster, "t1")
    assert seen == [("chunk", piece)] * 3 + [("failed", "node_error")], seen[-1]
    assert node.cancelled == ["t1"] and not node.running
    assert cluster.machines[requester].dropped_answers()["too_large"] == 1


@pytest.mark.parametrize("code", ["node_busy", "node_draining"])
def test_when_every_node_turned_the_task_down_it_is_503_at_once_not_a_timeout(code: str) -> None:
    """A node may be busy with work the coordinator does not see (its leases say it has room):
    once every node serving the model turned the task down, the request gets 503
    all_nodes_busy (with Retry-After) at once instead of bouncing between them until its
    deadline (504)."""
    cluster = MachineCluster("A", "B")
    first = cluster.connect("A", "n1", max_parallel=4)
    second = cluster.connect("B", "n2", max_parallel=4)
    cluster.submit("A", "t1")
    cluster.deliver()
    for _ in range(2):
        where = next(n for n in (first, second) if "t1" in n.running)
        cluster.node_says(where.conn_id, Error(task_id="t1", code=code, message="full"))
        cluster.deliver()
    seen = outcome(cluster, "t1")
    assert seen[-1] == ("failed", AllNodesBusy.code), seen
    assert len([s for s in seen if s[0] == "moved"]) == 1, seen
    assert not first.running and not second.running and not cluster.in_flight


def test_a_task_placed_again_is_unconfirmed_until_its_new_owner_confirms_it() -> None:
    """A task its first node turned down (busy, before any output) runs on another node. If
    that node's owner dies before confirming it, nobody is known to run it: it is placed a
    third time, as a first placement would be, not failed because the first owner had
    confirmed an earlier placement."""
    cluster = MachineCluster("A", "B", "C", "D")
    cluster.connect("A", "first", max_parallel=1)
    cluster.machines["B"].set_ratings({"first": (5.0, 10), "second": (4.0, 10)})
    cluster.submit("B", "t1")
    cluster.deliver()  # the assign reaches A, A's bus.accepted reaches B
    first = cluster.node_of("t1")
    assert first.node_id == "first"
    second = cluster.connect("C", "second", max_parallel=1)
    cluster.connect("D", "third", max_parallel=1)
    cluster.node_says(first.conn_id, Error(task_id="t1", code="node_busy", message="full"))
    cluster.deliver(limit=1)  # A's refusal reaches B, which places the task on C's node
    cluster.deliver(limit=1)  # the assign reaches C ...
    assert "t1" in second.running
    cluster.kill("C")  # ... and C dies before its bus.accepted reaches B
    cluster.in_flight.clear()  # what C sent dies with it
    cluster.judge()
    assert outcome(cluster, "t1")[-1] == ("moved", "third")
