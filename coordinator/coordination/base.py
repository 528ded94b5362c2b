"""The coordination interface shared by the memory and Redis backends.

Semantics every backend honours (the contract suite checks each):

* Keys are plain strings relative to the backend's key prefix; values are bytes.
* TTLs are seconds (floats allowed; Redis rounds to milliseconds). A key past its TTL reads as
  absent everywhere. ``ttl_s=None`` means no expiry.
* Every method is atomic with respect to every other call on the same backend.
* Pub/sub is at-most-once: a message published while nobody is subscribed is lost; ``publish``
  returns how many subscribers it reached, which is how a sender learns its peer is gone.
* When the backend cannot be reached, every method raises ``CoordinationUnavailable`` (within
  about a second, never a hang); the caller decides whether to fail closed (placement, rate
  limits) or degrade.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

# Defined with the coordinator's other errors (HTTP 503, close code 1013); part of this interface.
from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    LeaseUsage,
    NodeFacts,
)
from coordinator.coordination.monitor_types import HostFacts, MonitorClaim, MonitorStatus
from coordinator.errors import CoordinationUnavailable

__all__ = [
    "Coordination",
    "CoordinationUnavailable",
    "OpObserver",
    "RateDecision",
    "Subscription",
]

#: told (what, seconds, failed) after each store operation; the Redis backend calls it (the
#: metrics' hook, runtime/metrics.py), the in-process one has no latency worth reporting
OpObserver = Callable[[str, float, bool], None]


@dataclass(frozen=True, slots=True)
class RateDecision:
    """Outcome of one rate-limit check."""

    allowed: bool
    # Seconds until a request would be allowed again (0 when allowed).
    retry_after_s: float
    # Requests still allowed right now after this one (best effort, for headers).
    remaining: int


@dataclass(frozen=True, slots=True)
class PresenceEntry:
    """One member of a presence registry."""

    member: str
    #: backend time of the member's last beat, in seconds (Redis: server TIME)
    last_beat: float
    data: bytes


@dataclass(frozen=True, slots=True)
class PresenceView:
    """A presence registry as one atomic call saw it."""

    #: backend time at which the call ran, in seconds (Redis: server TIME)
    now: float
    #: every member not yet forgotten, sorted by member (stale ones included: the caller judges)
    entries: tuple[PresenceEntry, ...]
    #: ``presence_beat`` only: the member's own previous beat (None: absent or forgotten)
    previous_beat: float | None = None
    #: ``presence_beat`` only: windows ``(start, end)`` after ``previous_beat`` in which no
    #: presence call on this registry ran for longer than ``stall_after_s`` (backend stalled)
    stalls: tuple[tuple[float, float], ...] = ()


class Subscription(abc.ABC):
    """Messages of one channel, in publish order, from the moment of subscribing."""

    #: this listen continues one whose connection was lost, with nothing sent in between
    #: missing (only a bus with a ``resume_window_s`` can say so; see ``Bus``)
    resumed: bool = False

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[bytes]: ...


class Coordination(abc.ABC):
    """Shared, expiring, atomic coordination state plus a message bus."""

    #: short name used in logs and /api/v1/status ("memory" or "redis")
    kind: str = "abstract"
    op_observer: OpObserver | None = None

    # -- keys ---------------------------------------------------------------------------------

    @abc.abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None when absent or expired."""

    @abc.abstractmethod
    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values of several keys in one round trip (None for absent ones), in order."""

    @abc.abstractmethod
    async def set(
        self, key: str, value: bytes, *, ttl_s: float | None = None, only_if_absent: bool = False
    ) -> bool:
        """Store ``value``. With ``only_if_absent`` nothing is written when the key exists.
        Returns whether the value was written."""

    @abc.abstractmethod
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
        counter never see the swaps without it). Backends batch it (Redis: one script per
        ``REFRESH_BATCH`` keys); this default swaps one key at a time (not atomic)."""
        previous = [await self.swap(key, value, ttl_s=ttl_s) for key, value in items]
        if bump is not None and items:
            await self.incr(bump)
        return previous

    @abc.abstractmethod
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

    @abc.abstractmethod
    async def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        """Reset the TTL of ``key`` to ``ttl_s`` only if it still holds ``expected``."""

    async def refresh_many(self, expected: Sequence[tuple[str, bytes]], ttl_s: float) -> list[bool]:
        """``refresh_if`` for each (key, expected value), in order. Backends batch it (Redis:
        one round trip per ``REFRESH_BATCH`` keys); this default refreshes one key at a time."""
        return [await self.refresh_if(key, value, ttl_s) for key, value in expected]

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    @abc.abstractmethod
    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        """Add ``amount`` to the integer at ``key`` (absent counts as 0) and return the new value.
        ``ttl_s`` is applied when the key is created by this call."""

    @abc.abstractmethod
    async def keys_with_prefix(self, prefix: str) -> list[str]:
        """All live keys starting with ``prefix`` (relative names, any order)."""

    @abc.abstractmethod
    async def rate_limit(self, key: str, *, limit: int, period_s: float) -> RateDecision:
        """Exact shared rate limit (sliding-window log): a call is allowed only if fewer than
        ``limit`` calls were allowed for ``key`` in the last ``period_s`` seconds, so no window of
        ``period_s`` ever holds more than ``limit`` allowed calls. Decided atomically against one
        clock (Redis: server TIME). Refused calls are not recorded."""

    # -- presence ---------------------------------------------------------------------------------
    # A registry of members, each stamped with the backend's own clock at its last beat, so that
    # every reader compares beats against one clock. Every presence call also records, on that
    # clock, the windows in which no presence call ran for longer than ``stall_after_s``: a
    # backend that was stalled (SIGSTOPped, unreachable for everyone) leaves that trace.

    @abc.abstractmethod
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

    @abc.abstractmethod
    async def presence_read(self, registry: str, *, stall_after_s: float) -> PresenceView:
        """The registry now (``previous_beat`` None, ``stalls`` empty)."""

    @abc.abstractmethod
    async def presence_leave(self, registry: str, member: str) -> None:
        """Remove ``member`` at once (a graceful exit)."""

    # -- capacity leases and the admission queue (semantics: ``leases.py``) ----------------------

    @abc.abstractmethod
    async def put_node_facts(self, facts: NodeFacts) -> None:
        """Record what placement may rely on about a node (its owner calls this)."""

    async def put_many_node_facts(self, facts: Sequence[NodeFacts]) -> None:
        """``put_node_facts`` for several nodes (Redis: one HSET); this default writes one at a
        time."""
        for one in facts:
            await self.put_node_facts(one)

    @abc.abstractmethod
    async def drop_node_facts(self, node_id: str, conn_id: str) -> None:
        """Forget the node's facts if they are still those of ``conn_id``."""

    @abc.abstractmethod
    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        """Reserve a candidate node for the request, or queue it, in one atomic step."""

    @abc.abstractmethod
    async def renew_leases(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> list[bool]:
        """Extend each (node id, lease id) still held to ``ttl_s`` from now; which were."""

    @abc.abstractmethod
    async def release(self, release: LeaseRelease, rules: AdmissionRules) -> list[tuple[str, str]]:
        """End a request's lease, queue entry and active-set entry. Returns (model, instance)
        for each of ``release.wake_models`` whose queue is not empty: the instance of its first
        entry."""

    @abc.abstractmethod
    async def lease_usage(self, node_ids: Sequence[str]) -> dict[str, LeaseUsage]:
        """Active leases and memory in use per node."""

    @abc.abstractmethod
    async def queue_depths(self, models: Sequence[str], rules: AdmissionRules) -> dict[str, int]:
        """Requests waiting per model."""

    # -- host telemetry (read-only for placement: nothing here changes a budget) ---------------

    @abc.abstractmethod
    async def append_telemetry(
        self, node_id: str, sample: bytes, *, keep: int, ttl_s: float
    ) -> None:
        """Append ``sample`` to the node's history, keep its last ``keep`` samples, and let the
        whole history expire ``ttl_s`` after this append, in one atomic step."""

    @abc.abstractmethod
    async def telemetry_history(self, node_id: str) -> list[bytes]:
        """The node's samples, oldest first (empty when it has none)."""

    @abc.abstractmethod
    async def latest_telemetry(self, node_ids: Sequence[str]) -> dict[str, bytes]:
        """The newest sample of each node that has one, in one round trip."""

    # -- the elected monitor and its fenced host facts (semantics: ``monitor_types.py``) -------

    @abc.abstractmethod
    async def monitor_acquire(self, candidate: str, ttl_s: float) -> MonitorClaim:
        """Take the monitor lease if it is free or expired (the epoch goes up by one and is
        returned as the fencing token); otherwise report who holds it."""

    @abc.abstractmethod
    async def monitor_renew(self, candidate: str, epoch: int, ttl_s: float) -> bool:
        """Extend the lease to ``ttl_s`` only if ``candidate`` still holds it with ``epoch``."""

    @abc.abstractmethod
    async def monitor_resign(self, candidate: str, epoch: int) -> bool:
        """Give the lease up (a graceful stop) if ``candidate`` holds it with ``epoch``."""

    @abc.abstractmethod
    async def monitor_status(self) -> MonitorStatus:
        """The lease, the newest epoch and the count of fenced rejects, in one read."""

    @abc.abstractmethod
    async def write_host_facts(
        self, candidate: str, epoch: int, host_id: str, record: bytes, *, fenced: bool = True
    ) -> bool:
        """Store ``record`` (JSON) as the host's facts, stamped with the store's clock, only if
        ``epoch`` is the current epoch and ``candidate`` holds the lease with it; a rejected
        write changes no fact and counts in ``monitor:fenced_rejects``. Returns whether it was
        accepted. ``fenced=False`` is the test-only switch that skips the compare."""

    @abc.abstractmethod
    async def host_facts(self, host_ids: Sequence[str] | None = None) -> dict[str, HostFacts]:
        """The latest accepted facts of each host that has some (all hosts when None), each
        with its write time and age on the store's clock."""

    @abc.abstractmethod
    async def accepted_fact_writes(self, epoch: int) -> int:
        """How many fact writes made with ``epoch`` were accepted (kept for an hour)."""

    # -- bus ----------------------------------------------------------------------------------

    @abc.abstractmethod
    async def publish(self, channel: str, payload: bytes) -> int:
        """Send ``payload`` to the current subscribers of ``channel``; returns how many."""

    @abc.abstractmethod
    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe for the duration of the ``async with`` block."""

    @abc.abstractmethod
    async def subscriber_count(self, channel: str) -> int:
        """How many subscribers ``channel`` has right now (PUBSUB NUMSUB)."""

    # -- lifecycle ----------------------------------------------------------------------------

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise CoordinationUnavailable unless the backend answers."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release connections. Idempotent."""
