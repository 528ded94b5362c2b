"""The memory backend's role objects (``roles.py``), all but pub/sub (``pubsub.py``): async
facades over one ``MemoryLink``. Each call checkpoints once (``MemoryLink.enter``), then runs
the state's method synchronously, which is what makes it atomic.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.coordination.base import PresenceView, RateDecision
from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    LeaseUsage,
    NodeFacts,
)
from coordinator.coordination.memory.link import MemoryLink
from coordinator.coordination.monitor_types import (
    HostFacts,
    MonitorClaim,
    MonitorStatus,
    PlacementSwitch,
)

__all__ = [
    "MemoryAffinity",
    "MemoryKeyValue",
    "MemoryLeases",
    "MemoryMonitor",
    "MemoryPresence",
    "MemoryRateLimits",
    "MemoryTelemetry",
]


class MemoryKeyValue:
    """``KeyValue`` over the state's keys."""

    def __init__(self, link: MemoryLink) -> None:
        self._link = link

    async def get(self, key: str) -> bytes | None:
        return (await self._link.enter()).get(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return (await self._link.enter()).get_many(keys)

    async def set(
        self, key: str, value: bytes, *, ttl_s: float | None = None, only_if_absent: bool = False
    ) -> bool:
        state = await self._link.enter()
        return state.set(key, value, ttl_s=ttl_s, only_if_absent=only_if_absent)

    async def swap(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bytes | None:
        return (await self._link.enter()).swap(key, value, ttl_s=ttl_s)

    async def swap_many(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        ttl_s: float | None = None,
        bump: str | None = None,
    ) -> list[bytes | None]:
        state = await self._link.enter()  # one step: nothing runs between the swaps and the bump
        previous = [state.swap(key, value, ttl_s=ttl_s) for key, value in items]
        if bump is not None and items:
            state.incr(bump)
        return previous

    async def compare_and_set(
        self,
        key: str,
        expected: bytes | None,
        value: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        return (await self._link.enter()).compare_and_set(key, expected, value, ttl_s=ttl_s)

    async def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        return (await self._link.enter()).refresh_if(key, expected, ttl_s)

    async def refresh_many(self, expected: Sequence[tuple[str, bytes]], ttl_s: float) -> list[bool]:
        # One key per step, as it always was (the simulator's schedules depend on it).
        return [await self.refresh_if(key, value, ttl_s) for key, value in expected]

    async def delete(self, key: str) -> None:
        (await self._link.enter()).delete(key)

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        return (await self._link.enter()).incr(key, amount, ttl_s=ttl_s)

    async def keys_with_prefix(self, prefix: str) -> list[str]:
        return (await self._link.enter()).keys_with_prefix(prefix)


class MemoryRateLimits:
    """``RateLimits`` over the state's sliding-window logs."""

    def __init__(self, link: MemoryLink) -> None:
        self._link = link

    async def rate_limit(
        self, key: str, *, limit: int, period_s: float, token: str | None = None
    ) -> RateDecision:
        return (await self._link.enter()).rate_limit(
            key, limit=limit, period_s=period_s, token=token
        )


class MemoryPresence:
    """``Presence`` over the state's registries (``presence.py``)."""

    def __init__(self, link: MemoryLink) -> None:
        self._link = link

    async def presence_beat(
        self,
        registry: str,
        member: str,
        data: bytes,
        *,
        stall_after_s: float,
        forget_after_s: float,
    ) -> PresenceView:
        return (await self._link.enter()).presence_beat(
            registry, member, data, stall_after_s=stall_after_s, forget_after_s=forget_after_s
        )

    async def presence_read(self, registry: str, *, stall_after_s: float) -> PresenceView:
        return (await self._link.enter()).presence_read(registry, stall_after_s=stall_after_s)

    async def presence_leave(self, registry: str, member: str) -> None:
        (await self._link.enter()).presence.leave(registry, member)


class MemoryLeases:
    """``Leases`` over the state's lease tables (``leases.py``, the reference semantics)."""

    def __init__(self, link: MemoryLink) -> None:
        self._link = link

    async def put_node_facts(self, facts: NodeFacts) -> None:
        (await self._link.enter()).leases.put_facts(facts)

    async def put_many_node_facts(self, facts: Sequence[NodeFacts]) -> None:
        # One node per step, as it always was (the simulator's schedules depend on it).
        for one in facts:
            await self.put_node_facts(one)

    async def drop_node_facts(self, node_id: str, conn_id: str) -> None:
        (await self._link.enter()).leases.drop_facts(node_id, conn_id)

    async def node_facts(self, node_ids: Sequence[str]) -> dict[str, NodeFacts]:
        leases = (await self._link.enter()).leases
        found = {node_id: leases.facts(node_id) for node_id in node_ids}
        return {node_id: facts for node_id, facts in found.items() if facts is not None}

    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        state = await self._link.enter()
        rate = ask.rate
        if rate is not None:  # the same step: nothing runs between the two
            decision = state.rate_limit(
                rate.key, limit=rate.limit, period_s=rate.period_s, token=rate.token
            )
            if not decision.allowed:
                return Admission("rate_limited", retry_after_s=decision.retry_after_s)
        return state.leases.admit(ask, rules, state.now())

    async def renew_leases(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> list[bool]:
        state = await self._link.enter()
        return state.leases.renew(leases, ttl_s, state.now())

    async def release(self, release: LeaseRelease, rules: AdmissionRules) -> list[tuple[str, str]]:
        state = await self._link.enter()
        return state.leases.release(release, rules, state.now())

    async def lease_usage(self, node_ids: Sequence[str]) -> dict[str, LeaseUsage]:
        state = await self._link.enter()
        return state.leases.usage(node_ids, state.now())

    async def queue_depths(self, models: Sequence[str], rules: AdmissionRules) -> dict[str, int]:
        state = await self._link.enter()
        return state.leases.queue_depths(models, rules, state.now())


class MemoryTelemetry:
    """``TelemetryStore`` over the state's histories (``telemetry.py``)."""

    def __init__(self, link: MemoryLink) -> None:
        self._link = link

    async def append_telemetry(
        self, node_id: str, sample: bytes, *, keep: int, ttl_s: float
    ) -> None:
        state = await self._link.enter()
        state.telemetry.append(node_id, sample, keep, ttl_s, state.now())

    async def telemetry_history(self, node_id: str) -> list[bytes]:
        state = await self._link.enter()
        return state.telemetry.history(node_id, state.now())

    async def latest_telemetry(self, node_ids: Sequence[str]) -> dict[str, bytes]:
        state = await self._link.enter()
        return state.telemetry.latest(node_ids, state.now())


class MemoryMonitor:
    """``MonitorStore`` over the state's monitor tables (``monitor.py``)."""

    def __init__(self, link: MemoryLink) -> None:
        self._link = link

    async def monitor_acquire(self, candidate: str, ttl_s: float) -> MonitorClaim:
        return (await self._link.enter()).monitor.acquire(candidate, ttl_s)

    async def monitor_renew(self, candidate: str, epoch: int, ttl_s: float) -> bool:
        return (await self._link.enter()).monitor.renew(candidate, epoch, ttl_s)

    async def monitor_resign(self, candidate: str, epoch: int) -> bool:
        return (await self._link.enter()).monitor.resign(candidate, epoch)

    async def monitor_status(self) -> MonitorStatus:
        return (await self._link.enter()).monitor.status()

    async def write_host_facts(
        self, candidate: str, epoch: int, host_id: str, record: bytes, *, fenced: bool = True
    ) -> bool:
        state = await self._link.enter()
        return state.monitor.write(candidate, epoch, host_id, record, fenced=fenced)

    async def host_facts(self, host_ids: Sequence[str] | None = None) -> dict[str, HostFacts]:
        return (await self._link.enter()).monitor.read(host_ids)

    async def accepted_fact_writes(self, epoch: int) -> int:
        return (await self._link.enter()).monitor.accepted(epoch)

    async def host_placement(self) -> PlacementSwitch | None:
        return (await self._link.enter()).monitor.placement()

    async def set_host_placement(self, switch: PlacementSwitch) -> None:
        (await self._link.enter()).monitor.set_placement(switch)


class MemoryAffinity:
    """``PrefixAffinity`` over the state's prefix tables."""

    def __init__(self, link: MemoryLink) -> None:
        self._link = link

    async def prefix_holders(self, model: str, hashes: Sequence[str]) -> list[list[str]]:
        state = await self._link.enter()
        return state.affinity.holders(model, hashes, state.now())

    async def record_prefix(
        self, model: str, node_id: str, hashes: Sequence[str], *, ttl_s: float, max_blocks: int
    ) -> None:
        state = await self._link.enter()
        state.affinity.record(model, node_id, hashes, ttl_s, max_blocks, state.now())
