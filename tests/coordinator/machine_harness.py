"""A cluster of pure ``InstanceMachine``s wired together in memory, for tests of the cluster
protocol without trio, Redis or sockets: the test plays the bus, the nodes and the clock.

Bus envelopes between instances wait in ``in_flight`` until ``deliver`` (FIFO per sender and
receiver, like the outbox's ordered lanes) and can be dropped with their instance."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from coordinator.core.effects import (
    CloseNode,
    Deliver,
    Dispatch,
    Effect,
    NodesChanged,
    Publish,
    ReleaseOwnership,
    SendToNode,
    TaskEvent,
)
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.node_table import NodeConnection
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
            else:
                assert isinstance(effect, NodesChanged | ReleaseOwnership), effect

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
        for name, machine in self.machines.items():
            if name not in self.dead:
                self.apply(name, machine.tick(self.now, silence_deadline_s=silence_deadline_s))

    def ended(self, instance: str, task_id: str, outcome: str = "ok") -> None:
        self.apply(instance, self.machines[instance].request_ended(task_id, outcome, self.now))

    def node_of(self, task_id: str) -> Node:
        (node,) = [n for n in self.nodes.values() if task_id in n.running]
        return node
