"""A cluster of pure ``InstanceMachine``s wired together in memory, for tests of the cluster
protocol without trio, Redis or sockets: the test plays the bus, the nodes and the clock.

Bus envelopes between instances wait in ``in_flight`` until ``deliver`` (FIFO per sender and
receiver, like the outbox's ordered lanes) and can be dropped with their instance. The shared
store's capacity leases are the memory backend's synchronous tables (``LeaseTables``). A
``Reserve`` is carried out by each instance's ``AdmissionMachine`` (``core/admission/machine.py``,
the product's policy): the harness plays its shell, asking the tables at once, waking a waiter
whose wait a wake cuts short once the current step is over (as a trio.Event does at the next
checkpoint), sending wakes to peers on the bus, and firing the machine's timers in time order
as ``tick`` advances the clock."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from coordinator.coordination.leases import AdmissionRules, LeaseAsk, LeaseRelease, NodeFacts
from coordinator.coordination.memory.leases import LeaseTables
from coordinator.core.admission.machine import (
    AdmissionMachine,
    AskStore,
    Decision,
    Failed,
    Granted,
    Queued,
    Step,
    Ticket,
    WaitUntil,
    WakeLocal,
    WakePeer,
    step_of,
)
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
from protocol import Assign, BusEnvelope, BusWake, Cancel, Chunk


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
#: the store never times out here (its calls are synchronous); the bound of the defaults
STORE_OUTAGE_S = 2.9


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
        self.admissions = {
            name: AdmissionMachine(
                name,
                queue_timeout_s=QUEUE_TIMEOUT_S,
                queue_max=self.rules.queue_max,
                max_active_per_key=self.rules.max_active_per_key,
                store_outage_s=STORE_OUTAGE_S,
            )
            for name in instances
        }
        # The shell's side of each waiting ticket: the wait it is in, and whether a wake for it
        # came that no wakeable wait consumed yet (the runtime's trio.Event).
        self._waits: dict[tuple[str, Ticket], WaitUntil] = {}
        self._woken: set[tuple[str, Ticket]] = set()
        # Tickets a wake may resume, once the step under way is over.
        self._ready: deque[tuple[str, Ticket]] = deque()
        self._depth = 0
        self._settling = False

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
        self._depth += 1
        try:
            for effect in effects:
                self._apply(source, effect)
        finally:
            self._depth -= 1
        if self._depth == 0:
            self._settle()

    def _apply(self, source: str, effect: Effect) -> None:
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
            heads = self.leases.release(
                LeaseRelease(
                    request_id=effect.task_id,
                    key_id=effect.key_id,
                    model=effect.model,
                    lease=effect.lease,
                    wake_models=effect.wake_models,
                    maybe_leases=effect.maybe_leases,
                ),
                self.rules,
                self.now,
            )
            for model, instance in heads:
                self._carry_out(source, self.admissions[source].wake(model, instance))
        elif isinstance(effect, NodeFactsChanged):
            self.put_facts(source, effect)
        elif isinstance(effect, WakeQueue):
            self._carry_out(source, self.admissions[source].wake_local(effect.model))
        else:
            assert isinstance(effect, NodesChanged | ReleaseOwnership), effect

    def put_facts(self, source: str, effect: NodeFactsChanged) -> None:
        conn = self.machines[source].owner.nodes.by_conn(effect.conn_id)
        if effect.gone or conn is None:
            self.leases.drop_facts(effect.node_id, effect.conn_id)
            return
        facts = NodeFacts(conn.node_id, conn.conn_id, source, conn.max_parallel)
        self.leases.put_facts(facts)

    # -- admission: the shell of each instance's AdmissionMachine ---------------------------

    @property
    def waiting(self) -> list[tuple[str, Reserve, float]]:
        """Reserves waiting for capacity (or for fresh views): (instance, reserve, until)."""
        return [
            (source, Reserve(*wait.ticket), wait.at)
            for source, admissions in self.admissions.items()
            for wait in admissions.waiting()
        ]

    def reserve(self, source: str, effect: Reserve) -> None:
        """What ``runtime/admission.py`` does, up to the first wait."""
        self.apply(source, self.granted(source, effect))

    def granted(self, source: str, effect: Reserve) -> list[Effect]:
        """The machine's effects once the lease is granted or refused, not yet applied ([] when
        it has to wait)."""
        ticket = (effect.task_id, effect.attempt)
        requester = self.machines[source].requester
        decisions = self.admissions[source].start(
            ticket,
            requester.model_of(effect.task_id),
            requester.candidates(effect.task_id, effect.attempt, self.now),
            self.now,
        )
        return self._admission(source, ticket, decisions)

    def _admission(
        self, source: str, ticket: Ticket, decisions: Sequence[Decision]
    ) -> list[Effect]:
        machine, admissions = self.machines[source], self.admissions[source]
        task_id, attempt = ticket
        while True:
            step = self._carry_out(source, decisions)
            if isinstance(step, AskStore):
                ask = LeaseAsk(
                    request_id=task_id,
                    instance_id=source,
                    key_id="",
                    model=step.model,
                    model_gb=0,
                    kv_gb=0,
                    candidates=tuple((v.node_id, v.conn_id) for v in step.candidates),
                    lease_id=f"{task_id}.{attempt}",
                    queue_entry_ttl_s=60,
                )
                admission = self.leases.admit(ask, self.rules, self.now)
                decisions = admissions.answer(ticket, admission, self.now)
            elif isinstance(step, WaitUntil):
                self._waits[(source, ticket)] = step
                if step.wakeable and (source, ticket) in self._woken:
                    self._ready.append((source, ticket))  # a wake came while it was asking
                return []
            elif isinstance(step, Granted):
                return machine.reserved(task_id, attempt, step.view, step.lease_id, self.now)
            elif isinstance(step, Failed):
                return machine.reserve_failed(task_id, attempt, step.error, self.now)
            else:
                self._woken.discard((source, ticket))
                return []

    def _carry_out(self, source: str, decisions: Sequence[Decision]) -> Step | None:
        for decision in decisions:
            if isinstance(decision, WakeLocal):
                self._woken.add((source, decision.ticket))
                self._ready.append((source, decision.ticket))
            elif isinstance(decision, WakePeer):
                envelope = BusWake(model=decision.model)
                if decision.instance_id in self.dead or decision.instance_id not in self.machines:
                    self.unreached_publishes.append((decision.instance_id, envelope))
                else:
                    self.in_flight.append((source, decision.instance_id, envelope))
            elif isinstance(decision, Queued):
                self.machines[source].requester.waiting(decision.ticket[0])
        step = step_of(decisions)
        if isinstance(step, Granted | Failed):
            self._woken.discard((source, step.ticket))
        return step

    def _resume(self, source: str, ticket: Ticket) -> None:
        """The ticket's wait is over: its time came, or a wake cut it short."""
        wait = self._waits.pop((source, ticket))
        if wait.wakeable:
            self._woken.discard((source, ticket))
        requester = self.machines[source].requester
        candidates = requester.candidates(ticket[0], ticket[1], self.now)
        decisions = self.admissions[source].waited(ticket, candidates, self.now)
        self.apply(source, self._admission(source, ticket, decisions))

    def _settle(self) -> None:
        """Resume the waits wakes cut short, until none is left."""
        if self._settling:
            return
        self._settling = True
        try:
            while self._ready:
                source, ticket = self._ready.popleft()
                wait = self._waits.get((source, ticket))
                woken = (source, ticket) in self._woken
                if source not in self.dead and wait is not None and wait.wakeable and woken:
                    self._resume(source, ticket)
        finally:
            self._settling = False

    def _fire_timers(self, until: float) -> None:
        """Fire the waits' timers due by ``until``, in time order, the clock at each."""
        while True:
            due = [
                (wait.at, key)
                for key, wait in self._waits.items()
                if key[0] not in self.dead and wait.at <= until
            ]
            if not due:
                return
            at, key = min(due)
            self.now = max(self.now, at)
            self._resume(*key)

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
        until = self.now + seconds
        self._settle()
        self._fire_timers(until)
        self.now = until
        for name, machine in self.machines.items():
            if name not in self.dead:
                self.apply(name, machine.tick(self.now, silence_deadline_s=silence_deadline_s))

    def ended(self, instance: str, task_id: str, outcome: str = "ok") -> None:
        self.apply(instance, self.machines[instance].request_ended(task_id, outcome, self.now))

    def node_of(self, task_id: str) -> Node:
        (node,) = [n for n in self.nodes.values() if task_id in n.running]
        return node
