"""The audit's verdict on agent nodes, pure: every node the operator file lists and every node
an instance in the registry holds, each with its verdict.

A connected node is *ready* when its owner instance beat within ``GEMMANET_ALIVE_TTL_S``
(after that its peers stop placing on it) and the store holds its facts (what the capacity
leases are judged against) for that very connection. Otherwise it is a reason, named by the
node: ``stale_facts`` (the owner went silent, or the facts name another connection or
instance) or ``no_facts``. Warnings, which do not stop the scheduler: a node listed in the
operator file but not connected (``node_not_connected``), a node without a memory budget
(``no_memory_budget``: placed on its parallel budget alone), a budget in the store that is
not the one this operator file gives (``budget_mismatch``: instances read another file), a
served model no budget of the node can ever hold (``model_never_fits``). A node's parallelism
is what its hello or the operator file declares, never derived from its memory
(``parallel_from``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coordinator.coordination.leases import NodeFacts
from coordinator.core.placement import fit
from coordinator.settings import Settings

__all__ = ["ConnectedNode", "Finding", "judge_nodes"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason (not ready) or warning: a stable ``code``, the host, node or model it is
    about (``subject``, None for the whole cluster) and a sentence for people."""

    code: str
    message: str
    subject: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "subject": self.subject, "message": self.message}


@dataclass(frozen=True, slots=True)
class ConnectedNode:
    """An agent node an instance of the registry holds, from that instance's snapshot."""

    node_id: str
    instance_id: str
    models: tuple[str, ...]
    max_parallel: int
    vram_gb: float | None
    conn_id: str = ""
    #: seconds since the owner instance last beat, on the store's clock
    owner_age_s: float = 0.0


@dataclass(frozen=True)
class NodeObservations:
    connected: dict[str, ConnectedNode] = field(default_factory=dict)
    facts: dict[str, NodeFacts] = field(default_factory=dict)


def _facts_reason(node: ConnectedNode, facts: NodeFacts | None, ttl: float) -> Finding | None:
    subject = node.node_id
    if node.owner_age_s > ttl:
        message = (
            f"node {subject}: its instance {node.instance_id} last beat {node.owner_age_s:.1f} s "
            f"ago (its peers stop placing on it after GEMMANET_ALIVE_TTL_S={ttl:g} s)"
        )
        return Finding("stale_facts", message, subject)
    if facts is None:
        message = f"node {subject}: connected to {node.instance_id} but no facts in the store"
        return Finding("no_facts", message, subject)
    if (facts.conn_id, facts.instance_id) != (node.conn_id, node.instance_id):
        message = (
            f"node {subject}: the facts in the store are of another connection (on "
            f"{facts.instance_id}), not of its connection to {node.instance_id}"
        )
        return Finding("stale_facts", message, subject)
    return None


def _warnings(
    settings: Settings, node: ConnectedNode, facts: NodeFacts | None, needs: dict[str, float]
) -> list[Finding]:
    subject = node.node_id
    found = []
    parallel, memory = settings.capacity.budgets(subject, node.max_parallel, node.vram_gb)
    if memory is None:
        message = (
            f"node {subject}: no memory budget (--vram-gb or the operator file's vram_gb): "
            "placed on its parallel budget alone"
        )
        found.append(Finding("no_memory_budget", message, subject))
    if facts is not None and (facts.max_parallel, facts.memory_gb) != (parallel, memory):
        message = (
            f"node {subject}: its instance charges {facts.max_parallel} parallel, "
            f"{facts.memory_gb} GB, this operator file gives {parallel} parallel, {memory} GB "
            "(every instance should read the same file)"
        )
        found.append(Finding("budget_mismatch", message, subject))
    problem = fit.budget_problem(f"node {subject}", memory, node.models, needs)
    if problem is not None:
        found.append(Finding("model_never_fits", problem, subject))
    return found


def judge_nodes(
    settings: Settings,
    observed: NodeObservations | None,
    reasons: list[Finding],
    warnings: list[Finding],
) -> list[dict[str, Any]]:
    """One row per node (``observed`` None: the store was not read)."""
    capacity = settings.capacity
    needs = fit.request_needs({m: (c.resident_gb, c.kv_gb) for m, c in capacity.models.items()})
    ttl = settings.alive_ttl_s
    connected = observed.connected if observed else {}
    rows = []
    for node_id in sorted(set(capacity.nodes) | set(connected)):
        live = connected.get(node_id)
        override = capacity.nodes.get(node_id)
        facts = observed.facts.get(node_id) if observed else None
        parallel, memory = capacity.budgets(
            node_id, live.max_parallel if live else 0, live.vram_gb if live else None
        )
        problem = None
        if live is not None:
            problem = _facts_reason(live, facts, ttl)
            warnings += _warnings(settings, live, facts, needs)
        elif observed is not None:
            message = f"node {node_id}: not connected"
            if node_id in capacity.hosts:
                # The older way to give a host's telemetry agent: a [nodes] entry of its id.
                message += (
                    f"; {node_id} is a direct host ([hosts]): drop its [nodes] entry and give"
                    " the host its telemetry_url"
                )
            warnings.append(Finding("node_not_connected", message, node_id))
        if problem is not None:
            reasons.append(problem)
        from_file = override is not None and override.max_parallel is not None
        rows.append(
            {
                "node_id": node_id,
                "max_parallel": parallel or None,
                "vram_gb": memory,
                "budget_from": "operator file"
                if override is not None
                and (override.max_parallel is not None or override.vram_gb is not None)
                else "hello",
                "parallel_from": ("operator file" if from_file else "hello") if live else None,
                "connected": None if observed is None else live is not None,
                "instance_id": live.instance_id if live else None,
                "models": list(live.models) if live else [],
                "owner_age_s": round(live.owner_age_s, 3) if live else None,
                "has_facts": facts is not None if observed is not None else None,
                "fresh": None if live is None else problem is None,
                "uncatalogued": sorted(m for m in live.models if m not in capacity.models)
                if live
                else [],
                "verdict": _verdict(observed, live, problem),
                "ready": live is not None and problem is None,
            }
        )
    return rows


def _verdict(
    observed: NodeObservations | None, live: ConnectedNode | None, problem: Finding | None
) -> str:
    if observed is None:
        return "unknown"
    if live is None:
        return "not_connected"
    return "ready" if problem is None else problem.code
