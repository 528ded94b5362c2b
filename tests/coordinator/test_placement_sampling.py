"""Placement among thousands of nodes looks at a random sample, not at every node (issue 11,
"placement sublinear in the node count"), and still finds a free node when few are left.

* ``Pool`` (the nodes serving one model) keeps add/remove/draw O(1) and loses nothing;
* above ``SAMPLE_ABOVE`` nodes serving a model, a placement builds no view of every node;
* the sample is uniform over local and remote nodes, the local connection of an identity wins,
  and remote nodes are corrected for the tasks this instance sent them;
* a sample with no free node falls back to ranking every node (one free node among 2,000 is
  found every time);
* the least loaded of a sample balances load almost as well as the least loaded of all.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.node_table import NodeConnection
from coordinator.core.placement.choose import SAMPLE_ABOVE, SAMPLE_SIZE, Pool
from coordinator.core.registry import InstanceSnapshot, NodeEntry
from protocol import Assign


def connection(conn_id: str, *, model: str = "m", max_parallel: int = 4) -> NodeConnection:
    return NodeConnection(conn_id=conn_id, node_id=conn_id, models=frozenset({model}),
                          max_parallel=max_parallel, vram_gb=None, agent_version="",
                          connected_at=0.0, last_seen=0.0)  # fmt: skip


def peer(
    instance: str, nodes: int, *, in_flight: int = 0, max_parallel: int = 4
) -> InstanceSnapshot:
    entries = [
        NodeEntry(node_id=f"{instance}-n{i}", conn_id=f"{instance}-c{i}", models=["m"],
                  max_parallel=max_parallel, in_flight=in_flight)
        for i in range(nodes)
    ]  # fmt: skip
    return InstanceSnapshot(instance_id=instance, in_flight=0, nodes=entries)


def machine_with(local: int, remote: int, *, seed: int = 1) -> InstanceMachine:
    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(seed))
    for i in range(local):
        machine.node_connected(connection(f"A-c{i}"), 0.0)
    if remote:
        machine.set_peers([peer("B", remote)])
    return machine


def place(machine: InstanceMachine, task_id: str) -> list[str]:
    machine.requester.submit(Assign(task_id=task_id, model="m", prompt="x"), deadline=1e9)
    found = machine.requester.candidates(task_id, 1)
    assert found is not None
    return [v.conn_id for v in found]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=200))
def test_a_pool_holds_exactly_what_was_added_and_not_removed(ops: list[tuple[bool, int]]) -> None:
    pool: Pool[int] = Pool()
    model: dict[str, int] = {}
    for add, n in ops:
        key = f"k{n}"
        if add:
            pool.add(key, n)
            model[key] = n
        else:
            pool.remove(key)
            model.pop(key, None)
        assert sorted(pool[i] for i in range(len(pool))) == sorted(model.values())


def test_a_placement_among_thousands_builds_no_view_of_every_node() -> None:
    machine = machine_with(local=1000, remote=2000)
    full_lists = []
    real_views = machine.views

    def counting_views() -> list[object]:
        full_lists.append(1)
        return real_views()  # type: ignore[return-value]

    machine.requester._views = counting_views  # type: ignore[assignment]
    for i in range(50):
        assert len(place(machine, f"t{i}")) == 8
    assert full_lists == []  # the sample was enough every time: no O(nodes) list was built
    # At or below the threshold every node is ranked, exactly as before.
    small = machine_with(local=SAMPLE_ABOVE // 2, remote=SAMPLE_ABOVE // 2)
    assert small.sample_views("m", SAMPLE_SIZE, random.Random(1)) is None


def test_the_sample_is_uniform_over_local_and_remote_nodes() -> None:
    machine = machine_with(local=500, remote=1500)
    rng = random.Random(7)
    seen: Counter[str] = Counter()
    for _ in range(300):
        sample = machine.sample_views("m", SAMPLE_SIZE, rng)
        assert sample is not None and len(sample) == SAMPLE_SIZE
        assert len({v.conn_id for v in sample}) == SAMPLE_SIZE  # distinct
        seen.update(v.instance_id for v in sample)
    local_share = seen["A"] / (seen["A"] + seen["B"])
    assert 0.2 < local_share < 0.3  # 500 of 2,000


def test_a_sampled_peer_node_counts_the_tasks_sent_to_it_and_yields_to_a_local_twin() -> None:
    machine = machine_with(local=0, remote=SAMPLE_ABOVE + 1)
    # Tasks this instance sent to B-n1 since B's snapshot (which says 0 in flight).
    for i in range(3):
        machine.requester.tracker.open(
            f"x{i}", node_id="B-n1", conn_id="B-c1", owner_instance="B", deadline=1e9
        )
    twin = NodeConnection(conn_id="A-twin", node_id="B-n0", models=frozenset({"m"}),
                          max_parallel=4, vram_gb=None, agent_version="", connected_at=0.0,
                          last_seen=0.0)  # fmt: skip
    machine.node_connected(twin, 0.0)
    for seed in range(20):
        sample = machine.sample_views("m", SAMPLE_ABOVE + 2, random.Random(seed))
        assert sample is not None
        by_node = Counter(v.node_id for v in sample)
        assert by_node["B-n0"] == 1  # the identity once: its local connection
        assert next(v for v in sample if v.node_id == "B-n0").conn_id == "A-twin"
        assert [v.in_flight for v in sample if v.node_id == "B-n1"] == [3]


def test_one_free_node_among_two_thousand_is_found_every_time() -> None:
    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(3))
    for i in range(2000):
        conn = connection(f"A-c{i}", max_parallel=1)
        machine.node_connected(conn, 0.0)
        if i != 1234:
            conn.tasks.add(f"busy-{i}")
    for i in range(30):
        assert place(machine, f"t{i}")[0] == "A-c1234"


def test_the_least_loaded_of_a_sample_balances_load_like_the_least_loaded_of_all() -> None:
    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(5))
    conns = [connection(f"A-c{i}", max_parallel=8) for i in range(1000)]
    for conn in conns:
        machine.node_connected(conn, 0.0)
    for i in range(3000):  # three tasks per node on average, none released
        first = place(machine, f"t{i}")[0]
        machine.owner.nodes.by_conn(first).tasks.add(f"t{i}")  # type: ignore[union-attr]
    loads = Counter(len(c.tasks) for c in conns)
    # A random choice would leave nodes with 0 and with 8+ tasks; the best of 32 keeps every
    # node within one of the mean.
    assert set(loads) <= {2, 3, 4}, loads
