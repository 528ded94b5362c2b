"""A direct host's ``weight`` skews its share of placement (``core/placement/choose.py``): through
the cluster machine, as an instance places requests, a host of weight 3 beside one of weight 1
takes three in four of their placements, whether each request ends before the next (the
weighted tie-break) or they pile up (load counted per unit of weight). Agent nodes weigh 1:
their order is what it was before weights (the same draws of the seeded ``Random``).

Tolerance: with p = 0.75 over 200 placements the count's standard deviation is about 6.1,
so 150 +- 20 is more than 3 standard deviations wide; ignoring the weight gives about 100."""

from __future__ import annotations

import random

from coordinator.core.effects import CallHost, Reserve
from coordinator.core.hosts.direct_hosts import DirectHosts, HostRead, HostTerms
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.placement.choose import NodeView, rank_candidates, shuffle_by_weight
from protocol import Assign

STALE_S = 15.0
EPOCH = 3
NOW = 100.0
PLACEMENTS = 200
EXPECTED_HEAVY = 150  # 200 * 3 / (3 + 1)
TOLERANCE = 20


def machine(seed: int, heavy: float = 3.0, light: float = 1.0) -> InstanceMachine:
    terms = {
        "heavy": HostTerms("ollama", max_parallel=8, weight=heavy),
        "light": HostTerms("ollama", max_parallel=8, weight=light),
    }
    # The gate open (core/hosts/gate.py): the facts and the weights alone.
    hosts = DirectHosts("A", terms, STALE_S, placement="on")
    fresh = HostRead(reachable=True, epoch=EPOCH, age_s=1.0, read_at=NOW, models=frozenset({"m"}))
    hosts.facts_read({"heavy": fresh, "light": fresh}, EPOCH)
    return InstanceMachine("A", forward_grace_s=5.0, rng=random.Random(seed), hosts=hosts)


def first_choice(m: InstanceMachine, task_id: str) -> NodeView:
    assign = Assign(task_id=task_id, model="m", prompt="p", stream=False, timeout_s=30.0)
    assert m.submit(assign, deadline=NOW + 30.0, now=NOW) == [Reserve(task_id, 1)]
    return (m.requester.candidates(task_id, 1, NOW) or [])[0]


def sequential_share(m: InstanceMachine) -> int:
    """Placements on "heavy" when each request ends before the next one comes."""
    heavy = 0
    for i in range(PLACEMENTS):
        view = first_choice(m, f"t{i}")
        heavy += view.node_id == "heavy"
        m.request_ended(f"t{i}", "ok", NOW)
    return heavy


def test_a_host_of_weight_3_takes_three_quarters_of_idle_placements() -> None:
    for seed in (0, 1, 2):
        heavy = sequential_share(machine(seed))
        assert abs(heavy - EXPECTED_HEAVY) <= TOLERANCE, (seed, heavy)


def test_equal_weights_share_evenly() -> None:
    heavy = sequential_share(machine(0, heavy=2.0, light=2.0))
    assert abs(heavy - PLACEMENTS // 2) <= TOLERANCE, heavy


def test_under_load_tasks_in_flight_settle_in_proportion_to_the_weights() -> None:
    m = machine(0)
    for i in range(8):
        view = first_choice(m, f"t{i}")
        # Placed: the call runs (and counts in flight) until its request ends.
        effects = m.reserved(f"t{i}", 1, view, f"t{i}.1", NOW)
        assert any(isinstance(e, CallHost) for e in effects)
    assert (m.hosts.in_flight("heavy"), m.hosts.in_flight("light")) == (6, 2)


def node(node_id: str, weight: float = 1.0, in_flight: int = 0) -> NodeView:
    return NodeView(node_id, "A", f"c-{node_id}", frozenset({"m"}), 4, in_flight, weight=weight)


def test_unweighted_nodes_are_ordered_as_by_a_plain_shuffle() -> None:
    nodes = [node(f"n{i}") for i in range(10)]
    plain = sorted(nodes, key=lambda n: n.node_id)
    random.Random(7).shuffle(plain)
    assert rank_candidates(nodes, rng=random.Random(7)) == plain
    weighted = list(nodes)
    shuffle_by_weight(weighted, random.Random(7))
    assert [n.node_id for n in weighted] == [n.node_id for n in plain]


def test_load_and_a_free_slot_still_come_before_weight() -> None:
    busy_heavy = node("heavy", weight=1000.0, in_flight=3)
    idle_light = node("light", weight=1.0)
    for seed in range(20):
        assert rank_candidates([busy_heavy, idle_light], rng=random.Random(seed))[0] == idle_light
    full_heavy = NodeView("heavy", "A", "c-heavy", frozenset({"m"}), 1, 1, weight=1000.0)
    loaded_light = node("light", in_flight=3)
    assert rank_candidates([full_heavy, loaded_light], rng=random.Random(0))[0] == loaded_light
