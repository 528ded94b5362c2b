"""Capacity leases and the admission queue (``coordinator/coordination/leases.py``): one
contract, run against the memory backend on a fake clock and against RedisCoordination on a
real redis-server (the ``backend`` fixture of tests/fixtures/coordination_backend.py).

Instances are alive while they beat in the presence registry ``REGISTRY``. The Redis runs sleep
for real, so ``WINDOW`` must outlast every test's steps before its ``advance`` on a loaded
machine: at 0.3 s a three-shard cluster run under CPU load sometimes took longer than that
between the first beat and the last admit, the instances looked silent, and the queue dropped
heads the test expected to keep. At 1 s each step has a second of real time.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from coordinator.coordination import Coordination
from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    NodeFacts,
)
from coordinator.coordination.redis.coordination import RedisCoordination
from tests.fixtures.coordination_backend import SLACK, Backend
from tests.fixtures.redis_server import RedisServer

REGISTRY = "instances"
WINDOW = 1.0
_lease_ids = itertools.count()


def rules(**changes: object) -> AdmissionRules:
    settings: dict[str, object] = {
        "presence_registry": REGISTRY,
        "facts_stale_s": WINDOW,
        "requester_stale_s": WINDOW,
        "lease_ttl_s": 10.0,
        "queue_max": 10,
        "max_active_per_key": 0,
    }
    settings.update(changes)
    return AdmissionRules(**settings)  # type: ignore[arg-type]


def ask(
    request_id: str,
    *candidates: tuple[str, str],
    instance: str = "A",
    key: str = "key",
    model: str = "m",
    model_gb: float = 0.0,
    kv_gb: float = 0.0,
    queue_ttl: float = 10.0,
) -> LeaseAsk:
    return LeaseAsk(
        request_id=request_id,
        instance_id=instance,
        key_id=key,
        model=model,
        model_gb=model_gb,
        kv_gb=kv_gb,
        candidates=candidates or (("n1", "c1"),),
        lease_id=f"{request_id}.{next(_lease_ids)}",
        queue_entry_ttl_s=queue_ttl,
    )


async def beat(c: Coordination, *members: str) -> None:
    for member in members:
        await c.presence.presence_beat(
            REGISTRY, member, b"", stall_after_s=60.0, forget_after_s=60.0
        )


async def node(
    c: Coordination,
    node_id: str = "n1",
    conn_id: str = "c1",
    *,
    owner: str = "O",
    max_parallel: int = 2,
    memory_gb: float | None = None,
    resident: dict[str, float] | None = None,
) -> None:
    facts = NodeFacts(node_id, conn_id, owner, max_parallel, memory_gb, resident or {})
    await c.leases.put_node_facts(facts)


def granted(admission: Admission, node_id: str = "n1") -> str:
    assert admission.outcome == "granted", admission
    assert admission.node_id == node_id
    return admission.lease_id


async def test_grant_until_the_parallel_budget_is_used(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, max_parallel=2)
    first = await c.leases.admit(ask("r1"), rules())
    assert first.conn_id == "c1" and first.lease_id.startswith("r1.") and first.position == 0
    granted(first)
    granted(await c.leases.admit(ask("r2"), rules()))
    third = await c.leases.admit(ask("r3"), rules())
    assert (third.outcome, third.position, third.refusals) == ("queued", 0, {"n1": "full"})
    # The next candidate in the caller's order takes it.
    await node(c, "n2", "c2", max_parallel=1)
    fourth = await c.leases.admit(ask("r3", ("n1", "c1"), ("n2", "c2")), rules())
    granted(fourth, "n2")
    assert fourth.refusals == {"n1": "full"}
    usage = await c.leases.lease_usage(["n1", "n2", "unknown"])
    assert [(u.leases, u.memory_gb) for u in usage.values()] == [(2, 0.0), (1, 0.0), (0, 0.0)]
    assert await c.leases.queue_depths(["m"], rules()) == {"m": 0}


async def test_memory_budget_counts_each_model_once_and_kv_per_lease(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, max_parallel=10, memory_gb=10.0, resident={"a": 4.0})
    # a is resident: only its KV is added (4 + 1).
    granted(await c.leases.admit(ask("r1", model="a", model_gb=4.0, kv_gb=1.0), rules()))
    # b is not resident: its size is added (4 + 1 + 3 + 1).
    granted(await c.leases.admit(ask("r2", model="b", model_gb=3.0, kv_gb=1.0), rules()))
    assert (await c.leases.lease_usage(["n1"]))["n1"].memory_gb == pytest.approx(9.0)
    # b again: counted once, so only 1 more (exactly 10: fits).
    granted(await c.leases.admit(ask("r3", model="b", model_gb=3.0, kv_gb=1.0), rules()))
    refused = await c.leases.admit(ask("r4", model="a", model_gb=4.0, kv_gb=0.5), rules())
    assert (refused.outcome, refused.refusals) == ("queued", {"n1": "memory"})
    usage = (await c.leases.lease_usage(["n1"]))["n1"]
    assert (usage.leases, usage.memory_gb) == (3, pytest.approx(10.0))


async def test_exact_fit_of_decimal_sizes_is_not_refused_by_rounding(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    # 0.1 + 0.2 is 0.30000000000000004 in floats: the epsilon lets it fit 0.3.
    await node(c, memory_gb=0.3, resident={"x": 0.1})
    granted(await c.leases.admit(ask("r1", model="y", model_gb=0.2), rules()))
    usage = (await c.leases.lease_usage(["n1"]))["n1"]
    assert usage.memory_gb == pytest.approx(0.3)
    over = await c.leases.admit(ask("r2", model="z", model_gb=0.001), rules())
    assert over.refusals == {"n1": "memory"}


async def test_gone_when_the_facts_name_another_connection_or_none(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c)
    wrong = await c.leases.admit(ask("r1", ("n1", "old-conn"), ("nx", "c9")), rules())
    assert (wrong.outcome, wrong.refusals) == ("refused", {"n1": "gone", "nx": "gone"})
    # Dropping with another connection's id keeps the facts.
    await c.leases.drop_node_facts("n1", "old-conn")
    granted(await c.leases.admit(ask("r2"), rules()))
    await c.leases.drop_node_facts("n1", "c1")
    gone = await c.leases.admit(ask("r3"), rules())
    assert (gone.outcome, gone.refusals) == ("refused", {"n1": "gone"})
    # The lease outlives the facts; without facts no resident model is counted.
    assert (await c.leases.lease_usage(["n1"]))["n1"].leases == 1


async def test_facts_written_together_are_each_node_s_own(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await c.leases.put_many_node_facts(
        [
            NodeFacts("n1", "c1", "O", 1, 10.0, {"a": 4.0}),
            NodeFacts("n2", "c2", "O", 2, None, {}),
        ]
    )
    await c.leases.put_many_node_facts([])
    wrong = await c.leases.admit(ask("r0", ("n1", "c2"), ("n2", "c1")), rules())
    assert wrong.refusals == {"n1": "gone", "n2": "gone"}  # each record names its own conn
    granted(await c.leases.admit(ask("r1", model="a", model_gb=4.0, kv_gb=1.0), rules()))
    full = await c.leases.admit(
        ask("r2", ("n1", "c1"), ("n2", "c2"), model="a", model_gb=4.0), rules()
    )
    granted(full, "n2")
    assert full.refusals == {"n1": "full"}  # n1's max_parallel 1, from the batch
    assert (await c.leases.lease_usage(["n1"]))["n1"].memory_gb == pytest.approx(5.0)  # resident a


async def test_the_facts_read_back_as_written_until_dropped(backend: Backend) -> None:
    c = backend.coord
    written = [
        NodeFacts("n1", "c1", "O", 1, 10.5, {"a": 4.0, "b": 0.5}),
        NodeFacts("n2", "c2", "P", 3, None, {}),
    ]
    await c.leases.put_many_node_facts(written)
    assert await c.leases.node_facts(["n1", "n2", "unknown"]) == {
        "n1": written[0],
        "n2": written[1],
    }
    assert await c.leases.node_facts([]) == {}
    await c.leases.drop_node_facts("n1", "c1")
    assert await c.leases.node_facts(["n1", "n2"]) == {"n2": written[1]}


async def test_stale_when_the_owner_stops_beating(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c)
    await backend.advance(WINDOW + 0.1)
    await beat(c, "A")
    stale = await c.leases.admit(ask("r1"), rules())
    assert (stale.outcome, stale.refusals) == ("refused", {"n1": "stale"})
    await beat(c, "O")
    granted(await c.leases.admit(ask("r1"), rules()))


async def test_leases_expire_unless_renewed(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, max_parallel=1)
    short = rules(lease_ttl_s=0.3)
    lease = granted(await c.leases.admit(ask("r1"), short))
    await backend.advance(0.2)
    assert await c.leases.renew_leases([("n1", lease), ("n1", "no-such"), ("nx", lease)], 0.3) == [
        True,
        False,
        False,
    ]
    await backend.advance(0.2)
    assert (await c.leases.lease_usage(["n1"]))["n1"].leases == 1
    await backend.advance(0.1 + SLACK)
    assert (await c.leases.lease_usage(["n1"]))["n1"].leases == 0
    assert await c.leases.renew_leases([("n1", lease)], 0.3) == [False]
    assert await c.leases.renew_leases([], 0.3) == []
    await beat(c, "O", "A")
    granted(await c.leases.admit(ask("r2"), short))


async def test_release_frees_the_slot_and_names_the_queue_heads(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A", "B")
    await node(c, max_parallel=1)
    lease = granted(await c.leases.admit(ask("r1"), rules()))
    assert (await c.leases.admit(ask("r2", instance="B"), rules())).outcome == "queued"
    heads = await c.leases.release(
        LeaseRelease(
            request_id="r1",
            key_id="key",
            model="m",
            lease=("n1", lease),
            wake_models=["m", "other", "m"],
        ),
        rules(),
    )
    assert heads == [("m", "B")]
    assert (await c.leases.lease_usage(["n1"]))["n1"].leases == 0
    granted(await c.leases.admit(ask("r2", instance="B"), rules()))
    # Releasing a queued request takes it out of the queue.
    assert (await c.leases.admit(ask("r3"), rules())).outcome == "queued"
    await c.leases.release(
        LeaseRelease(request_id="r3", key_id="key", model="m", lease=None, wake_models=[]), rules()
    )
    assert await c.leases.queue_depths(["m"], rules()) == {"m": 0}


async def test_a_lease_nobody_heard_of_is_ended_by_the_request_that_may_hold_it(
    backend: Backend,
) -> None:
    """An ask that timed out may have been granted: the request that gives up names the
    leases it may hold (its lease id on each candidate), and each that exists ends at once
    instead of at its TTL; one that does not exist is no error, and the wake still comes."""
    c = backend.coord
    await beat(c, "O", "A", "B")
    await node(c, "n1", "c1", max_parallel=1)
    await node(c, "n2", "c2", max_parallel=1)
    lost = granted(await c.leases.admit(ask("r1", ("n1", "c1")), rules()))  # its answer lost
    assert (await c.leases.admit(ask("r2", ("n1", "c1"), instance="B"), rules())).outcome == (
        "queued"
    )
    heads = await c.leases.release(
        LeaseRelease(
            request_id="r1",
            key_id="key",
            model="m",
            maybe_leases=[("n1", lost), ("n2", lost), ("n1", "r1.never-granted")],
            wake_models=["m"],
        ),
        rules(),
    )
    assert heads == [("m", "B")]
    usage = await c.leases.lease_usage(["n1", "n2"])
    assert usage["n1"].leases == 0 and usage["n2"].leases == 0
    granted(await c.leases.admit(ask("r2", ("n1", "c1"), instance="B"), rules()))


async def test_queue_is_first_come_first_served(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A", "B", "C")
    await node(c, max_parallel=1)
    lease = granted(await c.leases.admit(ask("r1"), rules()))
    assert (await c.leases.admit(ask("r2", instance="B"), rules())).position == 0
    assert (await c.leases.admit(ask("r3", instance="C"), rules())).position == 1
    await c.leases.release(
        LeaseRelease(request_id="r1", key_id="key", model="m", lease=("n1", lease), wake_models=[]),
        rules(),
    )
    # A slot is free, but r3 has r2 ahead of it: it keeps waiting (nothing is tried).
    waiting = await c.leases.admit(ask("r3", instance="C"), rules())
    assert (waiting.outcome, waiting.position, waiting.refusals) == ("queued", 1, {})
    newcomer = await c.leases.admit(ask("r4", instance="A"), rules())
    assert (newcomer.outcome, newcomer.position) == ("queued", 2)
    head = await c.leases.admit(ask("r2", instance="B"), rules())
    granted(head)
    assert head.next_in_queue == "C"
    assert await c.leases.queue_depths(["m", "idle"], rules()) == {"m": 2, "idle": 0}
    # Another model's queue is its own.
    await node(c, "n2", "c2", max_parallel=1)
    granted(await c.leases.admit(ask("x1", ("n2", "c2"), model="other"), rules()), "n2")


async def test_queue_full_at_queue_max(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, max_parallel=1)
    two = rules(queue_max=2, max_active_per_key=4)
    granted(await c.leases.admit(ask("r1"), two))
    assert (await c.leases.admit(ask("r2"), two)).outcome == "queued"
    assert (await c.leases.admit(ask("r3"), two)).outcome == "queued"
    full = await c.leases.admit(ask("r4"), two)
    assert (full.outcome, full.refusals) == ("queue_full", {})
    # A queued request asking again keeps its place.
    assert (await c.leases.admit(ask("r3"), two)).position == 1
    # queue_full took r4 back out of the key's active set (r1-r3 remain, 3 of 4), so r5 is
    # not key_limit either.
    assert (await c.leases.admit(ask("r5"), two)).outcome == "queue_full"


async def test_key_limit_and_dead_instances_stop_counting(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A", "B")
    await node(c, max_parallel=10)
    limited = rules(max_active_per_key=2)
    granted(await c.leases.admit(ask("r1", instance="B"), limited))
    granted(await c.leases.admit(ask("r2", instance="A"), limited))
    assert (await c.leases.admit(ask("r3"), limited)).outcome == "key_limit"
    granted(await c.leases.admit(ask("other", key="key2"), limited))
    # Asking again for an active request is not limited.
    assert (await c.leases.admit(ask("r2", instance="A"), limited)).outcome == "granted"
    await backend.advance(WINDOW + 0.1)
    await beat(c, "O", "A")
    # B is silent: r1 no longer counts.
    granted(await c.leases.admit(ask("r3"), limited))
    assert (await c.leases.admit(ask("r4"), limited)).outcome == "key_limit"
    await c.leases.release(
        LeaseRelease(request_id="r3", key_id="key", model="m", lease=None, wake_models=[]), limited
    )
    granted(await c.leases.admit(ask("r4"), limited))


async def test_dead_or_expired_queue_heads_are_dropped(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A", "B")
    await node(c, max_parallel=1)
    granted(await c.leases.admit(ask("r1"), rules()))
    assert (await c.leases.admit(ask("r2", instance="B"), rules())).outcome == "queued"
    assert (await c.leases.admit(ask("r3", queue_ttl=0.2), rules())).position == 1
    assert (await c.leases.admit(ask("r4"), rules())).position == 2
    await backend.advance(WINDOW + 0.1)
    await beat(c, "O", "A")
    # B is silent (r2 dropped), then r3's entry has expired (dropped too).
    assert await c.leases.queue_depths(["m"], rules()) == {"m": 1}
    assert (await c.leases.admit(ask("r4"), rules())).position == 0
    # An expired entry asking again joins at the back.
    assert (await c.leases.admit(ask("r3"), rules())).position == 1


async def test_next_in_queue_skips_a_dead_head(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A", "B")
    await node(c, max_parallel=1)
    lease = granted(await c.leases.admit(ask("r1"), rules()))
    assert (await c.leases.admit(ask("r2"), rules())).position == 0
    assert (await c.leases.admit(ask("r3", instance="B"), rules())).position == 1
    assert (await c.leases.admit(ask("r4"), rules())).position == 2
    await c.leases.release(
        LeaseRelease(request_id="r1", key_id="key", model="m", lease=("n1", lease), wake_models=[]),
        rules(),
    )
    await backend.advance(WINDOW + 0.1)
    await beat(c, "O", "A")
    head = await c.leases.admit(ask("r2"), rules())
    granted(head)
    assert head.next_in_queue == "A"  # r4's instance: r3's (B) is silent


async def test_refused_only_when_no_candidate_is_usable(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A", "S")
    await node(c, "n1", "c1", owner="S")
    await node(c, "n2", "c2", max_parallel=1)
    await backend.advance(WINDOW + 0.1)
    await beat(c, "O", "A")
    limited = rules(max_active_per_key=1)
    granted(await c.leases.admit(ask("r0", ("n2", "c2"), key="other"), limited), "n2")
    mixed = await c.leases.admit(ask("r1", ("n1", "c1"), ("n2", "c2"), ("n3", "c3")), limited)
    assert (mixed.outcome, mixed.refusals) == (
        "queued",
        {"n1": "stale", "n2": "full", "n3": "gone"},
    )
    await c.leases.release(
        LeaseRelease(request_id="r1", key_id="key", model="m", lease=None, wake_models=[]), limited
    )
    refused = await c.leases.admit(ask("r2", ("n1", "c1"), ("n3", "c3")), limited)
    assert (refused.outcome, refused.refusals) == ("refused", {"n1": "stale", "n3": "gone"})
    # The refused request left the key's active set and the queue.
    assert (await c.leases.admit(ask("r3", ("n2", "c2")), limited)).outcome == "queued"
    assert await c.leases.queue_depths(["m"], limited) == {"m": 1}
    # No candidates at all: nothing is refused, the request waits.
    alone = dataclasses.replace(ask("r4", key="k4"), candidates=())
    assert (await c.leases.admit(alone, limited)).outcome == "queued"


@pytest.mark.redis
async def test_redis_lease_and_queue_keys_expire(
    redis_server_session: RedisServer, redis_key_prefix: str
) -> None:
    """Lease and queue keys die a while after their last entry (memory stays flat); the
    facts hash lives as long as its nodes' connections."""
    server = redis_server_session
    async with RedisCoordination(server.url, key_prefix=redis_key_prefix) as c:
        await beat(c, "O", "A")
        await node(c, max_parallel=1)
        granted(await c.leases.admit(ask("r1"), rules(lease_ttl_s=5.0)))
        assert (await c.leases.admit(ask("r2", queue_ttl=3.0), rules())).outcome == "queued"
    margin_ms = 10_000

    def pttl(key: str) -> int:
        return int(server.raw_command("PTTL", f"{redis_key_prefix}:{key}")[1:])

    for key, ttl_ms in [("lease:n:n1", 5000), ("lease:i:n1", 5000), ("lease:q:m", 3000)]:
        assert ttl_ms < pttl(key) <= ttl_ms + margin_ms, key
    assert pttl("lease:qi:m") > 3000
    assert pttl("lease:facts") == -1


# -- asking again after an answer was lost ----------------------------------------------------


async def test_an_ask_made_again_finds_the_lease_its_unanswered_copy_was_granted(
    backend: Backend,
) -> None:
    """A copy of the ask was carried out but its answer never came back (it timed out): the
    same ask made ``again`` is granted that very lease once more, not a second one (and not
    queued behind its own lease)."""
    c = backend.coord
    await beat(c, "O", "A", "B")
    await node(c, max_parallel=1)
    first = ask("r1")
    lease = granted(await c.leases.admit(first, rules()))  # its answer is "lost"
    assert (await c.leases.admit(ask("r2", instance="B"), rules())).outcome == "queued"
    again = dataclasses.replace(first, again=True)
    for _ in range(2):  # as often as it takes
        second = await c.leases.admit(again, rules())
        assert (second.outcome, second.node_id, second.lease_id) == ("granted", "n1", lease)
        assert second.next_in_queue == "B"
    assert (await c.leases.lease_usage(["n1"]))["n1"].leases == 1
    # Not marked again, the same ask cannot tell its own lease from another's.
    assert (await c.leases.admit(first, rules())).outcome == "queued"
    await c.leases.release(
        LeaseRelease(request_id="r1", key_id="key", model="m", lease=("n1", lease)), rules()
    )
    assert (await c.leases.lease_usage(["n1"]))["n1"].leases == 0


async def test_an_ask_made_again_drops_its_lease_where_the_candidate_changed(
    backend: Backend,
) -> None:
    """The node of the lease reconnected meanwhile (its facts name another connection): that
    lease serves nobody, it is dropped and the ask goes on as any other."""
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, "n1", "c1", max_parallel=1)
    await node(c, "n2", "c2", max_parallel=1)
    first = ask("r1", ("n1", "c1"), ("n2", "c2"))
    lease = granted(await c.leases.admit(first, rules()), "n1")
    await node(c, "n1", "c9", max_parallel=1)
    again = await c.leases.admit(dataclasses.replace(first, again=True), rules())
    assert (again.outcome, again.node_id, again.lease_id) == ("granted", "n2", lease)
    assert again.refusals == {"n1": "gone"}
    usage = await c.leases.lease_usage(["n1", "n2"])
    assert (usage["n1"].leases, usage["n2"].leases) == (0, 1)


async def test_an_ask_made_again_while_queued_keeps_its_place(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A", "B")
    await node(c, max_parallel=1)
    granted(await c.leases.admit(ask("r0"), rules()))
    first = ask("r1")
    assert (await c.leases.admit(first, rules())).position == 0
    assert (await c.leases.admit(ask("r2", instance="B"), rules())).position == 1
    again = await c.leases.admit(dataclasses.replace(first, again=True), rules())
    assert (again.outcome, again.position) == ("queued", 0)
    assert await c.leases.queue_depths(["m"], rules()) == {"m": 2}
