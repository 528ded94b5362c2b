"""The body of ``GET /api/v1/cluster``, what the System Health page polls.

Kept apart from ``schemas`` (it only adds Structs) and documented in /openapi.json like every
other response. Node details (``nodes``) and the queue per model (``queued``, which names the
models) are for operator keys only: any other key gets the instances' liveness and the
aggregate counts, with both null.
"""

from __future__ import annotations

from typing import Literal

from coordinator.api.schemas import NodeInfo, _Response


class InstanceLiveness(_Response):
    """One instance of the shared registry, as the answering instance's last beat saw it."""

    instance_id: str
    # live: requests are placed on it; stale: silent past the liveness TTL, not yet judged;
    # dead: judged dead and forgotten (listed until the registry drops it, 60 s).
    state: Literal["live", "stale", "dead"]
    # True for the instance that answered this request.
    answering: bool
    # Seconds since its last beat, on the coordination store's clock.
    last_beat_age_s: float
    # From its last snapshot; null when that is not trusted (stale or dead).
    nodes: int | None
    in_flight: int | None


class MonitorInfo(_Response):
    """The elected monitor: the candidate holding the election lease, its epoch (fencing token),
    and how many fact writes from deposed monitors were rejected so far."""

    primary: str
    epoch: int
    fenced_rejects: int


class AffinityInfo(_Response):
    """Prefix-affine placement on the answering instance since it started (docs/affinity.md):
    placements whose lease went to a node predicted to hold some of the prefix (hits), to
    another (misses), or made without a prediction (the lookup failed or was too slow)."""

    enabled: bool
    hits: int
    misses: int
    unavailable: int
    # hits / (hits + misses); null before the first placement
    hit_rate: float | None
    # blocks (256 characters) of the prefix the chosen node held, on average over the hits
    mean_predicted_blocks: float


class QueueWaitInfo(_Response):
    """Requests of one key priority class (``1``, ``2-4``, ``5-9``, ``10-24``, ``25-100``) that
    waited in the shared admission queue on the answering instance since it started."""

    priority: str
    waited: int
    mean_wait_s: float


class PlacementSwitchInfo(_Response):
    """The shared switch of placement on direct hosts, as ``gemmanet audit --enable`` or
    ``--disable`` last set it."""

    enabled: bool
    # Who switched it (``--by``, default user@host) and when (Unix seconds, that machine's clock).
    by: str
    at: float
    # The monitor epoch the audit judged green (an enable), else null.
    epoch: int | None


class HostPlacementInfo(_Response):
    """The enablement gate on the answering instance: its ``GEMMANET_HOST_PLACEMENT``, whether
    it places requests on direct hosts now (hosts whose facts are fresh), how many the operator
    file lists, and the switch as it last read it (null: never set, or the mode is not gated)."""

    mode: Literal["gated", "on", "off"]
    placing: bool
    hosts: int
    switch: PlacementSwitchInfo | None


class ClusterResponse(_Response):
    """Instances, aggregate counts and (operator keys only) node details."""

    instance_id: str
    version: str
    # Unix seconds at which the answering instance built this answer.
    generated_at: float
    # Whether the key is an operator key (``gemmanet keys create --admin``).
    admin: bool
    instances: list[InstanceLiveness]
    online_nodes: int
    in_flight: int
    # Requests waiting for capacity, per model (null unless ``admin``, or when the store
    # cannot be read) and in total (null only when the store cannot be read).
    queued: dict[str, int] | None
    queue_depth: int | None
    monitor: MonitorInfo | None
    # Every online node as in GET /api/v1/nodes; null unless ``admin``.
    nodes: list[NodeInfo] | None
    affinity: AffinityInfo
    # The answering instance's queue waits by key priority class, lowest class first.
    queue_waits: list[QueueWaitInfo]
    host_placement: HostPlacementInfo
