"""A node whose agent says its model backend is down (``backend_down`` in its hello or a
heartbeat) as the pure cluster machines see it: nothing is placed on it, here or from a peer;
an assign placed from an older view is refused and placed elsewhere (503 when nowhere), never a
502; once a heartbeat comes without it, the node serves again. The agent's side, and the whole
system over real sockets: tests/coordinator/test_node_agent_backend.py and
tests/e2e/test_node_agent_backend_down.py."""

from __future__ import annotations

import pytest

from coordinator.core import cluster_view
from coordinator.core.node_table import NodeConnection
from coordinator.errors import AllNodesBusy, NoNodeForModel
from protocol import Error, Heartbeat, Result, TaskErrorCode
from tests.coordinator.machine_harness import MachineCluster
from tests.coordinator.test_cluster_machine import outcome

DOWN = "ollama: GET http://127.0.0.1:11434/api/tags: cannot connect"


def info(cluster: MachineCluster, instance: str, node_id: str) -> dict[str, object]:
    (found,) = [
        n
        for n in cluster_view.node_infos(cluster.machines[instance], None)
        if n["node_id"] == node_id
    ]
    return found


def test_a_node_whose_backend_is_down_gets_nothing_until_it_answers_again() -> None:
    cluster = MachineCluster("A")
    node = cluster.connect("A", "n1", models=("m", "m2"))
    nodes = cluster.machines["A"].owner.nodes
    roster = nodes.roster_changes
    cluster.node_says(node.conn_id, Heartbeat(backend_down=DOWN))
    assert nodes.roster_changes > roster  # the peers' stored snapshot is rewritten
    with pytest.raises(NoNodeForModel):
        cluster.submit("A", "t1")
    assert not node.running
    # Still listed (it is connected), with no models and why.
    assert info(cluster, "A", "n1")["models"] == []
    assert info(cluster, "A", "n1")["host_state"] == "unreachable"
    assert info(cluster, "A", "n1")["host_reason"] == DOWN  # the agent's own words
    assert cluster_view.served_models(cluster.machines["A"]) == []
    # Every heartbeat says it again; another wording of the same state changes nothing.
    roster = nodes.roster_changes
    cluster.node_says(node.conn_id, Heartbeat(backend_down=DOWN + " (again)"))
    assert nodes.roster_changes == roster
    with pytest.raises(NoNodeForModel):
        cluster.submit("A", "t1")

    cluster.node_says(node.conn_id, Heartbeat())  # it answers again
    assert info(cluster, "A", "n1")["models"] == ["m", "m2"]
    assert info(cluster, "A", "n1")["host_state"] is None
    assert info(cluster, "A", "n1")["host_reason"] is None
    cluster.submit("A", "t2", model="m2")
    cluster.node_says(node.conn_id, Result(task_id="t2", output="p"))
    assert outcome(cluster, "t2") == [("done", "p")]


def test_a_node_down_at_its_hello_is_listed_without_models() -> None:
    cluster = MachineCluster("A")
    conn = NodeConnection(
        conn_id="c-1",
        node_id="n1",
        models=frozenset(),
        advertised=frozenset({"m"}),
        backend_down=DOWN,
        max_parallel=2,
        vram_gb=None,
        agent_version="test",
        connected_at=0.0,
        last_seen=0.0,
    )
    cluster.apply("A", cluster.machines["A"].node_connected(conn, 0.0))
    assert info(cluster, "A", "n1")["models"] == [] and not cluster.machines["A"].serves("m")
    cluster.apply("A", cluster.machines["A"].node_envelope("c-1", Heartbeat(), 0.0))
    assert cluster.machines["A"].serves("m")
    assert info(cluster, "A", "n1")["models"] == ["m"]


def test_peers_stop_placing_on_it_once_its_snapshot_says_so() -> None:
    cluster = MachineCluster("A", "B")
    node = cluster.connect("A", "n1")
    cluster.node_says(node.conn_id, Heartbeat(backend_down=DOWN))
    cluster.share_snapshots()
    with pytest.raises(NoNodeForModel):
        cluster.submit("B", "t1")
    assert info(cluster, "B", "n1")["host_state"] == "unreachable"
    assert info(cluster, "B", "n1")["host_reason"] == DOWN  # through A's snapshot
    assert info(cluster, "B", "n1")["models"] == []
    cluster.node_says(node.conn_id, Heartbeat())
    cluster.share_snapshots()
    cluster.submit("B", "t2")
    cluster.deliver()
    assert "t2" in node.running


@pytest.mark.parametrize("elsewhere", [True, False])
def test_an_assign_placed_from_an_older_view_is_refused_and_placed_elsewhere(
    elsewhere: bool,
) -> None:
    cluster = MachineCluster("A", "B")
    down = cluster.connect("A", "n1")
    other = cluster.connect("B", "n2", max_parallel=1) if elsewhere else None
    cluster.machines["B"].set_ratings({"n1": (5.0, 10)})  # B tries A's node first
    cluster.node_says(down.conn_id, Heartbeat(backend_down=DOWN))  # B has not heard yet
    cluster.submit("B", "t1")
    cluster.deliver()
    assert not down.running  # the owner did not hand it to the node
    if other is not None:
        assert "t1" in other.running
        cluster.node_says(other.conn_id, Result(task_id="t1", output="p"))
        assert outcome(cluster, "t1")[-1] == ("done", "p")
    else:
        seen = outcome(cluster, "t1")
        assert seen == [("failed", AllNodesBusy.code)], seen  # 503, not 502


def test_a_task_the_node_refuses_as_backend_unavailable_is_placed_again() -> None:
    cluster = MachineCluster("A")
    first = cluster.connect("A", "n1")
    second = cluster.connect("A", "n2")
    cluster.machines["A"].set_ratings({"n1": (5.0, 10)})
    cluster.submit("A", "t1")
    assert "t1" in first.running
    refusal = Error(task_id="t1", code=TaskErrorCode.BACKEND_UNAVAILABLE, message=DOWN)
    cluster.node_says(first.conn_id, refusal)
    assert "t1" in second.running
    cluster.node_says(second.conn_id, Error(task_id="t1", code="backend_unavailable", message="x"))
    assert outcome(cluster, "t1")[-1] == ("failed", AllNodesBusy.code)
