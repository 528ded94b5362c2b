"""Capacity leases and the shared admission queue: the types of that part of the coordination
interface, and the semantics every backend honours (``memory/leases.py`` is the reference,
``redis/lease_scripts.py`` the same thing as Lua scripts on the server's clock).

* **Node facts** (``put_node_facts``) are written by the instance that owns a node's
  connection, when it connects and when its resident models change; ``drop_node_facts``
  removes them when that connection ends. Facts are *fresh* while their owner instance beats
  in the presence registry (``AdmissionRules.presence_registry``) within ``facts_stale_s``.
* **``admit``** is one atomic step, one round trip: it enters the request in its API key's
  active set (running or queued, at most ``max_active_per_key``), keeps the model's queue in
  its order (a request that is not the queue's head waits; *The queue's order* below), then
  tries the candidate nodes in the caller's order and reserves the first that has room: its facts are
  those of the candidate's connection and fresh, fewer leases than ``max_parallel``, and the
  memory budget holds the resident models, the models and KV budgets of its active leases and
  what this request adds. A reservation is a lease with a TTL (server time); the grant takes
  the request out of the queue. Without room it joins the queue (``queued``), or is refused
  (``queue_full``, ``key_limit``, or ``refused`` when no candidate is usable at all: every one
  stale or gone).
* **The rate limit in the same step** (``LeaseAsk.rate``, optional): before anything else,
  the ask counts its request in the key's sliding-window log exactly as
  ``RateLimits.rate_limit`` does (same key, same token: a token already in the window is not
  counted again). Over the limit, the answer is ``rate_limited`` with ``retry_after_s`` and
  nothing else changes (no active-set entry, no queue entry, no lease). So a request's rate
  limit and its admission cost one round trip, not two.
* **Asking again is safe.** An ask is idempotent per request: a request already in the queue
  keeps its place, one already in its key's active set is not counted twice. An ask whose
  ``lease_id`` was granted to an earlier copy of it whose answer never came back (it timed
  out, yet was carried out) is marked ``again``: it is then granted that very lease once more
  (no second one) when the lease is unexpired on one of its candidates whose facts are still
  that candidate's connection and fresh; otherwise that lease is dropped and the ask goes on
  as any other.
* A queue entry ends when its request is granted or released, when its own expiry passes, or
  when its instance stops beating (``requester_stale_s``): a dead instance's entries do not
  block the queue. Likewise a dead instance's entries in an active set stop counting.
* **``renew_leases``** extends leases that are still held; **``release``** ends a request:
  its lease (if any), its queue entry and its active-set entry, and returns, for each model
  in ``wake_models`` with a queue, the instance whose request is first in it now (the caller
  tells that instance to try again).

**The queue's order** (``AdmissionRules.queue_policy``). ``fifo``: the head is the oldest
entry. ``fair``: weighted round robin by deficit counters over the API keys with entries
(each key's own entries oldest first). The keys with entries form a ring in the order they
joined it; the key at its front has a deficit, the grants left in its turn. A key joins at the
back with its deficit set to its weight (``LeaseAsk.weight`` of the ask that queued its
newest entry; every grant costs 1). The head is the oldest entry of the front key. Granting
the head takes 1 off the deficit; at 0 the key goes to the back of the ring with its deficit
set to its weight again; a key whose last entry leaves (granted, released or dropped) leaves
the ring, and its deficit with it. An entry dropped at the head costs nothing. A request
granted at once (nobody queued) changes nothing. ``position`` is the number of grants the
queue makes before this request if nothing else arrives (under ``fifo``: entries ahead), and
``head`` the request id at the head after the call (a waiter that is not the head can wake it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Admission",
    "AdmissionRules",
    "LeaseAsk",
    "LeaseRelease",
    "LeaseUsage",
    "NodeFacts",
    "Outcome",
    "QueuePolicy",
    "RateAsk",
    "RefusalReason",
]

#: Why a candidate node was not reserved: its facts name another connection or none ("gone"),
#: its owner stopped beating ("stale"), all its parallel slots are leased ("full"), or the
#: request's memory does not fit in its budget ("memory").
RefusalReason = Literal["gone", "stale", "full", "memory"]
Outcome = Literal["granted", "queued", "queue_full", "key_limit", "refused", "rate_limited"]
#: the order of a model's queue: ``fifo`` (first come, first served) or ``fair`` (API keys in
#: weighted round robin by deficit counters, each key's own requests first come first served)
QueuePolicy = Literal["fifo", "fair"]


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What placement may rely on about one node, written by its owner instance."""

    node_id: str
    conn_id: str
    instance_id: str
    max_parallel: int
    #: GPU memory budget in GB (all memory the node may use for model residency); None: only
    #: the parallel budget is checked
    memory_gb: float | None = None
    #: models resident now, with their resident size in GB from the model catalog (0: unknown)
    resident: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AdmissionRules:
    """Settings every admission call carries (the same on every instance)."""

    #: presence registry whose beats tell which instances are alive
    presence_registry: str
    #: node facts whose owner has not beaten for this long are not trusted
    facts_stale_s: float
    #: queue and active-set entries of an instance silent this long are dropped
    requester_stale_s: float
    lease_ttl_s: float
    queue_max: int
    #: 0: unlimited
    max_active_per_key: int = 0
    #: how a model's queue is ordered (every instance must use the same)
    queue_policy: QueuePolicy = "fifo"


@dataclass(frozen=True, slots=True)
class RateAsk:
    """The rate limit an ask counts its request against first (``RateLimits.rate_limit``'s
    arguments): ``key`` is the log's name (``keys.rate_limit_key``)."""

    key: str
    limit: int
    period_s: float
    #: the request's token: every ask of one request carries the same
    token: str

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit!r}")
        if not self.period_s > 0:
            raise ValueError(f"period_s must be positive, got {self.period_s!r}")


@dataclass(frozen=True, slots=True)
class LeaseAsk:
    """One admission attempt of one request."""

    request_id: str
    #: the requester instance (its queue entry dies with it)
    instance_id: str
    key_id: str
    model: str
    #: the model's resident size and per-request KV budget in GB (0 when the catalog has none)
    model_gb: float
    kv_gb: float
    #: (node id, connection id) in order of preference
    candidates: tuple[tuple[str, str], ...]
    #: unique per attempt; becomes the lease id when granted
    lease_id: str
    #: a queue entry this call creates expires this long after it is created
    queue_entry_ttl_s: float
    #: an earlier ask of this very ``lease_id`` got no answer (it timed out): a lease it may
    #: have been granted is looked for on the candidates first (see the module docstring)
    again: bool = False
    #: the key's weight in the ``fair`` queue (its priority, 1-100): grants per turn
    weight: int = 1
    #: count the request against this rate limit first (None: its limit is counted already)
    rate: RateAsk | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.weight, int) or self.weight < 1:
            raise ValueError(f"a queue weight is a whole number of at least 1: {self.weight!r}")
        if "\t" in self.key_id:
            raise ValueError(f"a key id holds no tab: {self.key_id!r}")


@dataclass(frozen=True, slots=True)
class LeaseRelease:
    """What a request gives back: its lease on ``lease`` (node id, lease id) if any, its
    queue entry for ``model`` and its entry in ``key_id``'s active set (empty: keep those, the
    request goes on elsewhere). The heads of the queues of ``wake_models`` are reported.

    ``maybe_leases``: (node id, lease id) of leases an ask that got no answer may have been
    granted; each is ended if it exists (nothing happens for one that does not), so a lease
    nobody heard of is not held until its TTL."""

    request_id: str
    key_id: str = ""
    model: str = ""
    lease: tuple[str, str] | None = None
    wake_models: Sequence[str] = ()
    maybe_leases: Sequence[tuple[str, str]] = ()


@dataclass(frozen=True, slots=True)
class Admission:
    outcome: Outcome
    node_id: str = ""
    conn_id: str = ""
    lease_id: str = ""
    #: queued: requests ahead of this one
    position: int = 0
    #: per candidate node not reserved, why
    refusals: dict[str, RefusalReason] = field(default_factory=dict)
    #: granted with others still queued for the model: the instance of the first of them
    next_in_queue: str = ""
    #: granted: the request id at the (usable) head after this call; queued: the one first in
    #: the queue as it stands (maybe this very request); "" for an empty queue
    head: str = ""
    #: rate_limited: when the request would be allowed (as ``RateDecision.retry_after_s``)
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LeaseUsage:
    leases: int
    memory_gb: float
