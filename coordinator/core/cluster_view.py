"""What ``/api/v1/status`` and ``/api/v1/nodes`` report, read off the cluster machine: this
instance's own state plus the last snapshots of its live peers. Pure."""

from __future__ import annotations

from coordinator.core import registry
from coordinator.core.hosts.direct_hosts import DIRECT_OWNER, state_reason
from coordinator.core.instance_machine import InstanceMachine


def served_models(machine: InstanceMachine, now: float | None = None) -> list[str]:
    """Models an online node serves, and given ``now``, a direct host placement may use."""
    hosts = machine.hosts.views(now) if now is not None else []
    return sorted(machine.served_models().union(*(view.models for view in hosts)))


def status(
    machine: InstanceMachine, diagnostics: dict[str, object], queued: dict[str, int] | None
) -> dict[str, object]:
    mine = {c.node_id for c in machine.owner.nodes.connections()}
    peers = machine.peers()
    return {
        "online_nodes": len(mine | registry.online_node_ids(peers)),
        "instances": 1 + len(peers),
        "in_flight": len(machine.requester) + sum(machine.peer_requests(p) for p in peers),
        "instance_id": machine.me,
        "queued": queued,
        "diagnostics": diagnostics,
    }


def public_status(status: dict[str, object], version: str) -> dict[str, object]:
    """``status`` as ``GET /api/v1/status`` shows it to anyone: the queues summed over models,
    so that a route without a key names no model."""
    public = {key: value for key, value in status.items() if key not in ("queued", "diagnostics")}
    queued = status["queued"]
    public["queue_depth"] = sum(queued.values()) if isinstance(queued, dict) else None
    diagnostics = status["diagnostics"]
    assert isinstance(diagnostics, dict)
    local = diagnostics["local_queued"]
    public["diagnostics"] = {
        **{key: value for key, value in diagnostics.items() if key != "local_queued"},
        "local_queue_depth": sum(local.values()),
    }
    return {**public, "version": version}


def diagnostics(
    machine: InstanceMachine,
    *,
    liveness_lost: int,
    bus_losses: int,
    local_queued: dict[str, int],
    lost_leases: int,
) -> dict[str, object]:
    """Counters of this instance only: what was refused or lost, for operators and tests."""
    return {
        "local_nodes": len(machine.owner.nodes),
        "local_in_flight": len(machine.requester),
        "dropped_answers": machine.dropped_answers(),
        "forwarded_in_flight": machine.owner.forwarding.remote_count(machine.me),
        "liveness_lost": liveness_lost,
        "bus_losses": bus_losses,
        "local_queued": local_queued,
        "lost_leases": lost_leases,
    }


_GATED = "its facts are fresh, but placement on direct hosts is off (gemmanet audit --enable)"


def host_infos(machine: InstanceMachine, now: float) -> dict[str, dict[str, object]]:
    """Every configured direct host (``kind: "direct"``, no owner instance), with whether its
    facts are trusted now (``host_state``, and ``host_reason``: why not) and, only while
    placement may use it (those facts and the enablement gate), the models it serves;
    ``in_flight`` counts this instance's calls (other instances call it too)."""
    hosts = machine.hosts
    infos: dict[str, dict[str, object]] = {}
    for host_id, terms in sorted(hosts.terms.items()):
        state, read = hosts.state(host_id, now), hosts.read(host_id)
        infos[host_id] = {
            "node_id": host_id,
            "instance_id": DIRECT_OWNER,
            "kind": "direct",
            "host_state": state,
            "host_reason": state_reason(state, read) or (None if hosts.placing else _GATED),
            "models": sorted(read.serves())
            if read is not None and state == "ok" and hosts.placing
            else [],
            "max_parallel": terms.max_parallel,
            "in_flight": hosts.in_flight(host_id),
            "vram_gb": terms.memory_gb,
            "agent_version": terms.kind,
            "connected_at": None,
        }
    return infos


def _agent_host_state(backend_down: str | None) -> str | None:
    """An agent node's ``host_state``: ``unreachable`` while its agent says its model backend
    is down (its ``models`` are then empty), else None (it serves what its hello said)."""
    return None if backend_down is None else "unreachable"


def node_infos(
    machine: InstanceMachine, usage: dict[str, tuple[int, float]] | None, now: float | None = None
) -> list[dict[str, object]]:
    """Every online node, here or on a live peer, by node id (one entry per identity: the
    local connection wins while an identity moves between instances), with its lease usage
    (``usage``: node id -> (leases, memory in use in GB); None: the store could not be read).
    An agent node whose backend is down lists no models, with ``host_state`` ``unreachable`` and
    its agent's account of why as ``host_reason``.
    Given ``now``, the direct hosts too."""
    infos: dict[str, dict[str, object]] = {}
    for conn in machine.owner.nodes.connections():
        infos[conn.node_id] = {
            "node_id": conn.node_id,
            "instance_id": machine.me,
            "models": sorted(conn.models),
            "max_parallel": conn.max_parallel,
            "in_flight": conn.in_flight,
            "vram_gb": conn.vram_gb,
            "agent_version": conn.agent_version,
            "connected_at": conn.connected_at,
            "host_state": _agent_host_state(conn.backend_down),
            "host_reason": conn.backend_down,
        }
    for snap in machine.peers():
        for entry in snap.nodes:
            infos.setdefault(
                entry.node_id,
                {
                    "node_id": entry.node_id,
                    "instance_id": snap.instance_id,
                    "models": list(entry.models),
                    "max_parallel": entry.max_parallel,
                    "in_flight": machine.peer_in_flight(snap.instance_id, entry),
                    "vram_gb": entry.vram_gb,
                    "agent_version": entry.agent_version,
                    "connected_at": entry.connected_at,
                    "host_state": _agent_host_state(entry.backend_down),
                    "host_reason": entry.backend_down,
                },
            )
    if now is not None:
        for host_id, info in host_infos(machine, now).items():
            infos.setdefault(host_id, info)
    for node_id, info in infos.items():
        mean, count = machine.ratings.get(node_id, (None, 0))
        info["rating"], info["ratings"] = mean, count
        leases, memory = (None, None) if usage is None else usage.get(node_id, (0, 0.0))
        info["leases"], info["memory_in_use_gb"] = leases, memory
    return [infos[k] for k in sorted(infos)]
