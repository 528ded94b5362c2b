"""Capacity leases and admission queues of the memory backend, on the time the caller passes
(the backend's injected clock). The reference semantics (``leases.py``); the Redis scripts in
``redis/lease_scripts.py`` do the same on the server's clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    LeaseUsage,
    NodeFacts,
    RefusalReason,
)
from coordinator.coordination.memory.queues import ModelQueue, QueueEntry, new_queue

__all__ = ["LeaseTables", "memory_in_use"]

#: Budgets are compared with this much slack, so that sums of decimal sizes that equal the
#: budget exactly are not refused by float rounding.
EPSILON_GB = 1e-9

#: (registry, member, window_s, now) -> whether the member beat within the window
Alive = Callable[[str, str, float, float], bool]


@dataclass(slots=True)
class _Lease:
    expires_at: float
    model: str
    model_gb: float
    kv_gb: float


@dataclass(slots=True)
class _Node:
    facts: NodeFacts | None = None
    leases: dict[str, _Lease] = field(default_factory=dict)


def memory_in_use(resident: dict[str, float], leases: Iterable[tuple[str, float, float]]) -> float:
    """GB in use: every model resident or leased counted once, plus each lease's KV budget.
    ``leases``: (model, model_gb, kv_gb). A resident model counts at its resident size; a model
    only leased counts at the largest size its leases name, so the sum does not depend on the
    order of the leases (the Redis backend keeps them in a hash, in no particular order)."""
    sizes = dict(resident)
    kv = 0.0
    for model, model_gb, kv_gb in leases:
        if model not in resident:
            sizes[model] = max(sizes.get(model, model_gb), model_gb)
        kv += kv_gb
    return sum(sizes.values()) + kv


class LeaseTables:
    def __init__(self, alive: Alive) -> None:
        self._alive = alive
        self._nodes: dict[str, _Node] = {}
        self._queues: dict[str, ModelQueue] = {}
        self._active: dict[str, dict[str, str]] = {}

    # -- facts ------------------------------------------------------------------------------

    def put_facts(self, facts: NodeFacts) -> None:
        self._nodes.setdefault(facts.node_id, _Node()).facts = facts

    def facts(self, node_id: str) -> NodeFacts | None:
        node = self._nodes.get(node_id)
        return None if node is None else node.facts

    def drop_facts(self, node_id: str, conn_id: str) -> None:
        node = self._nodes.get(node_id)
        if node is not None and node.facts is not None and node.facts.conn_id == conn_id:
            node.facts = None

    # -- admission --------------------------------------------------------------------------

    def admit(self, ask: LeaseAsk, rules: AdmissionRules, now: float) -> Admission:
        if ask.again:
            held = self._held_again(ask, rules, now)
            if held is not None:
                return held
        limit = rules.max_active_per_key
        active = self._active.setdefault(ask.key_id, {})
        entered = False
        if limit and ask.request_id not in active:
            self._drop_dead(active, rules, now)
            if len(active) >= limit:
                return Admission("key_limit")
            active[ask.request_id] = ask.instance_id
            entered = True

        queue = self._queue(ask.model, rules, now)
        queued = ask.request_id in queue
        ahead = queue.position(ask.request_id) if queued else len(queue)
        refusals: dict[str, RefusalReason] = {}
        if ahead == 0:
            for node_id, conn_id in ask.candidates:
                reason = self._try_reserve(node_id, conn_id, ask, rules, now)
                if reason is None:
                    queue.granted(ask.request_id)
                    # The new head is judged like any head: a dead or expired one is dropped,
                    # else the caller would wake an instance that will never try again.
                    grant = self._granted(ask, node_id, conn_id, rules, now)
                    return dataclasses.replace(grant, refusals=refusals)
                refusals[node_id] = reason
            if ask.candidates and all(r in ("stale", "gone") for r in refusals.values()):
                if entered:
                    active.pop(ask.request_id, None)
                queue.leave(ask.request_id)
                return Admission("refused", refusals=refusals)
        if not queued:
            if len(queue) >= rules.queue_max:
                if entered:
                    active.pop(ask.request_id, None)
                return Admission("queue_full", refusals=refusals)
            entry = QueueEntry(ask.instance_id, now + ask.queue_entry_ttl_s, ask.key_id)
            queue.join(ask.request_id, entry, ask.weight)
            ahead = queue.position(ask.request_id)
        head = queue.head()  # as it stands: a queued answer judges no entry
        return Admission(
            "queued", position=ahead, refusals=refusals, head=head[0] if head is not None else ""
        )

    def _held_again(self, ask: LeaseAsk, rules: AdmissionRules, now: float) -> Admission | None:
        """Asked again: the lease an earlier copy of this ask was granted, granted once more
        where its node is still usable as that candidate (else dropped: it serves nobody)."""
        for node_id, conn_id in ask.candidates:
            node = self._nodes.get(node_id)
            lease = node.leases.get(ask.lease_id) if node is not None else None
            if node is None or lease is None or lease.expires_at <= now:
                continue
            facts = node.facts
            usable = (
                facts is not None
                and facts.conn_id == conn_id
                and self._alive(
                    rules.presence_registry, facts.instance_id, rules.facts_stale_s, now
                )
            )
            if usable:
                self._queue(ask.model, rules, now).leave(ask.request_id)
                return self._granted(ask, node_id, conn_id, rules, now)
            del node.leases[ask.lease_id]
        return None

    def _try_reserve(
        self, node_id: str, conn_id: str, ask: LeaseAsk, rules: AdmissionRules, now: float
    ) -> RefusalReason | None:
        node = self._nodes.get(node_id)
        facts = node.facts if node is not None else None
        if node is None or facts is None or facts.conn_id != conn_id:
            return "gone"
        if not self._alive(rules.presence_registry, facts.instance_id, rules.facts_stale_s, now):
            return "stale"
        self._drop_expired(node, now)
        if len(node.leases) >= facts.max_parallel:
            return "full"
        if facts.memory_gb is not None:
            held = [(lease.model, lease.model_gb, lease.kv_gb) for lease in node.leases.values()]
            after = memory_in_use(facts.resident, [*held, (ask.model, ask.model_gb, ask.kv_gb)])
            if after > facts.memory_gb + EPSILON_GB:
                return "memory"
        node.leases[ask.lease_id] = _Lease(
            now + rules.lease_ttl_s, ask.model, ask.model_gb, ask.kv_gb
        )
        return None

    # -- the rest of a lease's life ---------------------------------------------------------

    def renew(self, leases: Sequence[tuple[str, str]], ttl_s: float, now: float) -> list[bool]:
        renewed = []
        for node_id, lease_id in leases:
            node = self._nodes.get(node_id)
            lease = node.leases.get(lease_id) if node is not None else None
            if lease is None or lease.expires_at <= now:
                renewed.append(False)
                continue
            lease.expires_at = now + ttl_s
            renewed.append(True)
        return renewed

    def release(
        self, release: LeaseRelease, rules: AdmissionRules, now: float
    ) -> list[tuple[str, str]]:
        request_id, key_id, lease = release.request_id, release.key_id, release.lease
        ending = [lease] if lease is not None else []
        for node_id, lease_id in [*ending, *release.maybe_leases]:
            node = self._nodes.get(node_id)
            if node is not None:
                node.leases.pop(lease_id, None)
        queue = self._queues.get(release.model)
        if queue is not None:
            queue.leave(request_id)
        active = self._active.get(key_id)
        if active is not None:
            active.pop(request_id, None)
            if not active:
                del self._active[key_id]
        heads = []
        for name in dict.fromkeys(release.wake_models):
            head = self._queue(name, rules, now).head()
            if head is not None:
                heads.append((name, head[1].instance_id))
        return heads

    # -- views ------------------------------------------------------------------------------

    def usage(self, node_ids: Sequence[str], now: float) -> dict[str, LeaseUsage]:
        usage = {}
        for node_id in node_ids:
            node = self._nodes.get(node_id)
            if node is None:
                usage[node_id] = LeaseUsage(0, 0.0)
                continue
            self._drop_expired(node, now)
            resident = node.facts.resident if node.facts is not None else {}
            held = [(lease.model, lease.model_gb, lease.kv_gb) for lease in node.leases.values()]
            usage[node_id] = LeaseUsage(len(node.leases), memory_in_use(resident, held))
        return usage

    def queue_depths(
        self, models: Sequence[str], rules: AdmissionRules, now: float
    ) -> dict[str, int]:
        return {model: len(self._queue(model, rules, now)) for model in models}

    def size(self) -> int:
        return (
            sum(len(n.leases) + (n.facts is not None) for n in self._nodes.values())
            + sum(len(q) for q in self._queues.values())
            + sum(len(a) for a in self._active.values())
        )

    # -- housekeeping -----------------------------------------------------------------------

    def _queue(self, model: str, rules: AdmissionRules, now: float) -> ModelQueue:
        """The model's queue with its head usable: expired entries and entries of silent
        instances at its head are dropped (those further back go when they reach it)."""
        queue = self._queues.get(model)
        if queue is None:
            queue = self._queues[model] = new_queue(rules.queue_policy)
        while (head := queue.head()) is not None:
            request_id, entry = head
            fresh = entry.expires_at > now and self._alive(
                rules.presence_registry, entry.instance_id, rules.requester_stale_s, now
            )
            if fresh:
                break
            queue.leave(request_id)
        return queue

    def _granted(
        self, ask: LeaseAsk, node_id: str, conn_id: str, rules: AdmissionRules, now: float
    ) -> Admission:
        """The grant, naming the queue's usable head (its instance and request id) next."""
        head = self._queue(ask.model, rules, now).head()
        return Admission(
            "granted",
            node_id=node_id,
            conn_id=conn_id,
            lease_id=ask.lease_id,
            next_in_queue="" if head is None else head[1].instance_id,
            head="" if head is None else head[0],
        )

    def _drop_dead(self, active: dict[str, str], rules: AdmissionRules, now: float) -> None:
        for request_id, instance_id in list(active.items()):
            if not self._alive(rules.presence_registry, instance_id, rules.requester_stale_s, now):
                del active[request_id]

    @staticmethod
    def _drop_expired(node: _Node, now: float) -> None:
        for lease_id in [i for i, lease in node.leases.items() if lease.expires_at <= now]:
            del node.leases[lease_id]
