"""Faults: the plan drawn from the seed, and the wrappers through which they strike.

Each instance reaches the shared coordination state and the bus through ``FaultyCoordination``
(each of its roles behind a ``Road``) and ``FaultyBus``: a freeze holds every call of that
instance until it thaws (a SIGSTOP seen from outside), a store outage makes every call fail
like an unreachable Redis, and bus chaos drops, delays or duplicates envelopes in flight. The
bus (a ``MemoryBus``) meets the freeze and the outage through ``FaultyCoordination.passage``,
its ``before_io`` hook, and its inbox through ``FaultyBus.listen``, so both strike the bus
exactly as they strike the store."""

from __future__ import annotations

import inspect
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import trio

from coordinator.coordination import Coordination, CoordinationUnavailable, Subscription
from coordinator.coordination.bus.base import Bus
from coordinator.coordination.bus.memory import MemoryBus
from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    NodeFacts,
)
from coordinator.coordination.roles import ROLES


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


def _gated(name: str) -> Callable[..., Awaitable[Any]]:
    """The method ``name``: this instance's passage, then the inner role's ``name``. One
    passage per call, as one call is one round trip on Redis (``swap_many``'s swaps and bump
    land together)."""

    async def gated(self: Road, /, *args: Any, **kwargs: Any) -> Any:
        await self.faults.passage()
        return await getattr(self.inner, name)(*args, **kwargs)

    gated.__name__ = gated.__qualname__ = name
    return gated


class Road:
    """One role of one instance's coordination: every call meets the instance's passage
    (``FaultyCoordination.passage``) first, then goes on to the inner backend's role object.
    ``roads`` makes one subclass per role with a gated method for each of the role's async
    methods; the subclasses below write out what does more."""

    def __init__(self, inner: Any, faults: FaultyCoordination) -> None:
        self.inner, self.faults = inner, faults


class _KeyValueRoad(Road):
    refresh_if: Callable[..., Awaitable[bool]]  # gated, by ``road_class``

    async def keys_with_prefix(self, prefix: str) -> list[str]:
        # The interface promises any order; sorting keeps callers' iteration, and so the
        # trace, independent of how the inner backend happens to order its keys.
        await self.faults.passage()
        return sorted(await self.inner.keys_with_prefix(prefix))

    async def refresh_many(self, expected: Sequence[tuple[str, bytes]], ttl_s: float) -> list[bool]:
        # Not gated as one call: each key meets the gate (and may meet an outage) on its own,
        # as the simulator has always run it; gating it once would change every trace.
        return [await self.refresh_if(key, value, ttl_s) for key, value in expected]


class _LeasesRoad(Road):
    put_node_facts: Callable[..., Awaitable[None]]  # gated, by ``road_class``

    async def put_many_node_facts(self, facts: Sequence[NodeFacts]) -> None:
        # One node at a time through the gate, like ``refresh_many`` above.
        for one in facts:
            await self.put_node_facts(one)

    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        await self.faults.passage()
        admission: Admission = await self.inner.admit(ask, rules)
        if self.faults.observer is not None:
            self.faults.observer.admitted(ask, admission)
        return admission

    async def release(self, release: LeaseRelease, rules: AdmissionRules) -> list[tuple[str, str]]:
        observer = self.faults.observer
        if observer is not None and release.model:
            observer.left(release.request_id)  # the request is over, whether this succeeds
        await self.faults.passage()
        heads: list[tuple[str, str]] = await self.inner.release(release, rules)
        return heads


class _PubSubRoad(Road):
    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        return self._subscribe(channel)

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        faults = self.faults
        await faults.passage()
        epoch = faults.store.epoch
        async with self.inner.subscribe(channel) as inner:
            yield _FaultySubscription(inner, faults, epoch)


def road_class(role: type, base: type[Road] = Road) -> type[Road]:
    """``base`` with a gated method for every async method of ``role`` it does not write out
    itself."""
    methods = {
        name: _gated(name)
        for name, member in vars(role).items()
        if not name.startswith("_")
        and inspect.iscoroutinefunction(member)
        and not hasattr(base, name)
    }
    return type(f"Faulty{role.__name__}", (base,), methods)


_WRITTEN_OUT: dict[str, type[Road]] = {
    "key_value": _KeyValueRoad,
    "leases": _LeasesRoad,
    "pubsub": _PubSubRoad,
}
#: the road of each role (``roles.ROLES``: the attribute of the bundle -> its Protocol)
ROADS: dict[str, type[Road]] = {
    attribute: road_class(role, _WRITTEN_OUT.get(attribute, Road))
    for attribute, role in ROLES.items()
}


class FaultyCoordination(Coordination):
    """A bundle whose every role is the inner bundle's behind a ``Road``: each call passes
    ``passage`` (the freeze, then a store outage) and goes on to the inner role object."""

    kind = "memory+faults"
    #: the road class of each role; a subclass may swap one (sim/monitors.py does)
    roads: ClassVar[dict[str, type[Road]]] = ROADS

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
        for attribute in ROLES:
            setattr(self, attribute, self.roads[attribute](getattr(inner, attribute), self))

    async def passage(self) -> None:
        """What every call of this instance meets first: its freeze, then a store outage."""
        await self.gate.wait()
        if self.store.down:
            raise CoordinationUnavailable("simulated coordination store outage")

    def check_cut(self, epoch: int) -> None:
        if self.store.down or self.store.epoch != epoch:
            raise CoordinationUnavailable("simulated loss of the subscription")

    async def ping(self) -> None:
        # Reachability is the passage alone; the inner ping would add a checkpoint to every
        # health check and so move the schedule (and the digests).
        await self.passage()

    async def aclose(self) -> None:
        # A no-op, as it has always been: forwarding it would close the inner backend's open
        # subscriptions at shutdown, which the runs (and their digests) never had.
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
