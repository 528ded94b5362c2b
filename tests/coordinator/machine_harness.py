"""A cluster of pure ``InstanceMachine``s wired together in memory, for tests of the cluster
protocol without trio, Redis or sockets: the test plays the bus, the nodes and the clock.

Bus envelopes between instances wait in ``in_flight`` until ``deliver`` (FIFO per sender and
receiver, like the outbox's ordered lanes) and can be dropped with their instance. The shared
store's capacity leases are the memory backend's synchronous tables (``LeaseTables``): a
``Reserve`` is answered at once, or waits in ``waiting`` until a release or wake retries it."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from coordinator.coordination.leases import AdmissionRules, LeaseAsk, LeaseRelease, NodeFacts
from coordinator.coordination.memory_leases import LeaseTables
from coordinator.core.effects import (
    CloseNode,
    Deliver,
    Dispatch,
    Effect,
    NodeFactsChanged,
    NodesChanged,
    Publish,
    ReleaseLease,
    ReleaseOwnership,
    Reserve,
    SendToNode,
    TaskEvent,
    WakeQueue,
)
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.node_table import NodeConnection
from coordinator.errors import AllNodesBusy
from protocol import Assign, BusEnvelope, Cancel, Chunk


@dataclass
class Node:
    node_id: str
    conn_id: str
    instance: str
    models: frozenset[str]
    max_parallel: int
    running: dict[str, Assign] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    closed_with: int | None = None


QUEUE_TIMEOUT_S = 30.0


class MachineCluster:
    def __init__(self, *instances: str, seed: int = 0) -> None:
        self.now = 0.0
        self.machines = {
            name: InstanceMachine(name, forward_grace_s=5.0, rng=random.Random(f"{seed}:{name}"))
            for name in instances
        }
        self.dead: set[str] = set()
        self.nodes: dict[str, Node] = {}  # by conn id
        self.events: dict[str, list[TaskEvent]] = {}  # what each request saw, in order
        self.in_flight: deque[tuple[str, str, BusEnvelope]] = deque()  # (from, to, envelope)
        self.unreached_publishes: list[tuple[str, BusEnvelope]] = []
        # Instances whose presence beats the store has stopped trusting. A killed instance
        # stays trusted until a test says otherwise, as in the store, where its facts outlive
        # it by ``residency_stale_s`` (longer than peers take to judge it dead).
        self.stale: set[str] = set()
        self.leases = LeaseTables(lambda _registry, member, _w, _now: member not in self.stale)
        self.rules = AdmissionRules(
            presence_registry="r",
            facts_stale_s=15,
            requester_stale_s=10,
            lease_ttl_s=30,
            queue_max=100,
        )
        # Reserves waiting for capacity (or for fresh views), with their queue deadline.
        self.waiting: list[tuple[str, Reserve, float]] = []

    # -- wiring -----------------------------------------------------------------------------

    def connect(
        self,
        instance: str,
        node_id: str,
        *,
        models: tuple[str, ...] = ("m",),
        max_parallel: int = 2,
    ) -> Node:
        conn_id = f"c-{node_id}-{len(self.nodes)}"
        node = Node(node_id, conn_id, instance, frozenset(models), max_parallel)
        self.nodes[conn_id] = node
        conn = NodeConnection(
            conn_id=conn_id,
            node_id=node_id,
            models=node.models,
            max_parallel=max_parallel,
            vram_gb=None,
            agent_version="test",
            connected_at=0.0,
            last_seen=self.now,
        )
        self.apply(instance, self.machines[instance].node_connected(conn, self.now))
        self.share_snapshots()
        return node

    def share_snapshots(self) -> None:
        """What each instance's registry read returns: every live peer's snapshot."""
        snapshots = [m.snapshot() for name, m in self.machines.items() if name not in self.dead]
        for name, machine in self.machines.items():
            machine.set_peers([s for s in snapshots if s.instance_id != name])

    def apply(self, source: str, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Deliver):
                self.events.setdefault(effect.task_id, []).append(effect.event)
            elif isinstance(effect, SendToNode):
                node = self.nodes[effect.conn_id]
                if isinstance(effect.envelope, Assign):
                    node.running[effect.envelope.task_id] = effect.envelope
                elif isinstance(effect.envelope, Cancel):
                    node.running.pop(effect.envelope.task_id, None)
                    node.cancelled.append(effect.envelope.task_id)
            elif isinstance(effect, CloseNode):
                self.nodes[effect.conn_id].closed_with = effect.code
            elif isinstance(effect, Publish):
                if effect.target in self.dead or effect.target not in self.machines:
                    self.unreached_publishes.append((effect.target, effect.envelope))
                    if effect.unreached_task is not None:
                        self.apply(
                            source,
                            self.machines[source].answer_unreached(effect.unreached_task, self.now),
                        )
                else:
                    self.in_flight.append((source, effect.target, effect.envelope))
            elif isinstance(effect, Dispatch):
                machine = self.machines[source]
                task_id = effect.envelope.task_id
                if effect.target in self.dead:
                    self.apply(
                        source,
                        machine.unreached(task_id, effect.placement, effect.target, self.now),
                    )
                else:
                    self.in_flight.append((source, effect.target, effect.envelope))
                    self.apply(source, machine.dispatched(task_id, effect.placement, self.now))
            elif isinstance(effect, Reserve):
                self.reserve(source, effect)
            elif isinstance(effect, ReleaseLease):
                self.leases.release(
                    LeaseRelease(
                        request_id=effect.task_id,
                        key_id=effect.key_id,
                        model=effect.model,
                        lease=effect.lease,
                        wake_models=effect.wake_models,
                    ),
                    self.rules,
                    self.now,
                )
                self.retry_waiting()
            elif isinstance(effect, NodeFactsChanged):
                self.put_facts(source, effect)
            elif isinstance(effect, WakeQueue):
                self.retry_waiting()
            else:
                assert isinstance(effect, NodesChanged | ReleaseOwnership), effect

    def put_facts(self, source: str, effect: NodeFactsChanged) -> None:
        conn = self.machines[source].owner.nodes.by_conn(effect.conn_id)
        if effect.gone or conn is None:
            self.leases.drop_facts(effect.node_id, effect.conn_id)
            return
        facts = NodeFacts(conn.node_id, conn.conn_id, source, conn.max_parallel)
        self.leases.put_facts(facts)

    def reserve(self, source: str, effect: Reserve, until: float | None = None) -> None:
        """What ``runtime/admission.py`` does, in one synchronous step."""
        self.apply(source, self.granted(source, effect, until))

    def granted(self, source: str, effect: Reserve, until: float | None = None) -> list[Effect]:
        """The machine's effects once the lease is granted ([] when it has to wait)."""
        machine = self.machines[source]
        candidates = machine.requester.candidates(effect.task_id, effect.attempt)
        if candidates is None:
            return []
        ask = LeaseAsk(
            request_id=effect.task_id,
            instance_id=source,
            key_id="",
            model=machine.requester.model_of(effect.task_id) or "",
            model_gb=0,
            kv_gb=0,
            candidates=tuple((v.node_id, v.conn_id) for v in candidates),
            lease_id=f"{effect.task_id}.{effect.attempt}",
            queue_entry_ttl_s=60,
        )
        admission = self.leases.admit(ask, self.rules, self.now)
        if admission.outcome == "granted":
            (view,) = [v for v in candidates if v.conn_id == admission.conn_id]
            return machine.reserved(effect.task_id, effect.attempt, view, ask.lease_id, self.now)
        assert admission.outcome in ("queued", "refused"), admission
        if not candidates:
            return machine.reserve_failed(
                effect.task_id, effect.attempt, AllNodesBusy("no node serves it"), self.now
            )
        if admission.outcome == "queued":
            machine.requester.waiting(effect.task_id)
        until = self.now + QUEUE_TIMEOUT_S if until is None else until
        if self.now >= until:
            error = AllNodesBusy("no room in time")
            return machine.reserve_failed(effect.task_id, effect.attempt, error, self.now)
        self.waiting.append((source, effect, until))
        return []

    def retry_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for source, effect, until in waiting:
            if source not in self.dead:
                self.reserve(source, effect, until)

    def deliver(self, limit: int | None = None) -> int:
        """Deliver bus envelopes in order (all of them by default)."""
        count = 0
        while self.in_flight and (limit is None or count < limit):
            _, target, envelope = self.in_flight.popleft()
            count += 1
            if target in self.dead:
                continue
            self.apply(target, self.machines[target].bus_envelope(envelope, self.now))
        return count

    # -- actors -----------------------------------------------------------------------------

    def submit(
        self,
        instance: str,
        task_id: str,
        *,
        prompt: str = "p",
        model: str = "m",
        timeout_s: float = 10.0,
    ) -> None:
        assign = Assign(task_id=task_id, model=model, prompt=prompt, timeout_s=timeout_s)
        self.events[task_id] = []
        effects = self.machines[instance].submit(assign, self.now + timeout_s, self.now)
        self.apply(instance, effects)

    def node_says(self, conn_id: str, envelope: object) -> None:
        node = self.nodes[conn_id]
        task_id = getattr(envelope, "task_id", None)
        if task_id is not None and not isinstance(envelope, Chunk):
            node.running.pop(task_id, None)
        self.apply(
            node.instance, self.machines[node.instance].node_envelope(conn_id, envelope, self.now)
        )

    def kill(self, instance: str) -> None:
        """The instance is gone: nothing reaches it; peers find out at their next judgement."""
        self.dead.add(instance)

    def judge(self) -> None:
        """Every live instance's sweeper runs once and sees the dead."""
        for name, machine in self.machines.items():
            if name not in self.dead:
                interesting = set(machine.peers_of_interest())
                self.apply(name, machine.peers_dead(interesting & self.dead, self.now))

    def tick(self, seconds: float, *, silence_deadline_s: float | None = None) -> None:
        self.now += seconds
        self.retry_waiting()
        for name, machine in self.machines.items():
            if name not in self.dead:
                self.apply(name, machine.tick(self.now, silence_deadline_s=silence_deadline_s))

    def ended(self, instance: str, task_id: str, outcome: str = "ok") -> None:
        self.apply(instance, self.machines[instance].request_ended(task_id, outcome, self.now))

    def node_of(self, task_id: str) -> Node:
        (node,) = [n for n in self.nodes.values() if task_id in n.running]
        return node
