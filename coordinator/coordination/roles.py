"""The coordination interface cut into roles: one small Protocol per concern of ``Coordination``.

A caller that uses one concern is typed on its role, so its signature says what it touches and
a test double needs only that role's methods. Every backend (a ``Coordination`` subclass) is
structurally every role; tests/coordinator/test_coordination_roles.py checks that, that no role
has more than a dozen methods, and that each public method of ``Coordination`` is in exactly one
role. Signatures are copied from base.py, which (with leases.py and monitor_types.py) keeps the
semantics; the docstrings here are only their first lines.

The Protocols are runtime-checkable so that a test can assert a backend is a role; the check
sees only that the methods exist, so mypy is what proves the signatures match.
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
from coordinator.coordination.monitor_types import HostFacts, MonitorClaim, MonitorStatus

__all__ = [
    "ROLES",
    "KeyValue",
    "Leases",
    "Lifecycle",
    "MonitorStore",
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
        """Store ``value``. With ``only_if_absent`` nothing is written when the key exists."""

    async def swap(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bytes | None:
        """Store ``value`` and return the previous value (None if there was none)."""

    async def swap_many(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        ttl_s: float | None = None,
        bump: str | None = None,
    ) -> list[bytes | None]:
        """``swap`` for each (key, value), in order; the previous values."""

    async def compare_and_set(
        self,
        key: str,
        expected: bytes | None,
        value: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        """If the current value equals ``expected`` (None: the key is absent), replace it with
        ``value`` (None: delete the key)."""

    async def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        """Reset the TTL of ``key`` to ``ttl_s`` only if it still holds ``expected``."""

    async def refresh_many(self, expected: Sequence[tuple[str, bytes]], ttl_s: float) -> list[bool]:
        """``refresh_if`` for each (key, expected value), in order."""

    async def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        """Add ``amount`` to the integer at ``key`` (absent counts as 0) and return the new value."""

    async def keys_with_prefix(self, prefix: str) -> list[str]:
        """All live keys starting with ``prefix`` (relative names, any order)."""


@runtime_checkable
class RateLimits(Protocol):
    """The exact shared rate limit."""

    async def rate_limit(self, key: str, *, limit: int, period_s: float) -> RateDecision:
        """Exact shared rate limit (sliding-window log)."""


@runtime_checkable
class Presence(Protocol):
    """Registries of members stamped with the backend's clock."""

    async def presence_beat(
        self,
        registry: str,
        member: str,
        data: bytes,
        *,
        stall_after_s: float,
        forget_after_s: float,
    ) -> PresenceView:
        """Stamp ``member`` with the backend's time and store ``data`` with it."""

    async def presence_read(self, registry: str, *, stall_after_s: float) -> PresenceView:
        """The registry now (``previous_beat`` None, ``stalls`` empty)."""

    async def presence_leave(self, registry: str, member: str) -> None:
        """Remove ``member`` at once (a graceful exit)."""


@runtime_checkable
class Leases(Protocol):
    """Capacity leases, the node facts they are judged against, and the admission queue."""

    async def put_node_facts(self, facts: NodeFacts) -> None:
        """Record what placement may rely on about a node (its owner calls this)."""

    async def put_many_node_facts(self, facts: Sequence[NodeFacts]) -> None:
        """``put_node_facts`` for several nodes."""

    async def drop_node_facts(self, node_id: str, conn_id: str) -> None:
        """Forget the node's facts if they are still those of ``conn_id``."""

    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        """Reserve a candidate node for the request, or queue it, in one atomic step."""

    async def renew_leases(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> list[bool]:
        """Extend each (node id, lease id) still held to ``ttl_s`` from now; which were."""

    async def release(self, release: LeaseRelease, rules: AdmissionRules) -> list[tuple[str, str]]:
        """End a request's lease, queue entry and active-set entry."""

    async def lease_usage(self, node_ids: Sequence[str]) -> dict[str, LeaseUsage]:
        """Active leases and memory in use per node."""

    async def queue_depths(self, models: Sequence[str], rules: AdmissionRules) -> dict[str, int]:
        """Requests waiting per model."""


@runtime_checkable
class TelemetryStore(Protocol):
    """Bounded, expiring histories of host telemetry samples."""

    async def append_telemetry(
        self, node_id: str, sample: bytes, *, keep: int, ttl_s: float
    ) -> None:
        """Append ``sample`` to the node's history, keep its last ``keep`` samples."""

    async def telemetry_history(self, node_id: str) -> list[bytes]:
        """The node's samples, oldest first (empty when it has none)."""

    async def latest_telemetry(self, node_ids: Sequence[str]) -> dict[str, bytes]:
        """The newest sample of each node that has one, in one round trip."""


@runtime_checkable
class MonitorStore(Protocol):
    """The elected monitor's lease and the host facts it writes fenced by its epoch."""

    async def monitor_acquire(self, candidate: str, ttl_s: float) -> MonitorClaim:
        """Take the monitor lease if it is free or expired; otherwise report who holds it."""

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
        ``epoch`` is the current epoch and ``candidate`` holds the lease with it."""

    async def host_facts(self, host_ids: Sequence[str] | None = None) -> dict[str, HostFacts]:
        """The latest accepted facts of each host that has some (all hosts when None)."""

    async def accepted_fact_writes(self, epoch: int) -> int:
        """How many fact writes made with ``epoch`` were accepted (kept for an hour)."""


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
    """Reachability and shutdown of the backend."""

    async def ping(self) -> None:
        """Raise CoordinationUnavailable unless the backend answers."""

    async def aclose(self) -> None:
        """Release connections. Idempotent."""


#: every role, in base.py's order; together they are exactly the methods of ``Coordination``
ROLES: tuple[type, ...] = (
    KeyValue,
    RateLimits,
    Presence,
    Leases,
    TelemetryStore,
    MonitorStore,
    PubSub,
    Lifecycle,
)
