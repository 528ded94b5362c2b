"""The ``fair-share`` invariant against the memory backend's own fair queue: a request that
was granted, gave its lease back (its placement never reached the node) and asked again is a
new request of its key, and the order the queue then keeps is within the documented bound."""

from __future__ import annotations

import pytest

from coordinator.coordination.memory.queues import FairQueue, QueueEntry
from sim.invariant_base import Violation
from sim.queue_invariants import NoKeyStarved
from sim.trace import Event

KEY = {"a": "key-a", "b": "key-b"}


class _Run:
    """A model's fair queue, every weight 1, and the invariant watching what it does."""

    def __init__(self) -> None:
        self.queue, self.invariant, self.t = FairQueue(), NoKeyStarved(), 0.0
        self.see({"kind": "run.start", "queue_policy": "fair"})

    def see(self, event: Event) -> None:
        self.t += 0.1
        self.invariant.observe({"t": self.t, **event})

    def ask(self, task: str) -> None:
        key = KEY[task[0]]
        if task not in self.queue:
            self.queue.join(task, QueueEntry("I0", 99.0, key), 1)
        self.see({"kind": "lease.queued", "task": task, "model": "m", "key": key,
                  "instance": "I0", "weight": 1})  # fmt: skip

    def grant_head(self) -> str:
        head = self.queue.head()
        assert head is not None
        self.queue.granted(head[0])
        self.see({"kind": "lease.granted", "task": head[0], "model": "m", "key": KEY[head[0][0]]})
        return head[0]


def test_a_request_asking_again_after_its_grant_is_a_new_request_of_its_key() -> None:
    run = _Run()
    for task in ("a1", "a2", "b1", "b2"):
        run.ask(task)
    assert run.grant_head() == "a1"
    run.ask("a1")  # its placement failed: the lease given back, a new attempt joins A's line
    assert [run.grant_head(), run.grant_head()] == ["b1", "a2"]
    run.ask("a3")
    assert run.grant_head() == "b2"
    run.ask("b3")
    # a1's second grant is A's turn (the store charged it): B's next grant is its own turn
    # while A waits with a3, not a second grant of one turn.
    assert [run.grant_head(), run.grant_head(), run.grant_head()] == ["a1", "b3", "a3"]


def test_a_grant_made_again_without_asking_again_still_counts_once() -> None:
    """An ask made again after its answer was lost finds its lease: granted twice, counted
    once. So a key granted twice in one turn that way is within its turn."""
    run = _Run()
    for task in ("a1", "a2", "b1", "b2"):
        run.ask(task)
    assert run.grant_head() == "a1"
    assert run.grant_head() == "b1"
    run.see({"kind": "lease.granted", "task": "b1", "model": "m", "key": "key-b"})
    assert run.grant_head() == "a2"


def test_a_key_granted_past_its_turn_while_another_waits_is_caught() -> None:
    run = _Run()
    for task in ("a1", "a2", "b1", "b2"):
        run.ask(task)
    assert run.grant_head() == "a1"
    assert run.grant_head() == "b1"
    with pytest.raises(Violation, match="key key-b got 2 leases for m while key key-a waited"):
        run.see({"kind": "lease.granted", "task": "b2", "model": "m", "key": "key-b"})
