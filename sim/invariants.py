"""Properties checked while a run goes. Each invariant watches the trace; adding one is a class
with ``observe`` (and optionally ``at_end``) plus an entry in ``ALL_INVARIANTS``.

An invariant that breaks raises ``Violation`` at the virtual time of the offending event, so a
replay stops at the same event."""

from __future__ import annotations

from collections import deque
from typing import Any

from sim.invariant_base import Invariant, Violation
from sim.queue_invariants import NoKeyStarved, QueueOrderKept
from sim.trace import Event

__all__ = ["ALL_INVARIANTS", "Invariant", "Violation", "as_dict", "fresh_invariants"]

DEAD_OWNER_BOUND_S = 3.0
# A replace travels over the bus; give it this long before two live connections are a bug.
REPLACE_SETTLE_S = 3.0


class EveryRequestEndsOnce(Invariant):
    """Every request ends exactly once, with a result or an explicit error."""

    name = "ends-exactly-once"

    def __init__(self) -> None:
        self.open: dict[str, float] = {}
        self.ended: set[str] = set()

    def observe(self, event: Event) -> None:
        kind, t = event["kind"], event["t"]
        if kind == "request.start":
            self.open[event["rid"]] = t
        elif kind == "request.end":
            rid = event["rid"]
            if rid in self.ended:
                self.fail(f"request {rid} ended twice", t)
            if not event.get("outcome"):
                self.fail(f"request {rid} ended without an outcome", t)
            self.ended.add(rid)
            self.open.pop(rid, None)

    def at_end(self, t: float) -> None:
        if self.open:
            rid = min(self.open, key=lambda r: (self.open[r], r))
            self.fail(f"{len(self.open)} request(s) never ended, first {rid}", t)


class OwnAnswerFromAssignedNode(Invariant):
    """A successful answer is the request's own output, and the node the request reports is
    one that really received the task — never a forged or crossed answer. (A task can reach
    more than one node: one placed again after its owner froze before confirming it also runs,
    briefly, on the first node when the owner resumes; that copy's answers are dropped.)"""

    name = "own-answer"

    def __init__(self) -> None:
        self.prompts: dict[str, str] = {}
        self.assigned: dict[str, list[str]] = {}

    def observe(self, event: Event) -> None:
        kind = event["kind"]
        if kind == "request.start":
            # What the echo node answers: the prompt, or a conversation's transcript.
            self.prompts[event["rid"]] = str(event.get("expect", event["prompt"]))
        elif kind == "node.assign":
            self.assigned.setdefault(event["task"], []).append(event["node"])
        elif kind == "request.end" and event["outcome"] == "ok":
            rid, t = event["rid"], event["t"]
            if event["output"] != self.prompts.get(rid):
                self.fail(f"request {rid} got {event['output']!r}, not its own output", t)
            assigned = self.assigned.get(event["task"], [])
            if event["node"] not in assigned:
                self.fail(
                    f"request {rid} answered as node {event['node']}, assigned to {assigned}", t
                )


class DeadOwnerTasksEndFast(Invariant):
    """When the instance owning a node dies (crash, or a freeze past the bound), tasks that
    other instances requested on its nodes end within 3 s of virtual time — unless their
    requester is itself frozen or crashed meanwhile (nobody can end them then)."""

    name = "dead-owner-bound"

    def __init__(self) -> None:
        self.where: dict[str, str] = {}  # task -> instance owning the node that got it
        self.requester: dict[str, str] = {}  # task -> requesting instance
        self.open_tasks: set[str] = set()
        self.deadlines: dict[str, float] = {}
        self.down_until: dict[str, float] = {}  # instance -> frozen until (inf: crashed)

    def observe(self, event: Event) -> None:
        kind, t = event["kind"], event["t"]
        for task, deadline in sorted(self.deadlines.items()):
            if t > deadline and task in self.open_tasks:
                self.fail(f"task {task} of a dead owner still pending after the bound", t)
        if kind == "fault" and event["fault"] in ("freeze", "crash_restart"):
            down = event["target"]
            until = t + event["duration"] if event["fault"] == "freeze" else float("inf")
            self.down_until[down] = until
            for task in [k for k in self.deadlines if self.requester.get(k) == down]:
                del self.deadlines[task]
        if kind == "node.assign":
            self.where[event["task"]] = event["instance"]
        elif kind == "request.placed":
            self.requester[event["task"]] = event["instance"]
            self.open_tasks.add(event["task"])
        elif kind == "request.end" and event.get("task"):
            self.open_tasks.discard(event["task"])
            self.deadlines.pop(event["task"], None)
        elif kind == "owner.dead":
            dead = event["instance"]
            for task in sorted(self.open_tasks):
                requester = self.requester.get(task, "")
                if self.where.get(task) != dead or requester == dead:
                    continue
                if self.down_until.get(requester, 0.0) > t:
                    continue  # its requester cannot act now
                self.deadlines.setdefault(task, event["since"] + DEAD_OWNER_BOUND_S)


class OneLiveConnectionPerNode(Invariant):
    """A node identity is held by at most one live instance, once a replace had time to
    travel."""

    name = "one-connection-per-node"

    def __init__(self) -> None:
        self.since: dict[str, float] = {}

    def observe(self, event: Event) -> None:
        if event["kind"] != "tick":
            return
        t = event["t"]
        holders: dict[str, list[str]] = event["holders"]
        for node in sorted(holders):
            if len(holders[node]) > 1:
                first = self.since.setdefault(node, t)
                if t - first > REPLACE_SETTLE_S:
                    self.fail(f"node {node} live on {holders[node]} for {t - first:.1f} s", t)
            else:
                self.since.pop(node, None)


class SharedRateLimitHolds(Invariant):
    """No window of the rate-limit period holds more allowed requests than the limit, for any
    key, across all instances."""

    name = "rate-limit"

    def __init__(self) -> None:
        self.allowed: dict[str, deque[float]] = {}

    def observe(self, event: Event) -> None:
        if event["kind"] != "ratelimit.allowed":
            return
        t, key, limit, period = event["t"], event["key"], event["limit"], event["period"]
        window = self.allowed.setdefault(key, deque())
        window.append(t)
        while window and window[0] <= t - period:
            window.popleft()
        if len(window) > limit:
            self.fail(f"key {key}: {len(window)} allowed within {period} s (limit {limit})", t)


class NoNodeOverBudget(Invariant):
    """No node runs more tasks than its max parallel (counted at the node), and the shared
    store never grants a lease past a node's parallel or memory budget."""

    name = "no-node-over-budget"

    def observe(self, event: Event) -> None:
        kind, t = event["kind"], event["t"]
        if kind == "node.assign" and event["running"] > event["max_parallel"]:
            self.fail(
                f"node {event['node']} was asked to run {event['running']} tasks at once "
                f"(max parallel {event['max_parallel']})",
                t,
            )
        elif kind == "lease.granted":
            limit, budget = event["max_parallel"], event["vram_gb"]
            if limit is not None and event["held"] > limit:
                self.fail(
                    f"node {event['node']} holds {event['held']} leases (max parallel {limit})", t
                )
            if budget is not None and event["memory_gb"] > budget + 1e-9:
                self.fail(
                    f"node {event['node']} has {event['memory_gb']:g} GB leased "
                    f"(budget {budget:g} GB)",
                    t,
                )


class OneMonitorPerEpoch(Invariant):
    """Fencing, judged on the store's side: epochs are handed out in increasing order; a fact
    write is accepted only under the epoch current at that moment; so at most one monitor's
    writes are accepted per epoch, and accepted epochs never go backwards."""

    name = "one-monitor-per-epoch"

    def __init__(self) -> None:
        self.writer: dict[int, str] = {}  # epoch -> the candidate whose writes it accepted
        self.newest_handed_out = 0
        self.newest_accepted = 0

    def observe(self, event: Event) -> None:
        kind, t = event["kind"], event["t"]
        if kind == "monitor.acquired":
            epoch = event["epoch"]
            if epoch <= self.newest_handed_out:
                self.fail(
                    f"{event['candidate']} was handed epoch {epoch} after epoch "
                    f"{self.newest_handed_out} (an epoch handed out again, or going backwards)",
                    t,
                )
            self.newest_handed_out = epoch
        elif kind == "monitor.write" and event["accepted"]:
            epoch, candidate = event["epoch"], event["candidate"]
            if epoch != event["current_epoch"]:
                self.fail(
                    f"{candidate}'s write of {event['host']} under epoch {epoch} was accepted "
                    f"while epoch {event['current_epoch']} is current (a deposed monitor's write)",
                    t,
                )
            if epoch < self.newest_accepted:
                self.fail(
                    f"{candidate}'s write under epoch {epoch} was accepted after one under "
                    f"epoch {self.newest_accepted} (epochs went backwards)",
                    t,
                )
            first = self.writer.setdefault(epoch, candidate)
            if first != candidate:
                self.fail(f"epoch {epoch}: writes of both {first} and {candidate} accepted", t)
            self.newest_accepted = epoch


class NoStaleFacts(Invariant):
    """Nothing is placed on stale facts: a reader judges each host with placement's own rule
    (``direct_hosts.host_state``, the ``fresh`` of a ``facts.read``); each host's visible fact is the one the last
    accepted write put there; a host's facts never go back in time (no accepted write carries
    an observation older than the one it replaces); and a fact a reader trusts as fresh holds
    an observation at most the staleness window plus the election TTL old. (Facts are stamped
    at the write: a primary stopped between its poll and its write for less than its TTL still
    holds the lease, so its write is rightly accepted with an observation up to a TTL old.)"""

    name = "no-stale-facts"

    def __init__(self) -> None:
        # host -> (written at, epoch, observed at) of the fact readers see
        self.visible: dict[str, tuple[float, int, float]] = {}
        self.window_s = 0.0

    def observe(self, event: Event) -> None:
        kind, t = event["kind"], event["t"]
        if kind == "monitor.timing":
            self.window_s = event["stale_s"] + event["ttl_s"]
        elif kind == "monitor.write" and event["accepted"]:
            host, observed = event["host"], event["observed_at"]
            before = self.visible.get(host)
            if before is not None and observed < before[2]:
                self.fail(
                    f"host {host}: a fact observed at t={observed:.3f} replaced one observed at "
                    f"t={before[2]:.3f} (facts went back in time)",
                    t,
                )
            self.visible[host] = (t, event["epoch"], observed)
        elif kind == "facts.read":
            for host, fact in sorted(event["facts"].items()):
                known = self.visible.get(host)
                if known is None or known[:2] != (fact["written_at"], fact["epoch"]):
                    self.fail(f"a reader saw a fact of {host} no accepted write put there", t)
                if fact["fresh"] and t - known[2] > self.window_s + 1e-6:
                    self.fail(
                        f"a reader trusted {host}'s fact observed {t - known[2]:.3f} s ago "
                        f"(window {self.window_s:g} s)",
                        t,
                    )


class TasksInTheNodesVersion(Invariant):
    """A node speaking only protocol v1 is never sent a v2 envelope (it gets a conversation as
    its transcript), and an answer reports usage exactly when the node that gave it speaks v2,
    with the node's own count — never a made-up or a crossed one."""

    name = "node-version"

    def __init__(self) -> None:
        self.protocol: dict[tuple[str, str], int] = {}

    def observe(self, event: Event) -> None:
        kind = event["kind"]
        if kind == "node.assign":
            if event["protocol"] < event["v"]:
                self.fail(
                    f"node {event['node']} (v{event['protocol']}) got a v{event['v']} assign",
                    event["t"],
                )
            self.protocol[(event["task"], event["node"])] = event["protocol"]
        elif kind == "request.end" and event["outcome"] == "ok":
            version = self.protocol.get((event["task"], event["node"]))
            tokens = event["completion_tokens"]
            expected = len(event["output"].split()) if version == 2 else None
            if tokens != expected:
                self.fail(
                    f"request {event['rid']} reports {tokens} completion tokens from a"
                    f" v{version} node, not {expected}",
                    event["t"],
                )


ALL_INVARIANTS: list[type[Invariant]] = [
    EveryRequestEndsOnce,
    OwnAnswerFromAssignedNode,
    DeadOwnerTasksEndFast,
    OneLiveConnectionPerNode,
    SharedRateLimitHolds,
    NoNodeOverBudget,
    QueueOrderKept,
    NoKeyStarved,
    OneMonitorPerEpoch,
    NoStaleFacts,
    TasksInTheNodesVersion,
]


def fresh_invariants() -> list[Invariant]:
    return [cls() for cls in ALL_INVARIANTS]


def as_dict(violation: Violation) -> dict[str, Any]:
    return {"invariant": violation.invariant, "message": violation.message, "t": violation.t}
