"""The coordination interface: one small Protocol per role, and the semantics of each.

A backend is one object per role, all on one shared link to the store (``memory/``: the
``MemoryState``; ``redis/``: the ``RedisLink``), handed out by its ``Coordination`` bundle
(``bundle.py``) as the attributes named in ``ROLES``. A caller is handed the role it uses and
typed on it, so its signature says what it touches and a test double needs only that role's
methods. tests/coordinator/test_coordination_roles.py checks that each backend's role objects
meet their Protocol, that no role has more than a dozen methods, and that every bundle hands
out every role. Capacity leases have their semantics in ``leases.py``, the monitor in
``monitor_types.py``, key names in ``keys.py``.

Semantics every backend honours (the contract suites check each):

* Keys are plain strings relative to the backend's key prefix; values are bytes.
* TTLs are seconds (floats allowed; Redis rounds to milliseconds). A key past its TTL reads as
  absent everywhere. ``ttl_s=None`` means no expiry.
* Every method is atomic with respect to every other call on the same backend.
* Pub/sub is at-most-once: a message published while nobody is subscribed is lost; ``publish``
  returns how many subscribers it reached, which is how a sender learns its peer is gone.
* When the backend cannot be reached, every method raises ``CoordinationUnavailable`` (within
  about a second, never a hang); the caller decides whether to fail closed (placement, rate
  limits) or degrade. One that did not answer in time raises its subclass
  ``CoordinationTimeout`` (slow, maybe not down, and the call may still be carried out): those
  callers wait and call again, up to the store outage bound (``core/liveness.py``).

The Protocols are runtime-checkable so that a test can assert a role object is a role; the
check sees only that the methods exist, so mypy is what proves the signatures match.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from coordinator.coordination.base import PresenceView, RateDecision, Subscription
from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    LeaseUsage,
    NodeFacts,
)
from coordinator.coordination.monitor_types import (
    HostFacts,
    MonitorClaim,
    MonitorStatus,
    PlacementSwitch,
)

__all__ = [
    "PREFIX_HOLDERS_KEPT",
    "ROLES",
    "KeyValue",
    "Leases",
    "Lifecycle",
    "MonitorStore",
    "PrefixAffinity",
    "Presence",
    "PubSub",
    "RateLimits",
    "TelemetryStore",
]


@runtime_checkable
class KeyValue(Protocol):
    """Expiring keys holding bytes, with atomic compare, swap and counter operations."""

    async def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None when absent or expired."""

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values of several keys in one round trip (None for absent ones), in order."""

    async def set(
        self, key: str, value: bytes, *, ttl_s: float | None = None, only_if_absent: bool = False
    ) -> bool:
        """Store ``value``. With ``only_if_absent`` nothing is written when the key exists.
        Returns whether the value was written."""

    async def swap(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bytes | None:
        """Store ``value`` and return the previous value (None if there was none)."""

    async def swap_many(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        ttl_s: float | None = None,
        bump: str | None = None,
    ) -> list[bytes | None]:
        """``swap`` for each (key, value), in order; the previous values. With ``bump``, the
        integer at that key goes up by one in the same atomic step as the swaps (readers of the
        counter never see the swaps without it). Redis: one script per ``REFRESH_BATCH`` keys;
        memory: one step."""

    async def compare_and_set(
        self,
        key: str,
        expected: bytes | None,
        value: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        """If the current value equals ``expected`` (None: the key is absent), replace it with
        ``value`` (None: delete the key). Returns whether the swap happened."""

    async def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        """Reset the TTL of ``key`` to ``ttl_s`` only if it still holds ``expected``."""

    async def refresh_many(self, expected: Sequence[tuple[str, bytes]], ttl_s: float) -> list[bool]:
        """``refresh_if`` for each (key, expected value), in order. Redis: one round trip per
        ``REFRESH_BATCH`` keys; memory: one ``refresh_if`` at a time."""

    async def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        """Add ``amount`` to the integer at ``key`` (absent counts as 0) and return the new value.
        ``ttl_s`` is applied when the key is created by this call."""

    async def keys_with_prefix(self, prefix: str) -> list[str]:
        """All live keys starting with ``prefix`` (relative names, any order)."""


@runtime_checkable
class RateLimits(Protocol):
    """The exact shared rate limit."""

    async def rate_limit(
        self, key: str, *, limit: int, period_s: float, token: str | None = None
    ) -> RateDecision:
        """Exact shared rate limit (sliding-window log): a call is allowed only if fewer than
        ``limit`` calls were allowed for ``key`` in the last ``period_s`` seconds, so no window of
        ``period_s`` ever holds more than ``limit`` allowed calls. Decided atomically against one
        clock (Redis: server TIME). Refused calls are not recorded.

        ``token`` names the caller's one request: a call whose token was already allowed within
        the window is allowed again and not counted twice, so asking again after a timeout (the
        first call may have been counted, its answer lost) costs the key nothing."""


@runtime_checkable
class Presence(Protocol):
    """Registries of members, each stamped with the backend's own clock at its last beat, so
    that every reader compares beats against one clock. Every presence call also records, on
    that clock, the windows in which no presence call ran for longer than ``stall_after_s``: a
    backend that was stalled (SIGSTOPped, unreachable for everyone) leaves that trace."""

    async def presence_beat(
        self,
        registry: str,
        member: str,
        data: bytes,
        *,
        stall_after_s: float,
        forget_after_s: float,
    ) -> PresenceView:
        """Stamp ``member`` with the backend's time and store ``data`` with it; forget members
        whose last beat is older than ``forget_after_s``; return the registry as it is now."""

    async def presence_read(self, registry: str, *, stall_after_s: float) -> PresenceView:
        """The registry now (``previous_beat`` None, ``stalls`` empty)."""

    async def presence_leave(self, registry: str, member: str) -> None:
        """Remove ``member`` at once (a graceful exit)."""


@runtime_checkable
class Leases(Protocol):
    """Capacity leases, the node facts they are judged against, and the admission queue
    (semantics: ``leases.py``)."""

    async def put_node_facts(self, facts: NodeFacts) -> None:
        """Record what placement may rely on about a node (its owner calls this)."""

    async def put_many_node_facts(self, facts: Sequence[NodeFacts]) -> None:
        """``put_node_facts`` for several nodes (Redis: one HSET; memory: one at a time)."""

    async def drop_node_facts(self, node_id: str, conn_id: str) -> None:
        """Forget the node's facts if they are still those of ``conn_id``."""

    async def node_facts(self, node_ids: Sequence[str]) -> dict[str, NodeFacts]:
        """The recorded facts of each of ``node_ids`` that has some (``gemmanet audit``)."""

    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        """Reserve a candidate node for the request, or queue it, in one atomic step."""

    async def renew_leases(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> list[bool]:
        """Extend each (node id, lease id) still held to ``ttl_s`` from now; which were."""

    async def release(self, release: LeaseRelease, rules: AdmissionRules) -> list[tuple[str, str]]:
        """End a request's lease, queue entry and active-set entry. Returns (model, instance)
        for each of ``release.wake_models`` whose queue is not empty: the instance of its first
        entry."""

    async def lease_usage(self, node_ids: Sequence[str]) -> dict[str, LeaseUsage]:
        """Active leases and memory in use per node."""

    async def queue_depths(self, models: Sequence[str], rules: AdmissionRules) -> dict[str, int]:
        """Requests waiting per model."""


@runtime_checkable
class TelemetryStore(Protocol):
    """Bounded, expiring histories of host telemetry samples (read-only for placement:
    nothing here changes a budget)."""

    async def append_telemetry(
        self, node_id: str, sample: bytes, *, keep: int, ttl_s: float
    ) -> None:
        """Append ``sample`` to the node's history, keep its last ``keep`` samples, and let the
        whole history expire ``ttl_s`` after this append, in one atomic step."""

    async def telemetry_history(self, node_id: str) -> list[bytes]:
        """The node's samples, oldest first (empty when it has none)."""

    async def latest_telemetry(self, node_ids: Sequence[str]) -> dict[str, bytes]:
        """The newest sample of each node that has one, in one round trip."""


@runtime_checkable
class MonitorStore(Protocol):
    """The elected monitor's lease, the host facts it writes fenced by its epoch, and the
    switch of placement on those hosts (semantics: ``monitor_types.py``)."""

    async def monitor_acquire(self, candidate: str, ttl_s: float) -> MonitorClaim:
        """Take the monitor lease if it is free or expired (the epoch goes up by one and is
        returned as the fencing token); otherwise report who holds it."""

    async def monitor_renew(self, candidate: str, epoch: int, ttl_s: float) -> bool:
        """Extend the lease to ``ttl_s`` only if ``candidate`` still holds it with ``epoch``."""

    async def monitor_resign(self, candidate: str, epoch: int) -> bool:
        """Give the lease up (a graceful stop) if ``candidate`` holds it with ``epoch``."""

    async def monitor_status(self) -> MonitorStatus:
        """The lease, the newest epoch and the count of fenced rejects, in one read."""

    async def write_host_facts(
        self, candidate: str, epoch: int, host_id: str, record: bytes, *, fenced: bool = True
    ) -> bool:
        """Store ``record`` (JSON) as the host's facts, stamped with the store's clock, only if
        ``epoch`` is the current epoch and ``candidate`` holds the lease with it; a rejected
        write changes no fact and counts in ``monitor:fenced_rejects``. Returns whether it was
        accepted. ``fenced=False`` is the test-only switch that skips the compare."""

    async def host_facts(self, host_ids: Sequence[str] | None = None) -> dict[str, HostFacts]:
        """The latest accepted facts of each host that has some (all hosts when None), each
        with its write time and age on the store's clock."""

    async def accepted_fact_writes(self, epoch: int) -> int:
        """How many fact writes made with ``epoch`` were accepted (kept for an hour)."""

    async def host_placement(self) -> PlacementSwitch | None:
        """The placement switch as last set (None: never set, or not a switch: off)."""

    async def set_host_placement(self, switch: PlacementSwitch) -> None:
        """Set the placement switch; it holds, without expiry, until set again."""


#: nodes kept per prefix block (the most recent): a prefix many conversations share (a system
#: prompt) is held by many nodes, and any few of them are as good a guess
PREFIX_HOLDERS_KEPT = 4


@runtime_checkable
class PrefixAffinity(Protocol):
    """Which nodes served which prefix blocks of a model (``core/placement/affinity.py``): a
    prediction of their KV caches, shared by every instance, expiring and bounded in size."""

    async def prefix_holders(self, model: str, hashes: Sequence[str]) -> list[list[str]]:
        """For each of ``hashes``, in order, the nodes recorded as holding that block of
        ``model`` within the TTL of their record, most recent first (empty: none). One
        round trip."""

    async def record_prefix(
        self, model: str, node_id: str, hashes: Sequence[str], *, ttl_s: float, max_blocks: int
    ) -> None:
        """Record ``node_id`` as holding each of ``hashes`` for ``ttl_s`` (a block keeps its
        ``PREFIX_HOLDERS_KEPT`` most recent holders). A model keeps at most ``max_blocks``
        blocks: past that, the least recently recorded go first. One round trip."""


@runtime_checkable
class PubSub(Protocol):
    """At-most-once publish/subscribe."""

    async def publish(self, channel: str, payload: bytes) -> int:
        """Send ``payload`` to the current subscribers of ``channel``; returns how many."""

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe for the duration of the ``async with`` block."""

    async def subscriber_count(self, channel: str) -> int:
        """How many subscribers ``channel`` has right now (PUBSUB NUMSUB)."""


@runtime_checkable
class Lifecycle(Protocol):
    """Reachability and shutdown of the backend (the bundle's own, not a handed-out role)."""

    async def ping(self) -> None:
        """Raise CoordinationUnavailable unless the backend answers."""

    async def aclose(self) -> None:
        """Release connections. Idempotent."""


#: the roles a ``Coordination`` bundle hands out: attribute name -> the Protocol it meets
ROLES: dict[str, type] = {
    "key_value": KeyValue,
    "rate_limits": RateLimits,
    "presence": Presence,
    "leases": Leases,
    "telemetry": TelemetryStore,
    "monitor": MonitorStore,
    "pubsub": PubSub,
    "affinity": PrefixAffinity,
}
