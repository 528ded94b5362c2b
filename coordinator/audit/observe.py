"""What ``gemmanet audit`` reads: from Redis, the monitor's lease and epoch, the fenced facts
of every ``[hosts]`` entry, the placement switch, the instance registry (which agent nodes its
instances hold, and how long ago each instance beat) and those nodes' facts;
with ``--probe``, each host's own answer to one poll from this machine.

Read-only in effect: the one call that writes is the registry read, which stamps the
registry's "some presence call ran" pulse, as every instance's liveness read does. It passes a
stall threshold longer than the registry keeps anyone, so it never records a stall window:
such a window would excuse a silent instance's lapse when it comes back.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from coordinator.audit.findings import ConnectedNode, Observed
from coordinator.coordination.base import CoordinationUnavailable
from coordinator.coordination.factory import coordination_for
from coordinator.coordination.keys import PRESENCE, snapshot_key
from coordinator.coordination.roles import KeyValue, Presence
from coordinator.core import registry
from coordinator.monitor.poller import poll_host
from coordinator.settings import Settings

__all__ = ["PROBE_TIMEOUT_S", "observe"]

#: ``--probe``: each host gets this long (or the monitor's poll timeout, if shorter)
PROBE_TIMEOUT_S = 2.0
_NO_STALL_RECORD_S = 3600.0


async def _connected_nodes(
    key_value: KeyValue, registry_role: Presence
) -> dict[str, ConnectedNode]:
    """The presence registry and the members' snapshot keys, read as membership reads them:
    the nodes of every instance still in the registry, with how long ago that instance beat
    (one that stopped beating is dead to its peers, and its nodes are judged stale)."""
    view = await registry_role.presence_read(PRESENCE, stall_after_s=_NO_STALL_RECORD_S)
    ages = {e.member: max(0.0, view.now - e.last_beat) for e in view.entries}
    snapshots = []
    presences = [registry.decode_presence(e.data) for e in view.entries]
    fetch = [snapshot_key(p.instance_id) for p in presences if p is not None and p.digest]
    stored = await key_value.get_many(fetch) if fetch else []
    for presence in presences:
        if presence is not None and not presence.digest:  # a writer that predates digests
            snapshots.append(registry.legacy_snapshot(presence))
    for data in stored:
        snapshot = registry.decode_snapshot(data) if data is not None else None
        if snapshot is not None:
            snapshots.append(snapshot)
    found: dict[str, tuple[float, ConnectedNode]] = {}
    for snapshot in snapshots:
        for node in snapshot.nodes:
            # During a replace an identity shows on two instances: the newer connection wins.
            if node.node_id in found and found[node.node_id][0] >= node.connected_at:
                continue
            live = ConnectedNode(
                node.node_id,
                snapshot.instance_id,
                tuple(node.models),
                node.max_parallel,
                node.vram_gb,
                conn_id=node.conn_id,
                owner_age_s=ages.get(snapshot.instance_id, _NO_STALL_RECORD_S),
            )
            found[node.node_id] = (node.connected_at, live)
    return {node_id: live for node_id, (_, live) in sorted(found.items())}


async def _read_store(settings: Settings) -> Observed:
    coordination = coordination_for(settings)
    async with coordination:
        await coordination.ping()
        monitor = await coordination.monitor.monitor_status()
        hosts = sorted(settings.capacity.hosts)
        facts = await coordination.monitor.host_facts(hosts) if hosts else {}
        connected = await _connected_nodes(coordination.key_value, coordination.presence)
        node_facts = await coordination.leases.node_facts(sorted(connected))
        switch = await coordination.monitor.host_placement()
    return Observed(
        monitor=monitor, facts=facts, connected=connected, node_facts=node_facts, switch=switch
    )


async def _probe_hosts(settings: Settings) -> dict[str, dict[str, Any]]:
    timeout = min(PROBE_TIMEOUT_S, settings.monitor_poll_timeout_s)
    records: dict[str, dict[str, Any]] = {}

    async def one(client: httpx.AsyncClient, host_id: str) -> None:
        records[host_id] = await poll_host(
            client, host_id, settings.capacity.hosts[host_id], timeout
        )

    async with httpx.AsyncClient(timeout=timeout) as client, trio.open_nursery() as nursery:
        for host_id in sorted(settings.capacity.hosts):
            nursery.start_soon(one, client, host_id)
    return dict(sorted(records.items()))


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def observe(settings: Settings, *, probe: bool) -> Observed:
    """Everything the audit judges; a store that does not answer gives ``redis_error``."""
    probes = await _probe_hosts(settings) if probe else None
    redis_error = None
    try:
        observed = await _read_store(settings)
    except* CoordinationUnavailable as group:
        redis_error = str(_first_leaf(group))
    if redis_error is not None:
        return Observed(redis_error=redis_error, probes=probes)
    return Observed(
        monitor=observed.monitor,
        facts=observed.facts,
        connected=observed.connected,
        node_facts=observed.node_facts,
        switch=observed.switch,
        probes=probes,
    )
