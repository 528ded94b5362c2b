"""Trace events about capacity leases and the admission queue, for the invariants
``no-node-over-budget``, ``queue-order`` and ``fair-share``: what the shared store granted (with the node's
leases and memory in use right after, read from the store itself), who was queued, who left."""

from __future__ import annotations

from coordinator.coordination.leases import Admission, LeaseAsk
from coordinator.coordination.memory.coordination import MemoryState
from sim.trace import Trace


class LeaseObserver:
    def __init__(self, trace: Trace, state: MemoryState, name: str) -> None:
        self.trace, self.state, self.instance = trace, state, name

    def admitted(self, ask: LeaseAsk, admission: Admission) -> None:
        if admission.outcome == "granted":
            node_id = admission.node_id
            usage = self.state.leases.usage([node_id], self.state.now())[node_id]
            # The budgets the store holds for the node (two agents sharing an identity may
            # announce different ones; the node-level check counts at each agent).
            facts = self.state.leases.facts(node_id)
            self.trace.emit(
                "lease.granted",
                task=ask.request_id,
                model=ask.model,
                key=ask.key_id,
                node=node_id,
                instance=self.instance,
                held=usage.leases,
                memory_gb=usage.memory_gb,
                max_parallel=facts.max_parallel if facts else None,
                vram_gb=facts.memory_gb if facts else None,
            )
        elif admission.outcome == "queued":
            self.trace.emit(
                "lease.queued",
                task=ask.request_id,
                model=ask.model,
                instance=self.instance,
                key=ask.key_id,
                weight=ask.weight,
            )
        elif admission.outcome == "refused":  # it lost its place in the queue
            self.trace.emit("lease.left", task=ask.request_id)

    def left(self, request_id: str) -> None:
        self.trace.emit("lease.left", task=request_id)
