"""A hypothesis stateful test of the cluster machines against a small reference model.

Random interleavings of requests, node answers (genuine, forged, replayed), bus deliveries,
node losses, instance deaths, clients leaving and time passing. Checked throughout: no task
ends twice and nothing is delivered after its end; a task only ever receives what the node it
is assigned to said (forged answers never get through); a dead owner's tasks all end at the
first judgement after its death. Checked at the end, after every node answered and time ran
past every deadline: every task ended exactly once (or its client left)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator.core.effects import ChunkEvent, DoneEvent, FailedEvent, MovedEvent
from coordinator.errors import GemmaNetError
from protocol import Chunk, Error, Result
from tests.coordinator.machine_harness import MachineCluster

INSTANCES = ("A", "B", "C")


class ClusterModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cluster = MachineCluster(*INSTANCES, seed=1)
        for i, name in enumerate(INSTANCES):
            self.cluster.connect(name, f"n{i}", max_parallel=2)
        self.cluster.connect("A", "n3", max_parallel=1)
        self.requested_at: dict[str, str] = {}  # task -> requesting instance
        self.client_left: set[str] = set()
        self.seq: dict[str, int] = {}
        self.count = 0

    # -- helpers ----------------------------------------------------------------------------

    def running(self) -> list[tuple[str, str]]:
        return sorted(
            (task_id, conn_id)
            for conn_id, node in self.cluster.nodes.items()
            if node.closed_with is None and node.instance not in self.cluster.dead
            for task_id in node.running
        )

    def live(self) -> list[str]:
        return [i for i in INSTANCES if i not in self.cluster.dead]

    # -- rules ------------------------------------------------------------------------------

    @rule(where=st.sampled_from(INSTANCES), model=st.sampled_from(["m", "m", "x"]))
    def submit(self, where: str, model: str) -> None:
        if where in self.cluster.dead:
            return
        self.count += 1
        task_id = f"t{self.count}"
        try:
            self.cluster.submit(where, task_id, model=model)
        except GemmaNetError:
            self.cluster.events.pop(task_id, None)
            return
        self.requested_at[task_id] = where

    @precondition(lambda self: self.running())
    @rule(data=st.data(), kind=st.sampled_from(["chunk", "result", "error", "busy"]))
    def node_answers(self, data: st.DataObject, kind: str) -> None:
        task_id, conn_id = data.draw(st.sampled_from(self.running()))
        seq = self.seq.get(task_id, 0)
        if kind == "chunk":
            self.seq[task_id] = seq + 1
            envelope: object = Chunk(task_id=task_id, seq=seq, delta=f"{conn_id}:{seq}|")
        elif kind == "result":
            envelope = Result(task_id=task_id, output=f"{task_id}@{conn_id}", chunks=seq)
        else:
            code = "node_busy" if kind == "busy" else "boom"
            envelope = Error(task_id=task_id, code=code, message=conn_id)
        self.cluster.node_says(conn_id, envelope)

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def someone_else_answers(self, data: st.DataObject) -> None:
        task_id, conn_id = data.draw(st.sampled_from(self.running()))
        others = [
            c for c, n in self.cluster.nodes.items() if c != conn_id and n.closed_with is None
        ]
        if not others:
            return
        forger = data.draw(st.sampled_from(others))
        if self.cluster.nodes[forger].instance in self.cluster.dead:
            return
        node = self.cluster.nodes[forger]
        machine = self.cluster.machines[node.instance]
        for envelope in (
            Chunk(task_id=task_id, seq=self.seq.get(task_id, 0), delta="FORGED"),
            Result(task_id=task_id, output="FORGED"),
        ):
            self.cluster.apply(node.instance, machine.node_envelope(forger, envelope, 0.0))

    @rule(n=st.integers(1, 5))
    def deliver(self, n: int) -> None:
        self.cluster.deliver(n)

    @precondition(lambda self: len(self.live()) > 1)
    @rule(victim=st.sampled_from(INSTANCES))
    def instance_dies_and_is_judged(self, victim: str) -> None:
        if victim in self.cluster.dead:
            return
        self.cluster.kill(victim)
        self.cluster.judge()
        for name in self.live():
            pending = self.cluster.machines[name].requester.tracker.pending()
            owners = {t.owner_instance for t in pending}
            assert victim not in owners, f"{name} still waits on dead {victim}"

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def node_disconnects(self, data: st.DataObject) -> None:
        _, conn_id = data.draw(st.sampled_from(self.running()))
        node = self.cluster.nodes[conn_id]
        machine = self.cluster.machines[node.instance]
        node.closed_with = 1006
        self.cluster.apply(node.instance, machine.node_disconnected(conn_id, "gone", 0.0))

    @precondition(lambda self: self.requested_at)
    @rule(data=st.data())
    def client_leaves(self, data: st.DataObject) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.requested_at)))
        where = self.requested_at[task_id]
        if where in self.cluster.dead or task_id in self.client_left:
            return
        self.client_left.add(task_id)
        self.cluster.ended(where, task_id, "client_gone")

    @rule(seconds=st.sampled_from([0.5, 3.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.cluster.tick(seconds)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def each_task_ends_at_most_once_with_only_its_nodes_words(self) -> None:
        for task_id, events in self.cluster.events.items():
            ends = [e for e in events if isinstance(e, DoneEvent | FailedEvent)]
            assert len(ends) <= 1, (task_id, events)
            if ends:
                assert events[-1] is ends[0], f"{task_id} got something after its end: {events}"
            for event in events:
                if isinstance(event, ChunkEvent):
                    assert "FORGED" not in event.delta
                if isinstance(event, DoneEvent):
                    assert event.output.startswith(f"{task_id}@"), event
            # A chunk or result comes from the connection the task is assigned to at that time.
            assigned = None
            for event in events:
                if isinstance(event, MovedEvent):
                    assigned = event.conn_id
                elif isinstance(event, ChunkEvent) and assigned is not None:
                    assert event.delta.startswith(f"{assigned}:"), (task_id, events)
                elif isinstance(event, DoneEvent) and assigned is not None:
                    assert event.output == f"{task_id}@{assigned}", (task_id, events)

    def teardown(self) -> None:
        # Drain: deliver everything, let every node answer, then run past every deadline.
        for _ in range(3):
            self.cluster.deliver()
            for task_id, conn_id in self.running():
                self.cluster.node_says(
                    conn_id, Result(task_id=task_id, output=f"{task_id}@{conn_id}")
                )
            self.cluster.deliver()
        self.cluster.tick(60.0)
        self.cluster.deliver()
        for task_id, where in self.requested_at.items():
            if task_id in self.client_left or where in self.cluster.dead:
                continue
            ends = [
                e for e in self.cluster.events[task_id] if isinstance(e, DoneEvent | FailedEvent)
            ]
            assert len(ends) == 1, (task_id, self.cluster.events[task_id])


TestClusterModel = ClusterModel.TestCase
TestClusterModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
