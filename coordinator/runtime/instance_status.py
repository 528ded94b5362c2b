"""What the HTTP API reads of the cluster through one instance: the status counts, the node
list with capacity leases and telemetry, a node's telemetry history."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from coordinator.coordination import CoordinationUnavailable
from coordinator.core import cluster_view
from coordinator.errors import CoordinationDown, UnknownNode
from protocol import TelemetrySample

if TYPE_CHECKING:
    from coordinator.runtime.instance import Instance

log = logging.getLogger("gemmanet.instance")


async def cluster_status(instance: Instance) -> dict[str, object]:
    queued: dict[str, int] | None = None
    try:
        models = cluster_view.served_models(instance.machine, instance.clock())
        queued = await instance.coordination.leases.queue_depths(models, instance.admissions.rules)
    except CoordinationUnavailable as exc:
        log.warning("status: cannot read the admission queues: %s", exc)
    return cluster_view.status(instance.machine, instance.diagnostics(), queued)


async def cluster_nodes(instance: Instance) -> list[dict[str, object]]:
    usage = None
    try:
        node_ids = sorted(
            {v.node_id for v in instance.machine.views()} | set(instance.machine.hosts.terms)
        )
        found = await instance.coordination.leases.lease_usage(node_ids)
        usage = {n: (u.leases, u.memory_gb) for n, u in found.items()}
    except CoordinationUnavailable as exc:
        log.warning("nodes: cannot read the capacity leases: %s", exc)
    infos = cluster_view.node_infos(instance.machine, usage, instance.clock())
    latest = await instance.telemetry.latest([str(info["node_id"]) for info in infos]) or {}
    for info in infos:
        info["telemetry"] = latest.get(str(info["node_id"]))
    return infos


async def node_telemetry(instance: Instance, node_id: str) -> list[TelemetrySample]:
    """The node's telemetry history, oldest first. Raises UnknownNode when the node is
    neither online anywhere nor has a history; CoordinationDown when the store is out of
    reach."""
    try:
        samples = await instance.telemetry.history(node_id)
    except CoordinationUnavailable as exc:
        log.warning("telemetry of node %s: %s", node_id, exc)
        raise CoordinationDown(
            "the telemetry cannot be read for the moment; retry after the Retry-After delay"
        ) from None
    if not samples and node_id not in {v.node_id for v in instance.machine.views()}:
        raise UnknownNode(f"no node {node_id!r} is online or has telemetry")
    return samples
