"""Faults: the plan drawn from the seed, and the wrappers through which they strike.

Each instance reaches the shared coordination state and the bus through ``FaultyCoordination``
and ``FaultyBus``: a freeze holds every call of that instance until it thaws (a SIGSTOP seen
from outside), a store outage makes every call fail like an unreachable Redis, and bus chaos
drops, delays or duplicates envelopes in flight. The bus (a ``MemoryBus``) meets the freeze and
the outage through ``FaultyCoordination.passage``, its ``before_io`` hook, and its inbox through
``FaultyBus.listen``, so both strike the bus exactly as they strike the store."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

import trio

from coordinator.coordination import (
    Coordination,
    CoordinationUnavailable,
    PresenceView,
    RateDecision,
    Subscription,
)
from coordinator.coordination.bus import Bus
from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    LeaseUsage,
    NodeFacts,
)
from coordinator.coordination.memory_bus import MemoryBus
from coordinator.coordination.monitor_types import HostFacts, MonitorClaim, MonitorStatus


class Gate:
    """Open by default; a frozen instance's every step waits here until it thaws."""

    def __init__(self) -> None:
        self._open = trio.Event()
        self._open.set()

    @property
    def frozen(self) -> bool:
        return not self._open.is_set()

    def freeze(self) -> None:
        if not self.frozen:
            self._open = trio.Event()

    def thaw(self) -> None:
        self._open.set()

    async def wait(self) -> None:
        if self.frozen:
            await self._open.wait()


@dataclass
class StoreState:
    """Shared between all FaultyCoordination objects: is "Redis" reachable?"""

    down: bool = False
    # Bumped at each outage so open subscriptions notice they were cut.
    epoch: int = 0
    # Subscriptions waiting for a message; an outage interrupts them.
    waiting: list[trio.CancelScope] = field(default_factory=list)

    def go_down(self) -> None:
        self.down, self.epoch = True, self.epoch + 1
        for scope in self.waiting:
            scope.cancel()

    def come_back(self) -> None:
        self.down = False


class _FaultySubscription(Subscription):
    """An outage cuts the subscription (it raises ``CoordinationUnavailable``, as a lost
    connection does); a freeze holds each message until the thaw."""

    def __init__(
        self,
        inner: Subscription,
        owner: FaultyCoordination,
        epoch: int,
        *,
        keep_received: bool = False,
    ) -> None:
        self._inner = inner.__aiter__()
        self._owner = owner
        self._epoch = epoch
        # A durable inbox counts an entry as delivered once read: a cut noticed after that
        # must not lose it (the next call raises instead). Pub/sub loses it, as Redis does.
        self._keep_received = keep_received

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        self._owner.check_cut(self._epoch)
        waiting = self._owner.store.waiting
        with trio.CancelScope() as scope:
            waiting.append(scope)
            try:
                payload = await self._inner.__anext__()
            finally:
                waiting.remove(scope)
        if scope.cancelled_caught or not self._keep_received:
            self._owner.check_cut(self._epoch)  # an outage cut the wait (or came meanwhile)
        await self._owner.gate.wait()
        if not self._keep_received:
            self._owner.check_cut(self._epoch)
        return payload


class AdmissionObserver(Protocol):
    """Sees every admission decision and every request leaving, for the invariants."""

    def admitted(self, ask: LeaseAsk, admission: Admission) -> None: ...

    def left(self, request_id: str) -> None: ...


class FaultyCoordination(Coordination):
    kind = "memory+faults"

    def __init__(
        self,
        inner: Coordination,
        gate: Gate,
        store: StoreState,
        *,
        observer: AdmissionObserver | None = None,
    ) -> None:
        self.inner, self.gate, self.store = inner, gate, store
        self.observer = observer

    async def passage(self) -> None:
        """What every call of this instance meets first: its freeze, then a store outage."""
        await self.gate.wait()
        if self.store.down:
            raise CoordinationUnavailable("simulated coordination store outage")

    def check_cut(self, epoch: int) -> None:
        if self.store.down or self.store.epoch != epoch:
            raise CoordinationUnavailable("simulated loss of the subscription")

    async def get(self, key: str) -> bytes | None:
        await self.passage()
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        await self.passage()
        return await self.inner.get_many(keys)

    async def set(
        self, key: str, value: bytes, *, ttl_s: float | None = None, only_if_absent: bool = False
    ) -> bool:
        await self.passage()
        return await self.inner.set(key, value, ttl_s=ttl_s, only_if_absent=only_if_absent)

    async def swap(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bytes | None:
        await self.passage()
        return await self.inner.swap(key, value, ttl_s=ttl_s)

    async def swap_many(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        ttl_s: float | None = None,
        bump: str | None = None,
    ) -> list[bytes | None]:
        await self.passage()  # one step, as on Redis: the swaps and the bump land together
        return await self.inner.swap_many(items, ttl_s=ttl_s, bump=bump)

    async def compare_and_set(
        self, key: str, expected: bytes | None, value: bytes | None, *, ttl_s: float | None = None
    ) -> bool:
        await self.passage()
        return await self.inner.compare_and_set(key, expected, value, ttl_s=ttl_s)

    async def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        await self.passage()
        return await self.inner.refresh_if(key, expected, ttl_s)

    async def delete(self, key: str) -> None:
        await self.passage()
        await self.inner.delete(key)

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        await self.passage()
        return await self.inner.incr(key, amount, ttl_s=ttl_s)

    async def keys_with_prefix(self, prefix: str) -> list[str]:
        await self.passage()
        return sorted(await self.inner.keys_with_prefix(prefix))

    async def rate_limit(self, key: str, *, limit: int, period_s: float) -> RateDecision:
        await self.passage()
        return await self.inner.rate_limit(key, limit=limit, period_s=period_s)

    async def put_node_facts(self, facts: NodeFacts) -> None:
        await self.passage()
        await self.inner.put_node_facts(facts)

    async def drop_node_facts(self, node_id: str, conn_id: str) -> None:
        await self.passage()
        await self.inner.drop_node_facts(node_id, conn_id)

    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        await self.passage()
        admission = await self.inner.admit(ask, rules)
        if self.observer is not None:
            self.observer.admitted(ask, admission)
        return admission

    async def renew_leases(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> list[bool]:
        await self.passage()
        return await self.inner.renew_leases(leases, ttl_s)

    async def release(self, release: LeaseRelease, rules: AdmissionRules) -> list[tuple[str, str]]:
        if self.observer is not None and release.model:
            self.observer.left(release.request_id)  # the request is over, whether this succeeds
        await self.passage()
        return await self.inner.release(release, rules)

    async def lease_usage(self, node_ids: Sequence[str]) -> dict[str, LeaseUsage]:
        await self.passage()
        return await self.inner.lease_usage(node_ids)

    async def queue_depths(self, models: Sequence[str], rules: AdmissionRules) -> dict[str, int]:
        await self.passage()
        return await self.inner.queue_depths(models, rules)

    async def append_telemetry(
        self, node_id: str, sample: bytes, *, keep: int, ttl_s: float
    ) -> None:
        await self.passage()
        await self.inner.append_telemetry(node_id, sample, keep=keep, ttl_s=ttl_s)

    async def telemetry_history(self, node_id: str) -> list[bytes]:
        await self.passage()
        return await self.inner.telemetry_history(node_id)

    async def latest_telemetry(self, node_ids: Sequence[str]) -> dict[str, bytes]:
        await self.passage()
        return await self.inner.latest_telemetry(node_ids)

    async def monitor_acquire(self, candidate: str, ttl_s: float) -> MonitorClaim:
        await self.passage()
        return await self.inner.monitor_acquire(candidate, ttl_s)

    async def monitor_renew(self, candidate: str, epoch: int, ttl_s: float) -> bool:
        await self.passage()
        return await self.inner.monitor_renew(candidate, epoch, ttl_s)

    async def monitor_resign(self, candidate: str, epoch: int) -> bool:
        await self.passage()
        return await self.inner.monitor_resign(candidate, epoch)

    async def monitor_status(self) -> MonitorStatus:
        await self.passage()
        return await self.inner.monitor_status()

    async def write_host_facts(
        self, candidate: str, epoch: int, host_id: str, record: bytes, *, fenced: bool = True
    ) -> bool:
        await self.passage()
        return await self.inner.write_host_facts(candidate, epoch, host_id, record, fenced=fenced)

    async def host_facts(self, host_ids: Sequence[str] | None = None) -> dict[str, HostFacts]:
        await self.passage()
        return await self.inner.host_facts(host_ids)

    async def accepted_fact_writes(self, epoch: int) -> int:
        await self.passage()
        return await self.inner.accepted_fact_writes(epoch)

    async def presence_beat(
        self,
        registry: str,
        member: str,
        data: bytes,
        *,
        stall_after_s: float,
        forget_after_s: float,
    ) -> PresenceView:
        await self.passage()
        return await self.inner.presence_beat(
            registry, member, data, stall_after_s=stall_after_s, forget_after_s=forget_after_s
        )

    async def presence_read(self, registry: str, *, stall_after_s: float) -> PresenceView:
        await self.passage()
        return await self.inner.presence_read(registry, stall_after_s=stall_after_s)

    async def presence_leave(self, registry: str, member: str) -> None:
        await self.passage()
        await self.inner.presence_leave(registry, member)

    async def publish(self, channel: str, payload: bytes) -> int:
        await self.passage()
        return await self.inner.publish(channel, payload)

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        return self._subscribe(channel)

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        await self.passage()
        epoch = self.store.epoch
        async with self.inner.subscribe(channel) as inner:
            yield _FaultySubscription(inner, self, epoch)

    async def subscriber_count(self, channel: str) -> int:
        await self.passage()
        return await self.inner.subscriber_count(channel)

    async def ping(self) -> None:
        await self.passage()

    async def aclose(self) -> None:
        pass


@dataclass
class BusChaos:
    """Probabilities for each envelope in flight while chaos is on."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    max_delay_s: float = 0.3


class FaultyBus(Bus):
    """Bus envelopes may be lost, delayed (and so reordered) or duplicated; an outage of
    ``faults``' store cuts the inbox, a freeze holds its messages. ``inner`` meets the freeze
    and the outage on its other calls through ``faults.passage`` (``MemoryBus(before_io=…)``)."""

    def __init__(
        self,
        inner: MemoryBus,
        faults: FaultyCoordination,
        rng: random.Random,
        nursery: trio.Nursery,
        chaos: BusChaos,
    ) -> None:
        self.inner, self.faults = inner, faults
        self.rng, self.nursery, self.chaos = rng, nursery, chaos
        self.dropped = self.duplicated = self.delayed = 0

    async def send(self, instance_id: str, payload: bytes) -> int:
        chaos, roll = self.chaos, self.rng.random()
        if roll < chaos.drop:
            self.dropped += 1
            # Lost on the way: the sender still saw a listener.
            return 1 if await self.inner.is_listening(instance_id) else 0
        if roll < chaos.drop + chaos.delay:
            self.delayed += 1
            delay = self.rng.uniform(0, chaos.max_delay_s)
            self.nursery.start_soon(self._later, delay, instance_id, payload)
            return 1 if await self.inner.is_listening(instance_id) else 0
        reached = await self.inner.send(instance_id, payload)
        if roll < chaos.drop + chaos.delay + chaos.duplicate:
            self.duplicated += 1
            await self.inner.send(instance_id, payload)
        return reached

    async def _later(self, delay: float, instance_id: str, payload: bytes) -> None:
        await trio.sleep(delay)
        try:
            await self.inner.send(instance_id, payload)
        except CoordinationUnavailable:
            pass

    def listen(self, instance_id: str) -> AbstractAsyncContextManager[Subscription]:
        return self._listen(instance_id)

    @asynccontextmanager
    async def _listen(self, instance_id: str) -> AsyncIterator[Subscription]:
        async with self.inner.listen(instance_id) as inner:
            # Opening passed ``faults.passage`` with no checkpoint since: this is the epoch
            # the inbox was opened in.
            epoch = self.faults.store.epoch
            yield _FaultySubscription(inner, self.faults, epoch, keep_received=self.inner.durable)

    async def is_listening(self, instance_id: str) -> bool:
        return await self.inner.is_listening(instance_id)


# -- the plan ------------------------------------------------------------------------------------

FAULT_KINDS = (
    "crash_restart",
    "freeze",
    "node_move",
    "duplicate_identity",
    "store_outage",
    "bus_chaos",
    "slow_node",
)


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    target: str = ""
    duration: float = 0.0


@dataclass
class FaultPlan:
    faults: list[Fault] = field(default_factory=list)
    # Probability that a client walks away from a request before it ends.
    client_disconnect: float = 0.0

    @classmethod
    def draw(
        cls, rng: random.Random, *, instances: list[str], nodes: list[str], traffic_s: float
    ) -> FaultPlan:
        plan = cls(client_disconnect=rng.choice([0.0, 0.02, 0.05]))
        for _ in range(rng.randint(0, 4)):
            kind = rng.choice(FAULT_KINDS)
            at = round(rng.uniform(2.0, traffic_s * 0.8), 3)
            if kind in ("crash_restart", "freeze"):
                target, duration = rng.choice(instances), round(rng.uniform(0.5, 6.0), 3)
            elif kind == "store_outage":
                target, duration = "", round(rng.uniform(0.2, 3.0), 3)
            elif kind == "bus_chaos":
                target, duration = "", round(rng.uniform(1.0, 8.0), 3)
            else:
                target, duration = rng.choice(nodes), round(rng.uniform(1.0, 6.0), 3)
            plan.faults.append(Fault(at=at, kind=kind, target=target, duration=duration))
        plan.faults.sort(key=lambda f: (f.at, f.kind, f.target))
        return plan

    def describe(self) -> list[dict[str, object]]:
        return [
            {"at": f.at, "kind": f.kind, "target": f.target, "duration": f.duration}
            for f in self.faults
        ] + [{"client_disconnect": self.client_disconnect}]
