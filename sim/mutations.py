"""Deliberately broken variants of the real code, applied only inside a simulation run.

They show that the simulator can fail: with a mutation on, a sweep must report failing seeds,
and replaying one must fail the same way. The production code has no switches for this."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from unittest import mock

from coordinator.coordination.memory.leases import LeaseTables
from coordinator.coordination.memory.monitor import MonitorTables
from coordinator.coordination.memory.queues import FairQueue, FifoQueue
from coordinator.core import owner, task_content
from coordinator.core.forwarding import ForwardingTable
from coordinator.core.hosts import direct_hosts
from coordinator.core.tracker import TaskTracker, Verdict
from coordinator.runtime.cluster.membership import Membership


@contextmanager
def _owner_sweeper_off() -> Iterator[None]:
    async def nobody_dead(self: Membership, instance_ids: list[str]) -> set[str]:
        return set()

    with mock.patch.object(Membership, "dead_among", nobody_dead):
        yield


@contextmanager
def _connection_check_off() -> Iterator[None]:
    original = TaskTracker._check

    def any_source(self: TaskTracker, task_id: str, source_conn: str):  # type: ignore[no-untyped-def]
        task = self._pending.get(task_id)
        if task is not None:
            return Verdict.ACCEPTED, task
        return original(self, task_id, source_conn)

    def any_conn(self: ForwardingTable, task_id: str, conn_id: str):  # type: ignore[no-untyped-def]
        forward = self.get(task_id)
        if forward is not None:
            return Verdict.ACCEPTED, replace(forward, conn_id=conn_id)
        return original_forward(self, task_id, conn_id)

    # Both gates: the owner's (forwarding table) and the requester's (tracker).
    original_forward = ForwardingTable.check
    with (
        mock.patch.object(TaskTracker, "_check", any_source),
        mock.patch.object(ForwardingTable, "check", any_conn),
    ):
        yield


@contextmanager
def _lease_check_off() -> Iterator[None]:
    """The lease script forgets the parallel budget: every node looks like it has room."""

    def no_limit(self: LeaseTables, node_id: str, conn_id: str, ask, rules, now):  # type: ignore[no-untyped-def]
        node = self._nodes.get(node_id)
        if node is not None and node.facts is not None:
            facts = replace(node.facts, max_parallel=10**6, memory_gb=None)
            original_facts, node.facts = node.facts, facts
            try:
                return original(self, node_id, conn_id, ask, rules, now)
            finally:
                node.facts = original_facts
        return original(self, node_id, conn_id, ask, rules, now)

    original = LeaseTables._try_reserve
    with mock.patch.object(LeaseTables, "_try_reserve", no_limit):
        yield


@contextmanager
def _queue_order_off() -> Iterator[None]:
    """Admission lets each asking request jump to the head of its model's queue (under the
    fair order: to the front of its key's requests; its key keeps its place in the ring)."""

    def queue_jumping(self: LeaseTables, ask, rules, now):  # type: ignore[no-untyped-def]
        queue = self._queues.get(ask.model)
        if isinstance(queue, FifoQueue) and ask.request_id in queue:
            entries = queue._entries
            entries[ask.request_id] = entries.pop(ask.request_id)
            for request_id in [r for r in entries if r != ask.request_id]:
                entries[request_id] = entries.pop(request_id)
        elif isinstance(queue, FairQueue) and ask.request_id in queue:
            key_id = queue._key_of[ask.request_id]
            key = queue._ring[key_id]
            for request_id in [r for r in key.entries if r != ask.request_id]:
                key.entries[request_id] = key.entries.pop(request_id)
        return original(self, ask, rules, now)

    original = LeaseTables.admit
    with mock.patch.object(LeaseTables, "admit", queue_jumping):
        yield


@contextmanager
def _fair_turns_off() -> Iterator[None]:
    """The fair queue forgets to end a key's turn: the key at the ring's front keeps it while
    it has requests waiting (its deficit is never spent)."""

    def endless_turn(self: FairQueue, request_id: str) -> None:
        head = self.head()
        if head is not None and head[0] == request_id:
            key = self._ring[self._key_of[request_id]]
            key.deficit += 1  # spent below, so never reaches 0
        original(self, request_id)

    original = FairQueue.granted
    with mock.patch.object(FairQueue, "granted", endless_turn):
        yield


@contextmanager
def _monitor_fence_off() -> Iterator[None]:
    """The fenced fact write forgets its token compare: a deposed monitor's write goes in."""

    def unfenced(self: MonitorTables, candidate, epoch, host_id, record, *, fenced):  # type: ignore[no-untyped-def]
        return original(self, candidate, epoch, host_id, record, fenced=False)

    original = MonitorTables.write
    with mock.patch.object(MonitorTables, "write", unfenced):
        yield


@contextmanager
def _fact_age_check_off() -> Iterator[None]:
    """Placement forgets the staleness window: facts of any age are trusted
    (``direct_hosts.host_state`` called with an infinite window)."""
    original = direct_hosts.host_state

    def ageless(read, *, current_epoch, stale_s, now):  # type: ignore[no-untyped-def]
        return original(read, current_epoch=current_epoch, stale_s=math.inf, now=now)

    with mock.patch.object(direct_hosts, "host_state", ageless):
        yield


@contextmanager
def _v1_fallback_off() -> Iterator[None]:
    """The owner forgets a node's protocol version: a v1 node gets the v2 assign as is."""
    original = task_content.assign_for

    def always_v2(protocol, envelope):  # type: ignore[no-untyped-def]
        return original(2, envelope)

    with mock.patch.object(owner, "assign_for", always_v2):
        yield


MUTATIONS: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "owner-sweeper-off": _owner_sweeper_off,
    "connection-check-off": _connection_check_off,
    "lease-check-off": _lease_check_off,
    "queue-order-off": _queue_order_off,
    "fair-turns-off": _fair_turns_off,
    "monitor-fence-off": _monitor_fence_off,
    "fact-age-check-off": _fact_age_check_off,
    "v1-fallback-off": _v1_fallback_off,
}


def applied(name: str | None) -> AbstractContextManager[None]:
    if name is None:
        return nullcontext()
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}; known: {', '.join(sorted(MUTATIONS))}")
    return MUTATIONS[name]()
