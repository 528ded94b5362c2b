"""A hypothesis stateful test of capacity leases and the admission queue against a small
reference model written here (from ``leases.py``, independently of ``memory/leases.py``).

Random sequences of admissions (new requests and requests asking again, random candidates,
models, sizes, key weights), renewals, expiries, releases, instances beating, leaving and
falling silent, node facts put and dropped. Every reply is compared with the model's (outcome,
node, lease, position, refusals in order, next_in_queue, head, renewals, queue heads, usage,
queue depths), under both queue orders (``fair``: the model is a plain deficit round robin,
``Drr``, whose positions are found by serving a copy one grant at a time), and
throughout: a node's leases never exceed its ``max_parallel`` and the memory in use never
exceeds its ``memory_gb`` (budgets are fixed per node; resident models are drawn once).

Time: on the memory backend the fake clock moves in steps of quarter seconds against windows
and TTLs of a few seconds, so expiries and staleness happen everywhere, boundaries included.
Redis time cannot be faked: its run uses windows and TTLs of a minute (nothing lapses by
itself during an example), instances die by leaving the registry, and expiry is made on
purpose with tiny TTLs followed by a real sleep a few times longer.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from coordinator.coordination import Coordination
from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    NodeFacts,
)
from coordinator.coordination.memory.coordination import MemoryCoordination, MemoryState
from coordinator.coordination.redis.coordination import RedisCoordination
from tests.fixtures.coordination_backend import FakeClock
from tests.fixtures.redis_server import RedisServer
from tests.fixtures.trio_portal import Portal

REGISTRY = "instances"
INSTANCES = ("A", "B", "C")
KEYS = ("k1", "k2", "k3")
CATALOG = {"a": 1.0, "b": 1.5, "c": 0.5, "d": 0.1}
#: node -> (max_parallel, memory_gb)
NODES: dict[str, tuple[int, float | None]] = {"n1": (1, None), "n2": (2, 3.0), "n3": (3, 2.1)}
EPSILON = 1e-9


@dataclass
class World:
    """How one backend is opened and how time moves for it."""

    open: Callable[[], AbstractAsyncContextManager[Coordination]]
    advance: Callable[[float], None]
    rules: AdmissionRules
    queue_ttls: tuple[float, ...]
    renew_ttl: float
    tiny_ttl: float
    tiny_wait: float
    ticks: tuple[float, ...] = ()  # empty: time moves only by tiny waits


# -- the reference model -------------------------------------------------------------------


@dataclass
class Lease:
    expires: float
    model: str
    gb: float
    kv: float


@dataclass
class Entry:
    request_id: str
    instance: str
    expires: float
    key: str = ""


@dataclass
class Drr:
    """The fair order of one model's queue as plain deficit round robin: the ring of keys
    with entries, each key's deficit and weight; the entries stay in arrival order."""

    ring: list[str] = field(default_factory=list)
    deficit: dict[str, int] = field(default_factory=dict)
    weight: dict[str, int] = field(default_factory=dict)


@dataclass
class Reference:
    rules: AdmissionRules
    now: float
    beats: dict[str, float] = field(default_factory=dict)
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    leases: dict[str, dict[str, Lease]] = field(default_factory=dict)
    queues: dict[str, list[Entry]] = field(default_factory=dict)
    active: dict[str, dict[str, str]] = field(default_factory=dict)
    drr: dict[str, Drr] = field(default_factory=dict)

    @property
    def fair(self) -> bool:
        return self.rules.queue_policy == "fair"

    def first(self, model: str) -> Entry | None:
        """The entry a grant goes to next (not judged)."""
        queue = self.queues.setdefault(model, [])
        if not self.fair:
            return queue[0] if queue else None
        ring = self.drr.setdefault(model, Drr()).ring
        return next((e for e in queue if e.key == ring[0]), None) if ring else None

    def leave(self, model: str, rid: str) -> None:
        queue = self.queues.setdefault(model, [])
        gone = [e for e in queue if e.request_id == rid]
        queue[:] = [e for e in queue if e.request_id != rid]
        drr = self.drr.setdefault(model, Drr())
        for entry in gone:
            if entry.key in drr.ring and not any(e.key == entry.key for e in queue):
                drr.ring.remove(entry.key)
                del drr.deficit[entry.key]

    def served(self, model: str, rid: str) -> None:
        """The head ``rid`` was granted."""
        first = self.first(model)
        self.leave(model, rid)
        if not self.fair or first is None or first.request_id != rid:
            return
        drr = self.drr[model]
        if first.key in drr.ring:
            drr.deficit[first.key] -= 1
            if drr.deficit[first.key] == 0:
                drr.ring.remove(first.key)
                drr.ring.append(first.key)
                drr.deficit[first.key] = drr.weight[first.key]

    def join(self, model: str, entry: Entry, weight: int) -> None:
        self.queues.setdefault(model, []).append(entry)
        drr = self.drr.setdefault(model, Drr())
        drr.weight[entry.key] = weight
        if entry.key not in drr.ring:
            drr.ring.append(entry.key)
            drr.deficit[entry.key] = weight

    def position(self, model: str, rid: str) -> int:
        """Grants before ``rid`` if nothing else arrives: served one by one on a copy."""
        saved = (list(self.queues[model]), self.drr.get(model, Drr()))
        self.drr[model] = Drr(list(saved[1].ring), dict(saved[1].deficit), dict(saved[1].weight))
        ahead = 0
        while (first := self.first(model)) is not None and first.request_id != rid:
            self.served(model, first.request_id)
            ahead += 1
        self.queues[model], self.drr[model] = saved
        return ahead

    def alive(self, instance: str, window: float) -> bool:
        beat = self.beats.get(instance)
        return beat is not None and self.now - beat <= window

    def head(self, model: str) -> Entry | None:
        window = self.rules.requester_stale_s
        while (first := self.first(model)) is not None:
            if first.expires > self.now and self.alive(first.instance, window):
                return first
            self.leave(model, first.request_id)
        return None

    def held(self, node: str) -> dict[str, Lease]:
        leases = self.leases.setdefault(node, {})
        for lease_id in [k for k, v in leases.items() if v.expires <= self.now]:
            del leases[lease_id]
        return leases

    def memory(self, node: str, extra: list[Lease]) -> float:
        facts = self.facts.get(node)
        resident = dict(facts.resident) if facts else {}
        sizes = dict(resident)
        for lease in [*self.held(node).values(), *extra]:
            if lease.model not in resident:
                sizes[lease.model] = max(sizes.get(lease.model, 0.0), lease.gb)
        return sum(sizes.values()) + sum(lease.kv for lease in [*self.held(node).values(), *extra])

    def reserve(self, node: str, conn: str, ask: LeaseAsk) -> str | None:
        facts = self.facts.get(node)
        if facts is None or facts.conn_id != conn:
            return "gone"
        if not self.alive(facts.instance_id, self.rules.facts_stale_s):
            return "stale"
        if len(self.held(node)) >= facts.max_parallel:
            return "full"
        lease = Lease(self.now + self.rules.lease_ttl_s, ask.model, ask.model_gb, ask.kv_gb)
        if facts.memory_gb is not None and self.memory(node, [lease]) > facts.memory_gb + EPSILON:
            return "memory"
        self.held(node)[ask.lease_id] = lease
        return None

    def admit(self, ask: LeaseAsk) -> tuple[object, ...]:
        limit = self.rules.max_active_per_key
        active = self.active.setdefault(ask.key_id, {})
        entered = limit > 0 and ask.request_id not in active
        if entered:
            for rid, instance in list(active.items()):
                if not self.alive(instance, self.rules.requester_stale_s):
                    del active[rid]
            if len(active) >= limit:
                return ("key_limit", "", "", "", 0, [], "", "")
            active[ask.request_id] = ask.instance_id
        self.head(ask.model)
        queue = self.queues[ask.model]
        ids = [e.request_id for e in queue]
        queued = ask.request_id in ids
        ahead = self.position(ask.model, ask.request_id) if queued else len(ids)
        refusals: dict[str, str] = {}
        if ahead == 0:
            for node, conn in ask.candidates:
                why = self.reserve(node, conn, ask)
                if why is None:
                    self.served(ask.model, ask.request_id)
                    head = self.head(ask.model)
                    nxt, rid = (head.instance, head.request_id) if head else ("", "")
                    return (
                        "granted",
                        node,
                        conn,
                        ask.lease_id,
                        0,
                        list(refusals.items()),
                        nxt,
                        rid,
                    )
                refusals[node] = why
            if ask.candidates and set(refusals.values()) <= {"stale", "gone"}:
                if entered:
                    del active[ask.request_id]
                self.leave(ask.model, ask.request_id)
                return ("refused", "", "", "", 0, list(refusals.items()), "", "")
        if not queued:
            if len(queue) >= self.rules.queue_max:
                if entered:
                    del active[ask.request_id]
                return ("queue_full", "", "", "", 0, list(refusals.items()), "", "")
            expires = self.now + ask.queue_entry_ttl_s
            self.join(
                ask.model, Entry(ask.request_id, ask.instance_id, expires, ask.key_id), ask.weight
            )
            ahead = self.position(ask.model, ask.request_id)
        first = self.first(ask.model)  # as it stands: a queued answer judges no entry
        rid = first.request_id if first else ""
        return ("queued", "", "", "", ahead, list(refusals.items()), "", rid)

    def renew(self, leases: list[tuple[str, str]], ttl: float) -> list[bool]:
        out = []
        for node, lease_id in leases:
            lease = self.held(node).get(lease_id)
            if lease is not None:
                lease.expires = self.now + ttl
            out.append(lease is not None)
        return out

    def release(
        self, rid: str, key: str, model: str, lease: tuple[str, str] | None, wake: list[str]
    ) -> list[tuple[str, str]]:
        if lease is not None:
            self.leases.get(lease[0], {}).pop(lease[1], None)
        self.leave(model, rid)
        self.active.get(key, {}).pop(rid, None)
        heads = []
        for name in dict.fromkeys(wake):
            head = self.head(name)
            if head is not None:
                heads.append((name, head.instance))
        return heads


def view(admission: Admission) -> tuple[object, ...]:
    a = admission
    refusals = list(a.refusals.items())
    return (
        a.outcome,
        a.node_id,
        a.conn_id,
        a.lease_id,
        a.position,
        refusals,
        a.next_in_queue,
        a.head,
    )


@dataclass
class Request:
    ask: LeaseAsk
    lease: tuple[str, str] | None = None


class LeaseMachine(RuleBasedStateMachine):
    world: World
    portal: Portal

    def __init__(self) -> None:
        super().__init__()
        self.coord, self._close = self.portal.hold(self.world.open)
        self.model = Reference(self.world.rules, 0.0)
        self.requests: dict[str, Request] = {}
        self.counter = itertools.count()

    def teardown(self) -> None:
        self._close()

    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)
        self.model.now += seconds

    # -- rules ----------------------------------------------------------------------------------

    @initialize(
        resident=st.fixed_dictionaries(
            {n: st.lists(st.sampled_from(sorted(CATALOG)), unique=True, max_size=2) for n in NODES}
        ),
    )
    def start(self, resident: dict[str, list[str]]) -> None:
        self.resident = {node: {m: CATALOG[m] for m in models} for node, models in resident.items()}
        self.everyone_beats()
        for k, node in enumerate(NODES):
            self.put_facts(node, "x", INSTANCES[k % 2])

    # Few rules, so that admissions are a good share of the steps.

    @rule(
        action=st.sampled_from(["beat", "beat", "everyone", "leave"]),
        who=st.sampled_from(INSTANCES),
    )
    def presence(self, action: str, who: str) -> None:
        if action == "everyone":
            self.everyone_beats()
        elif action == "beat":
            self.beat(who)
        else:
            self.portal.run(self.coord.presence.presence_leave, REGISTRY, who)
            self.model.beats.pop(who, None)

    def everyone_beats(self) -> None:
        for instance in INSTANCES:
            self.beat(instance)

    def beat(self, instance: str) -> None:
        self.portal.run(self._beat, instance)
        self.model.beats[instance] = self.model.now

    async def _beat(self, instance: str) -> None:
        await self.coord.presence.presence_beat(
            REGISTRY, instance, b"", stall_after_s=600.0, forget_after_s=600.0
        )

    @precondition(lambda self: bool(self.world.ticks))
    @rule(data=st.data())
    def tick(self, data: st.DataObject) -> None:
        self.advance(data.draw(st.sampled_from(self.world.ticks)))

    @rule(
        node=st.sampled_from(sorted(NODES)),
        action=st.sampled_from(["put", "put", "drop", "drop another"]),
        conn=st.sampled_from("xy"),
        owner=st.sampled_from(INSTANCES),
    )
    def facts(self, node: str, action: str, conn: str, owner: str) -> None:
        if action == "put":
            self.put_facts(node, conn, owner)
            return
        facts = self.model.facts.get(node)
        current = "x" if facts is None else facts.conn_id
        conn = current if action == "drop" else {"x": "y", "y": "x"}[current]
        self.portal.run(self.coord.leases.drop_node_facts, node, conn)
        if facts is not None and facts.conn_id == conn:
            del self.model.facts[node]

    def put_facts(self, node: str, conn: str, owner: str) -> None:
        max_parallel, memory_gb = NODES[node]
        facts = NodeFacts(node, conn, owner, max_parallel, memory_gb, self.resident[node])
        self.portal.run(self.coord.leases.put_node_facts, facts)
        self.model.facts[node] = facts

    def candidates(self, data: st.DataObject) -> tuple[tuple[str, str], ...]:
        # Mostly one or two candidates (no candidates at all now and then).
        nodes = data.draw(st.lists(st.sampled_from(sorted(NODES)), min_size=1, max_size=3))
        if data.draw(st.integers(0, 19)) == 0:
            return ()
        chosen = []
        for node in nodes:
            facts = self.model.facts.get(node)
            current = facts.conn_id if facts else "x"
            chosen.append((node, data.draw(st.sampled_from([current] * 4 + ["z"]))))
        return tuple(chosen)

    def admit(self, ask: LeaseAsk) -> None:
        got = view(self.portal.run(self.coord.leases.admit, ask, self.world.rules))
        assert got == self.model.admit(ask), ask
        request = self.requests[ask.request_id]
        if got[0] == "granted":
            request.lease = (str(got[1]), ask.lease_id)

    @rule(
        data=st.data(),
        instance=st.sampled_from(INSTANCES),
        key=st.sampled_from(KEYS),
        # Mostly one model, so that its queue grows.
        model=st.sampled_from(["a", "a", "a", *sorted(CATALOG)]),
        bigger=st.booleans(),
        kv=st.sampled_from([0.0, 0.25, 0.5]),
        tiny=st.sampled_from([False] * 4 + [True]),
        weight=st.sampled_from([1, 1, 2, 3]),
    )
    def new_request(
        self,
        data: st.DataObject,
        instance: str,
        key: str,
        model: str,
        bigger: bool,
        kv: float,
        tiny: bool,
        weight: int,
    ) -> None:
        rid = f"r{next(self.counter)}"
        ttl = self.world.tiny_ttl if tiny else data.draw(st.sampled_from(self.world.queue_ttls))
        ask = LeaseAsk(
            rid, instance, key, model, CATALOG[model] + 0.5 * bigger, kv,
            self.candidates(data), f"L{next(self.counter)}", ttl, weight=weight,
        )  # fmt: skip
        self.requests[rid] = Request(ask)
        self.admit(ask)
        if tiny:
            self.advance(self.world.tiny_wait)

    @precondition(lambda self: any(r.lease is None for r in self.requests.values()))
    @rule(data=st.data())
    def ask_again(self, data: st.DataObject) -> None:
        waiting = sorted(rid for rid, r in self.requests.items() if r.lease is None)
        request = self.requests[data.draw(st.sampled_from(waiting))]
        lease_id = f"L{next(self.counter)}"
        ask = request.ask
        ask = LeaseAsk(
            ask.request_id, ask.instance_id, ask.key_id, ask.model, ask.model_gb, ask.kv_gb,
            self.candidates(data), lease_id, data.draw(st.sampled_from(self.world.queue_ttls)),
            weight=ask.weight,
        )  # fmt: skip
        request.ask = ask
        self.admit(ask)

    def known_leases(self) -> list[tuple[str, str]]:
        return sorted(r.lease for r in self.requests.values() if r.lease is not None)

    @rule(data=st.data(), expire=st.booleans())
    def renew(self, data: st.DataObject, expire: bool) -> None:
        """Renew some leases (plus one never granted); or renew one with a tiny TTL and wait
        it out, which is how a lease expires on Redis, whose clock cannot be moved."""
        known = self.known_leases()
        if expire and known:
            leases, ttl = [data.draw(st.sampled_from(known))], self.world.tiny_ttl
        else:
            pool = [*known, ("n2", "nope")]
            leases = data.draw(st.lists(st.sampled_from(pool), max_size=3))
            ttl = self.world.renew_ttl
        assert self.portal.run(self.coord.leases.renew_leases, leases, ttl) == self.model.renew(
            leases, ttl
        )
        if expire and known:
            self.advance(self.world.tiny_wait)

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data(), wake=st.lists(st.sampled_from(sorted(CATALOG)), max_size=3))
    def release(self, data: st.DataObject, wake: list[str]) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        request = self.requests.pop(rid)
        ask = request.ask
        wake = [ask.model, *wake]  # callers wake the model they freed, maybe others
        got = self.portal.run(self._release, ask, request.lease, wake)
        assert got == self.model.release(rid, ask.key_id, ask.model, request.lease, wake)

    async def _release(
        self, ask: LeaseAsk, lease: tuple[str, str] | None, wake: list[str]
    ) -> list[tuple[str, str]]:
        return await self.coord.leases.release(LeaseRelease(request_id=ask.request_id, key_id=ask.key_id, model=ask.model, lease=lease, wake_models=wake), self.world.rules)  # fmt: skip

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def views_match_and_budgets_hold(self) -> None:
        usage = self.portal.run(self.coord.leases.lease_usage, sorted(NODES))
        for node, (max_parallel, memory_gb) in NODES.items():
            held = self.model.held(node)
            assert usage[node].leases == len(held) <= max_parallel
            assert usage[node].memory_gb == pytest.approx(self.model.memory(node, []), abs=EPSILON)
            # The budget binds while the node has facts (without them nothing is granted and
            # a resident model counts at its leases' size, which may be larger).
            if held and memory_gb is not None and node in self.model.facts:
                assert usage[node].memory_gb <= memory_gb + EPSILON
        models = sorted(CATALOG)
        depths = self.portal.run(self.coord.leases.queue_depths, models, self.world.rules)
        for m in models:
            self.model.head(m)  # the backend judged each head the same way
        assert depths == {m: len(self.model.queues[m]) for m in models}


def run_machine(portal: Portal, world: World, examples: int, steps: int) -> None:
    machine = type("Machine", (LeaseMachine,), {"world": world, "portal": portal})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None)
    )


def memory_world() -> World:
    clock = FakeClock()

    def fresh() -> AbstractAsyncContextManager[Coordination]:
        clock.now = 1000.0
        return MemoryCoordination(state=MemoryState(clock))

    def advance(seconds: float) -> None:
        clock.now += seconds

    rules = AdmissionRules(REGISTRY, 4.0, 3.0, 4.0, queue_max=3, max_active_per_key=5)
    return World(fresh, advance, rules, (2.0, 6.0), 4.0, 0.25, 0.5, (0.25, 0.5, 1.0))


def test_lease_model_memory(trio_portal: Portal) -> None:
    run_machine(trio_portal, memory_world(), examples=200, steps=50)


def test_lease_model_memory_fair(trio_portal: Portal) -> None:
    world = memory_world()
    world.rules = dataclasses.replace(world.rules, queue_policy="fair", queue_max=5)
    run_machine(trio_portal, world, examples=10, steps=50)


@pytest.mark.redis
def test_lease_model_redis(trio_portal: Portal, redis_server_session: RedisServer) -> None:
    def fresh() -> AbstractAsyncContextManager[Coordination]:
        # A model test of semantics, not of timing: a loaded machine may take over the
        # production default of 1 s to answer, which is not what this test is about.
        return RedisCoordination(
            redis_server_session.url, key_prefix=f"lm-{uuid.uuid4().hex}", op_timeout_s=10.0
        )

    rules = AdmissionRules(REGISTRY, 60.0, 60.0, 60.0, queue_max=3, max_active_per_key=5)
    world = World(fresh, time.sleep, rules, (60.0,), 60.0, 0.002, 0.008)
    run_machine(trio_portal, world, examples=40, steps=40)
    # The fair order, the same steps (the Lua of ``queue_position`` and the ring included).
    world.rules = dataclasses.replace(rules, queue_policy="fair", queue_max=5)
    run_machine(trio_portal, world, examples=5, steps=40)
