"""The ``fair`` order of the admission queue (``coordination/leases.py``, *The queue's order*):
API keys in weighted round robin by deficit counters, each key first come first served. One
contract on the memory backend, a real Redis and a 3-master Redis Cluster (the ``backend``
fixture), with the helpers of the lease contract (``test_lease_contract.py``).

One node with one slot: a grant is one slot turnover. ``serve`` frees the slot and asks for
every waiting request in turn; the store grants exactly the head, so the order of the grants
is the queue's order."""

from __future__ import annotations

import dataclasses

from coordinator.coordination import Coordination
from coordinator.coordination.leases import AdmissionRules, LeaseRelease
from tests.coordinator.test_lease_contract import WINDOW, ask, beat, granted, node, rules
from tests.fixtures.coordination_backend import Backend

FAIR = rules(queue_policy="fair", queue_max=50)


def fair_ask(request_id: str, key: str, weight: int = 1, **kw: object):  # type: ignore[no-untyped-def]
    return dataclasses.replace(ask(request_id, key=key, **kw), weight=weight)  # type: ignore[arg-type]


async def serve(
    c: Coordination, held: tuple[str, str], waiting: dict[str, tuple[str, int]], r: AdmissionRules
) -> list[str]:
    """Free the slot ``held`` (request id, lease id) and grant the rest one by one: the order
    of the grants. ``waiting``: request id -> (key, weight), all queued."""
    order = []
    while waiting:
        rid, lease = held
        await c.leases.release(LeaseRelease(request_id=rid, model="m", lease=("n1", lease)), r)
        grants = []
        for request_id, (key, weight) in list(waiting.items()):
            answer = await c.leases.admit(fair_ask(request_id, key, weight), r)
            if answer.outcome == "granted":
                grants.append((request_id, answer.lease_id))
            else:  # not the head, or the head after the slot was taken again
                assert answer.outcome == "queued", answer
        assert len(grants) == 1, grants  # the head, and only the head
        held = grants[0]
        order.append(held[0])
        del waiting[held[0]]
    return order


async def test_keys_take_turns_by_weight_each_in_arrival_order(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, max_parallel=1)
    held = ("r0", granted(await c.leases.admit(fair_ask("r0", "first"), FAIR)))
    waiting: dict[str, tuple[str, int]] = {}
    # The flood arrives first, then a quiet key, then a key of weight 2.
    arrivals = [*(f"f{i}" for i in range(1, 7)), "q1", "q2", "v1", "v2", "v3"]
    for rid in arrivals:
        key, weight = {"f": ("flood", 1), "q": ("quiet", 1), "v": ("vip", 2)}[rid[0]]
        answer = await c.leases.admit(fair_ask(rid, key, weight), FAIR)
        assert answer.outcome == "queued"
        waiting[rid] = (key, weight)
    expected = ["f1", "q1", "v1", "v2", "f2", "q2", "v3", "f3", "f4", "f5", "f6"]
    # position: the grants before a request if nothing else arrives.
    for rid, (key, weight) in waiting.items():
        answer = await c.leases.admit(fair_ask(rid, key, weight), FAIR)
        assert answer.position == expected.index(rid), (rid, answer)
    assert await c.leases.queue_depths(["m"], FAIR) == {"m": 11}
    assert await serve(c, held, waiting, FAIR) == expected


async def test_fifo_serves_the_same_arrivals_in_arrival_order(backend: Backend) -> None:
    c = backend.coord
    fifo = rules(queue_policy="fifo", queue_max=50)
    await beat(c, "O", "A")
    await node(c, max_parallel=1)
    held = ("r0", granted(await c.leases.admit(fair_ask("r0", "first"), fifo)))
    arrivals = {"f1": ("flood", 1), "f2": ("flood", 1), "f3": ("flood", 1), "q1": ("quiet", 1)}
    for rid, (key, weight) in arrivals.items():
        assert (await c.leases.admit(fair_ask(rid, key, weight), fifo)).outcome == "queued"
    assert await serve(c, held, dict(arrivals), fifo) == ["f1", "f2", "f3", "q1"]


async def test_a_key_that_empties_leaves_the_ring_and_rejoins_at_the_back(
    backend: Backend,
) -> None:
    c = backend.coord
    await beat(c, "O", "A", "B")
    await node(c, max_parallel=1)
    held = ("r0", granted(await c.leases.admit(fair_ask("r0", "first"), FAIR)))
    for rid, key in [("a1", "ka"), ("a2", "ka"), ("b1", "kb"), ("c1", "kc")]:
        assert (await c.leases.admit(fair_ask(rid, key), FAIR)).outcome == "queued"
    # b1 gives up while queued: key kb leaves the ring, b2 later joins it at the back.
    await c.leases.release(LeaseRelease(request_id="b1", key_id="kb", model="m"), FAIR)
    assert (await c.leases.admit(fair_ask("b2", "kb"), FAIR)).position == 2
    waiting = {"a1": ("ka", 1), "a2": ("ka", 1), "c1": ("kc", 1), "b2": ("kb", 1)}
    assert await serve(c, held, waiting, FAIR) == ["a1", "c1", "b2", "a2"]


async def test_a_dead_head_costs_its_key_nothing_and_wakes_the_next_key(
    backend: Backend,
) -> None:
    c = backend.coord
    await beat(c, "O", "A", "B")
    await node(c, max_parallel=1)
    lease = granted(await c.leases.admit(fair_ask("r0", "first"), FAIR))
    # Key kb's first entry belongs to instance B, which goes silent; its second is A's.
    assert (await c.leases.admit(fair_ask("b1", "kb", instance="B"), FAIR)).position == 0
    assert (await c.leases.admit(fair_ask("a1", "ka"), FAIR)).position == 1
    assert (await c.leases.admit(fair_ask("b2", "kb", weight=2), FAIR)).position == 2
    await backend.advance(WINDOW + 0.1)
    await beat(c, "O", "A")
    heads = await c.leases.release(
        LeaseRelease(
            request_id="r0", key_id="first", model="m", lease=("n1", lease), wake_models=["m"]
        ),
        FAIR,
    )
    assert heads == [("m", "A")]
    # b1 was dropped at the head: kb is still at the ring's front with its turn unspent.
    answer = await c.leases.admit(fair_ask("a1", "ka"), FAIR)
    assert (answer.outcome, answer.position) == ("queued", 1)
    second = await c.leases.admit(fair_ask("b2", "kb", weight=2), FAIR)
    assert granted(second) and second.next_in_queue == "A"
    assert await c.leases.queue_depths(["m"], FAIR) == {"m": 1}


async def test_queue_max_counts_the_entries_of_every_key(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, max_parallel=1)
    two = dataclasses.replace(FAIR, queue_max=2)
    granted(await c.leases.admit(fair_ask("r0", "first"), two))
    assert (await c.leases.admit(fair_ask("a1", "ka"), two)).outcome == "queued"
    assert (await c.leases.admit(fair_ask("b1", "kb"), two)).outcome == "queued"
    assert (await c.leases.admit(fair_ask("c1", "kc"), two)).outcome == "queue_full"
