"""A model no serving node can ever hold is refused at once with ``model_never_fits``, naming
the model and the largest budget among the nodes serving it, instead of waiting out the
admission queue. Any node that could hold it (here, on a peer, a direct host, or a node
without a memory budget) lets the request through to admission."""

from __future__ import annotations

import random

import pytest

from coordinator.core.effects import Reserve
from coordinator.core.hosts.direct_hosts import DirectHosts, HostRead, HostTerms
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.node_table import NodeConnection
from coordinator.core.placement import fit
from coordinator.core.registry import InstanceSnapshot, NodeEntry
from coordinator.errors import ModelNeverFits, NoNodeForModel
from protocol import Assign

NEEDS = fit.request_needs({"big": (5.5, 0.5), "free": (0.0, 0.0)})


def connection(node_id: str, vram_gb: float | None, model: str = "big") -> NodeConnection:
    return NodeConnection(conn_id=f"c-{node_id}", node_id=node_id, models=frozenset({model}),
                          max_parallel=2, vram_gb=vram_gb, agent_version="",
                          connected_at=0.0, last_seen=0.0)  # fmt: skip


def peer(node_id: str, vram_gb: float | None) -> InstanceSnapshot:
    entry = NodeEntry(node_id=node_id, conn_id=f"c-{node_id}", models=["big"], max_parallel=2,
                      in_flight=0, vram_gb=vram_gb)  # fmt: skip
    return InstanceSnapshot(instance_id="B", in_flight=0, nodes=[entry])


def machine(*local: NodeConnection, hosts: DirectHosts | None = None) -> InstanceMachine:
    m = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(0), hosts=hosts, needs=NEEDS)
    for conn in local:
        m.node_connected(conn, 0.0)
    return m


def submit(m: InstanceMachine, model: str = "big", task_id: str = "t-1") -> list[object]:
    return list(m.submit(Assign(task_id=task_id, model=model, prompt="x"), 1e9, 0.0))


def test_a_model_larger_than_every_serving_budget_is_refused_naming_the_largest() -> None:
    m = machine(connection("n1", 4.0), connection("n2", 3.0))
    m.set_peers([peer("n3", 5.0)])
    with pytest.raises(ModelNeverFits) as refused:
        submit(m)
    error = refused.value
    assert (error.status, error.code) == (503, "model_never_fits")
    assert "'big'" in error.message and "needs 6 GB" in error.message
    assert "largest memory budget among the nodes serving it is 5 GB" in error.message
    assert error.headers() == {"Retry-After": "30"}
    # Nothing was registered for the refused request.
    assert len(m.requester) == 0


@pytest.mark.parametrize(
    "where",
    ["local node", "peer node", "local without budget", "peer without budget", "direct host"],
)
def test_one_node_that_can_hold_it_anywhere_lets_the_request_queue(where: str) -> None:
    small = connection("n1", 4.0)
    hosts = None
    if where == "direct host":
        terms = {"h": HostTerms(kind="ollama", memory_gb=24.0)}
        hosts = DirectHosts("A", terms, stale_s=15.0, placement="on")
        hosts.facts_read(
            {"h": HostRead(reachable=True, epoch=1, age_s=0.0, read_at=0.0,
                           models=frozenset({"big"}))},
            current_epoch=1,
        )  # fmt: skip
    m = machine(small, *(
        [connection("n2", 6.0)] if where == "local node"
        else [connection("n2", None)] if where == "local without budget" else []
    ), hosts=hosts)  # fmt: skip
    if where.startswith("peer"):
        m.set_peers([peer("n3", 8.0 if where == "peer node" else None)])
    assert any(isinstance(e, Reserve) for e in submit(m))


def test_models_outside_the_catalog_or_unserved_keep_their_own_answers() -> None:
    m = machine(connection("n1", 1.0, model="free"), connection("n2", 1.0, model="other"))
    assert any(isinstance(e, Reserve) for e in submit(m, "free", "t-1"))
    assert any(isinstance(e, Reserve) for e in submit(m, "other", "t-2"))
    with pytest.raises(NoNodeForModel):
        submit(m, "big", "t-3")  # nobody serves it: no_node_for_model, as before


def test_the_warnings_name_the_node_or_host_and_the_models_it_cannot_hold() -> None:
    problem = fit.budget_problem("node n1", 4.0, ["big", "free", "other"], NEEDS)
    assert problem is not None
    assert problem.startswith("node n1: its memory budget of 4 GB can never hold big (6 GB)")
    assert "free" not in problem and "model_never_fits" in problem
    assert fit.budget_problem("node n1", 6.0, ["big"], NEEDS) is None
    assert fit.budget_problem("node n1", None, ["big"], NEEDS) is None
    assert fit.host_budget_problems({"h1": 2.0, "h2": 64.0, "h3": None}, NEEDS) == [
        fit.budget_problem("host h1", 2.0, NEEDS, NEEDS)
    ]
