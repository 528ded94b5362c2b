"""A task request's rate limit is counted by its admission ask (one store step for both,
``RateCharge``), and a request refused before it asks is still counted, and answered 429 first
when over the limit, as when the limit was counted on arrival. One Instance on the memory
store (the store's side of the step runs on Redis and Cluster in test_admit_rate_limit.py),
peer B's node with two slots, one of them taken; a mock clock."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
import trio
import trio.lowlevel

from coordinator.coordination.base import RateDecision
from coordinator.coordination.keys import rate_limit_key
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.coordination.memory.roles import MemoryRateLimits
from coordinator.errors import (
    CoordinationDown,
    CoordinationUnavailable,
    NoNodeForModel,
    RateLimited,
)
from coordinator.runtime.instance import Instance
from coordinator.runtime.requests.rate_limit import RateCharge
from coordinator.settings import Settings
from sim.stand_ins import SimStore
from tests.coordinator.test_drain_queued import PeerListens, beat_as_b, full_peer_node

LIMIT, PERIOD_S = 2, 60.0


class CountedRateLimits(MemoryRateLimits):
    """The memory backend's own rate limits, counting the calls made on their own (a
    separate round trip on Redis)."""

    calls = 0

    async def rate_limit(
        self, key: str, *, limit: int, period_s: float, token: str | None = None
    ) -> RateDecision:
        self.calls += 1
        return await super().rate_limit(key, limit=limit, period_s=period_s, token=token)


@pytest.fixture
async def stand(autojump_clock: object) -> AsyncIterator[tuple[Instance, MemoryCoordination]]:
    async with trio.open_nursery() as nursery:
        coordination = MemoryCoordination(trio.current_time)
        coordination.rate_limits = CountedRateLimits(coordination.link)
        settings = Settings(
            instance_id="A", multi_instance=True, redis_url="memory://",
            rate_limit=(LIMIT, PERIOD_S), queue_timeout_s=5.0,
        )  # fmt: skip
        bus = PeerListens(coordination.pubsub)
        instance = Instance(settings, SimStore(), coordination, bus, rng=random.Random(1))  # type: ignore[arg-type]
        nursery.start_soon(beat_as_b, coordination, 2)
        await trio.lowlevel.checkpoint()
        await full_peer_node(coordination, instance.admissions.rules, 2)
        await nursery.start(instance.run)
        await trio.sleep(1.0)  # a beat: B's snapshot is known
        yield instance, coordination
        rate_limits = coordination.rate_limits
        assert isinstance(rate_limits, CountedRateLimits)
        nursery.cancel_scope.cancel()


async def counted(coordination: MemoryCoordination, charge: RateCharge) -> int:
    """How many of the key's window the request's own token leaves (asked with it: free)."""
    decision = await coordination.rate_limits.rate_limit(
        rate_limit_key(charge.key_id), limit=LIMIT, period_s=PERIOD_S, token=charge.token
    )
    assert decision.allowed, decision  # its token is in the window: counted, once
    return decision.remaining


async def test_the_admission_ask_counts_the_request(stand) -> None:  # type: ignore[no-untyped-def]
    instance, coordination = stand
    with trio.fail_after(30):
        charge = RateCharge("k")
        handle = await instance.requests.start(
            key_id="k", model="m", prompt="p", stream=False, timeout_s=10, rate=charge
        )
        assert charge.counted and handle.node_id == "n1"
        assert coordination.rate_limits.calls == 0  # counted by the admission ask alone
        assert await counted(coordination, charge) == LIMIT - 1
        await instance.requests.end(handle, "client_gone")

        # The second takes the rest of the budget, the third is refused in the same step,
        # at once, before it takes anything (a slot is free: it would have been granted).
        second = RateCharge("k")
        handle = await instance.requests.start(
            key_id="k", model="m", prompt="p", stream=False, timeout_s=10, rate=second
        )
        assert second.counted and await counted(coordination, second) == 0
        await instance.requests.end(handle, "client_gone")
        await trio.sleep(0.5)  # its release is in the background
        third = RateCharge("k")
        began = trio.current_time()
        with pytest.raises(RateLimited) as refused:
            await instance.requests.start(
                key_id="k", model="m", prompt="p", stream=False, timeout_s=10, rate=third
            )
        assert trio.current_time() - began < 1.0  # at once, not after a wait in the queue
        assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
        assert coordination.rate_limits.calls == 2  # the test's own two reads only
        assert instance.admissions.queued() == {}
        assert instance.admissions.rate_charges == {}
        usage = await coordination.leases.lease_usage(["n1"])
        assert usage["n1"].leases == 1  # B's own: the refused request took no lease


async def test_a_request_refused_before_its_ask_is_counted_and_429_first(stand) -> None:  # type: ignore[no-untyped-def]
    instance, coordination = stand
    with trio.fail_after(30):
        charges = [RateCharge("k2") for _ in range(LIMIT + 1)]
        for charge in charges[:LIMIT]:
            with pytest.raises(NoNodeForModel):  # refused before any ask: counted all the same
                await instance.requests.start(
                    key_id="k2", model="nowhere", prompt="p", stream=False, timeout_s=10,
                    rate=charge,
                )  # fmt: skip
            assert charge.counted
        with pytest.raises(RateLimited):  # over the limit: 429 rather than the 503
            await instance.requests.start(
                key_id="k2", model="nowhere", prompt="p", stream=False, timeout_s=10,
                rate=charges[LIMIT],
            )  # fmt: skip
        assert await counted(coordination, charges[0]) == 0


async def test_a_request_the_store_failed_is_not_counted_again(stand) -> None:  # type: ignore[no-untyped-def]
    """The admission gave up on a silent store past its outage bound: the refusal stands as
    it is, with no second rate-limit call (which would wait out the same bound again: a
    request that came during a long Redis pause was answered after twice the bound)."""
    instance, coordination = stand
    with trio.fail_after(30):
        for error in (CoordinationDown("gone"), CoordinationUnavailable("refused")):
            answer = await instance.requests.charge_first(RateCharge("k3"), error)
            assert answer is error
        assert coordination.rate_limits.calls == 0
