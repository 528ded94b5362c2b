"""The admission queue's invariants, judged from the store's own trace events
(``sim/lease_observer.py``): ``lease.queued`` (task, model, key, weight, instance),
``lease.granted`` and ``lease.left``, in the order the store carried them out.

* ``queue-order``: first come first served, per model (``fifo``) or per model and API key
  (``fair``): a request is never granted a lease while one queued before it (of its key,
  under ``fair``) still waits.
* ``fair-share`` (``fair`` only): no key starved past its bound. While a key has a request
  waiting for a model, each other key is granted at most its weight's worth of leases for that
  model before this key's next grant (deficit round robin gives every other key at most one
  turn, of its weight, between two turns of a key with requests waiting).

Entries of an instance that was frozen or crashed meanwhile are exempt (the store drops them
once their instance stops beating), and so is everything queued when the store went down
(releases fail while it is down: entries linger to their expiry). A task granted twice (an ask
made again after its answer was lost finds its lease) counts once; but a task queued again
after its grant is a new request of its key, and its next grant counts like any other: its
placement never reached the node, so it gave the lease back and asked again under a new
attempt, which joins the back of its key's own line (or, its key gone from the ring, the back
of the ring) as any new request does, and the store charges that grant to its key's turn.
Counting it once would charge the key's own second grant to nobody, and grants of other keys
made before it to a wait it had already ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.invariant_base import Invariant
from sim.trace import Event

__all__ = ["NoKeyStarved", "QueueOrderKept"]


@dataclass
class _Waiting:
    key: str
    instance: str


@dataclass
class _QueueWatch:
    """What both invariants know of the queues: who waits, in order, and who is exempt."""

    policy: str = "fifo"
    waiting: dict[str, dict[str, _Waiting]] = field(default_factory=dict)  # model -> task
    exempt: set[str] = field(default_factory=set)
    down: dict[str, float] = field(default_factory=dict)  # instance -> down until
    granted: set[str] = field(default_factory=set)

    def observe(self, event: Event) -> None:
        kind, t = event["kind"], event["t"]
        if kind == "run.start":
            self.policy = event.get("queue_policy", "fifo")
        elif kind == "fault" and event["fault"] in ("freeze", "crash_restart"):
            until = t + event["duration"] if event["fault"] == "freeze" else float("inf")
            self.down[event["target"]] = until
            for queue in self.waiting.values():
                self.exempt.update(q for q, w in queue.items() if w.instance == event["target"])
        elif kind == "fault" and event["fault"] == "store_outage":
            for queue in self.waiting.values():
                self.exempt.update(queue)
        elif kind == "lease.queued":
            self.granted.discard(event["task"])  # asked again after its grant: a new request
            queue = self.waiting.setdefault(event["model"], {})
            if event["task"] not in queue:
                queue[event["task"]] = _Waiting(event.get("key", ""), event["instance"])
                if self.down.get(event["instance"], 0.0) > t:
                    self.exempt.add(event["task"])

    def leave(self, task: str) -> None:
        for queue in self.waiting.values():
            queue.pop(task, None)

    def live_keys(self, model: str) -> set[str]:
        """Keys with a waiting, not exempt request for ``model``."""
        queue = self.waiting.get(model, {})
        return {w.key for task, w in queue.items() if task not in self.exempt}


class QueueOrderKept(Invariant):
    """First come first served per model (``fifo``), per model and API key (``fair``)."""

    name = "queue-order"

    def __init__(self) -> None:
        self.watch = _QueueWatch()

    def observe(self, event: Event) -> None:
        kind = event["kind"]
        self.watch.observe(event)
        if kind == "lease.left":
            self.watch.leave(event["task"])
        elif kind == "lease.granted":
            task, model = event["task"], event["model"]
            queue = self.watch.waiting.setdefault(model, {})
            key = event.get("key", "")
            per_key = self.watch.policy == "fair"
            for other, waiting in queue.items():
                if other == task:
                    break
                if other in self.watch.exempt or (per_key and waiting.key != key):
                    continue
                whose = f" of key {key}" if per_key else ""
                self.fail(
                    f"{task} got a lease for {model} while {other}{whose}, queued before it, "
                    "still waits",
                    event["t"],
                )
            queue.pop(task, None)


class NoKeyStarved(Invariant):
    """Under ``fair``: while a key waits for a model, every other key gets at most its weight
    of grants for it before this key's next grant."""

    name = "fair-share"

    def __init__(self) -> None:
        self.watch = _QueueWatch()
        self.weight: dict[str, int] = {}
        # model -> waiting key -> other key -> its grants since the waiting key's last grant
        # (or since it began to wait)
        self.since: dict[str, dict[str, dict[str, int]]] = {}

    def observe(self, event: Event) -> None:
        kind, t = event["kind"], event["t"]
        before = {m: self.watch.live_keys(m) for m in self.watch.waiting}
        self.watch.observe(event)
        if self.watch.policy != "fair":
            return
        if kind == "lease.queued":
            self.weight[event.get("key", "")] = event.get("weight", 1)
        elif kind == "lease.left":
            self.watch.leave(event["task"])
        elif kind == "lease.granted":
            task, model, key = event["task"], event["model"], event.get("key", "")
            self.watch.leave(task)
            if task in self.watch.granted:
                return
            self.watch.granted.add(task)
            counts = self.since.setdefault(model, {})
            for waiting in sorted(before.get(model, set()) - {key}):
                grants = counts.setdefault(waiting, {})
                grants[key] = grants.get(key, 0) + 1
                if grants[key] > self.weight.get(key, 1):
                    self.fail(
                        f"key {key} got {grants[key]} leases for {model} while key {waiting} "
                        f"waited (its weight is {self.weight.get(key, 1)}: one turn)",
                        t,
                    )
            counts[key] = {}
        # A key that stopped waiting starts afresh when it waits again.
        for model, counts in self.since.items():
            live = self.watch.live_keys(model)
            for waiting in [k for k in counts if k not in live]:
                del counts[waiting]
