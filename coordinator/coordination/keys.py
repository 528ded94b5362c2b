"""Every key and channel name of the shared store, in one place.

Names are relative to the backend's key prefix (``GEMMANET_KEY_PREFIX``; the Redis backend
puts ``<prefix>:`` before each, or ``{<prefix>}:`` on a Cluster, ``redis/connect/cluster.py``).
The memory backend keeps the same names in its state where it keeps keys at all.

The instance registry (``core/registry.py`` is what the values hold):

    inst:registry           presence registry (the ``Presence`` role): each instance's last
                            beat on the backend's clock, with a ``PresenceData`` digest of its
                            snapshot as the data (a few dozen bytes, whatever the node count);
                            on Redis also ``…:data``, ``…:pulse`` and ``…:stalls``
    inst:snapshot:{inst}    the instance's full InstanceSnapshot, written before the beat that
                            names its digest, only when it changed (and every
                            SNAPSHOT_REWRITE_S, its TTL being FORGET_AFTER_S): peers fetch it
                            only when the digest in the registry moved
    node:owner:{node}       "{instance} {conn_id}" of the connection that owns the identity
    node:owners-changed     counts the claims of node identities cluster-wide
    lock:single-instance    the instance id holding the single-instance lock
    ratelimit:{key id}      an API key's sliding-window log (a sorted set on Redis)

Capacity leases and queues (Redis; ``redis/lease_scripts.py`` says what each holds):
``lease:facts``, ``lease:n:{node}``, ``lease:i:{node}``, ``lease:q:{model}``,
``lease:qi:{model}``, ``lease:qk:{model}``, ``lease:qr:{model}``, ``lease:qd:{model}``,
``lease:a:{key id}``. Prefix affinity: ``affinity:b:{model}``, ``affinity:t:{model}``
(``redis/affinity.py``). Host telemetry: ``telemetry:{node}``. The monitor
(``monitor_types.py``): ``monitor:lease``, ``monitor:epoch``, ``monitor:fenced_rejects``,
``monitor:facts``, ``monitor:facts_at``, ``monitor:accepted:{epoch}``; the placement switch
of direct hosts (``gemmanet audit --enable``): ``hosts:placement``.

The instance bus: the pub/sub channel ``inst:bus:{inst}`` (``PubSubBus``); the stream
``inst:stream:{inst}``, its presence key ``inst:listening:{inst}`` and ``inst:refused:{inst}``,
the server time an envelope for it was last refused for want of a presence (``StreamsBus``).
"""

from __future__ import annotations

__all__ = [
    "HOST_PLACEMENT",
    "INBOX_PREFIX",
    "LEASE_FACTS",
    "LISTENING_PREFIX",
    "MONITOR_EPOCH",
    "MONITOR_FACTS",
    "MONITOR_FACTS_AT",
    "MONITOR_FENCED_REJECTS",
    "MONITOR_LEASE",
    "OWNERS_CHANGED",
    "OWNER_PREFIX",
    "PRESENCE",
    "REFUSED_PREFIX",
    "SINGLE_INSTANCE_LOCK",
    "SNAPSHOT_PREFIX",
    "STREAM_PREFIX",
    "affinity_keys",
    "inbox",
    "lease_active_key",
    "lease_node_keys",
    "lease_queue_keys",
    "listening_key",
    "monitor_accepted_key",
    "owner_key",
    "presence_keys",
    "rate_limit_key",
    "refused_key",
    "snapshot_key",
    "stream_key",
    "telemetry_key",
]

# -- the instance registry ------------------------------------------------------------------

PRESENCE = "inst:registry"
OWNER_PREFIX = "node:owner:"
#: counts the claims of node identities cluster-wide: an instance re-reads its nodes' owner
#: records only when it moved (runtime/cluster/ownership.py), not every beat
OWNERS_CHANGED = "node:owners-changed"
SINGLE_INSTANCE_LOCK = "lock:single-instance"
SNAPSHOT_PREFIX = "inst:snapshot:"


def owner_key(node_id: str) -> str:
    return OWNER_PREFIX + node_id


def snapshot_key(instance_id: str) -> str:
    return SNAPSHOT_PREFIX + instance_id


def rate_limit_key(key_id: str) -> str:
    return f"ratelimit:{key_id}"


def presence_keys(registry: str) -> list[str]:
    """The keys of one presence registry on Redis: the beats (a sorted set), their data, the
    time of the last presence call and the stall windows (``redis/scripts.py`` PRESENCE)."""
    return [registry, registry + ":data", registry + ":pulse", registry + ":stalls"]


# -- capacity leases and admission queues (Redis) --------------------------------------------

LEASE_FACTS = "lease:facts"


def lease_node_keys(node_id: str) -> list[str]:
    """A node's leases (by expiry) and their records."""
    return [f"lease:n:{node_id}", f"lease:i:{node_id}"]


def lease_queue_keys(model: str) -> list[str]:
    """A model's admission queue (by arrival), its entries' records, and the fair order's
    per-key order, ring of keys and deficits (``redis/lease_scripts.py``)."""
    return [f"lease:{part}:{model}" for part in ("q", "qi", "qk", "qr", "qd")]


def lease_active_key(key_id: str) -> str:
    """An API key's active set (running or queued requests)."""
    return f"lease:a:{key_id}"


# -- prefix affinity (Redis) -------------------------------------------------------------------


def affinity_keys(model: str) -> list[str]:
    """A model's prefix blocks (a hash: block -> its holders and their record deadlines) and
    the blocks by their latest deadline (a sorted set: what expires or goes first)."""
    return [f"affinity:b:{model}", f"affinity:t:{model}"]


# -- host telemetry (Redis) --------------------------------------------------------------------


def telemetry_key(node_id: str) -> str:
    """A node's telemetry history (a list)."""
    return f"telemetry:{node_id}"


# -- the monitor election and its fenced facts -------------------------------------------------

MONITOR_LEASE = "monitor:lease"
MONITOR_EPOCH = "monitor:epoch"
MONITOR_FENCED_REJECTS = "monitor:fenced_rejects"
#: one hash (Redis) of host id -> JSON record, and one of host id -> write time in microseconds
MONITOR_FACTS = "monitor:facts"
MONITOR_FACTS_AT = "monitor:facts_at"


def monitor_accepted_key(epoch: int) -> str:
    return f"monitor:accepted:{epoch}"


#: the switch of placement on direct hosts (``monitor_types.PlacementSwitch``), no expiry
HOST_PLACEMENT = "hosts:placement"


# -- the instance bus ---------------------------------------------------------------------------

INBOX_PREFIX = "inst:bus:"
STREAM_PREFIX = "inst:stream:"
LISTENING_PREFIX = "inst:listening:"
REFUSED_PREFIX = "inst:refused:"


def inbox(instance_id: str) -> str:
    """The pub/sub channel of ``instance_id``'s inbox."""
    return INBOX_PREFIX + instance_id


def stream_key(instance_id: str) -> str:
    return STREAM_PREFIX + instance_id


def listening_key(instance_id: str) -> str:
    return LISTENING_PREFIX + instance_id


def refused_key(instance_id: str) -> str:
    return REFUSED_PREFIX + instance_id
