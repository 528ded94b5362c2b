"""The rate limit in the admission step (``LeaseAsk.rate``, ``coordination/leases.py``): an
ask with a rate counts its request in the key's sliding-window log first, exactly as
``RateLimits.rate_limit`` does, and over the limit answers ``rate_limited`` and changes
nothing else. On memory (fake clock), a real redis-server and a 3-master Cluster (the
``backend`` fixture)."""

from __future__ import annotations

import dataclasses

from coordinator.coordination.keys import rate_limit_key
from coordinator.coordination.leases import RateAsk
from tests.coordinator.test_lease_contract import ask, beat, granted, node, rules
from tests.fixtures.coordination_backend import Backend

PERIOD_S = 30.0


def rated(request_id: str, token: str, *, key: str = "key", limit: int = 2) -> object:
    return dataclasses.replace(
        ask(request_id, key=key), rate=RateAsk(rate_limit_key(key), limit, PERIOD_S, token)
    )


async def test_over_the_limit_an_ask_is_rate_limited_and_changes_nothing(
    backend: Backend,
) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, max_parallel=1)
    strict = rules(max_active_per_key=5)
    granted(await c.leases.admit(rated("r1", "t1"), strict))  # type: ignore[arg-type]
    queued = await c.leases.admit(rated("r2", "t2"), strict)  # type: ignore[arg-type]
    assert queued.outcome == "queued", queued
    limited = await c.leases.admit(rated("r3", "t3"), strict)  # type: ignore[arg-type]
    assert limited.outcome == "rate_limited", limited
    assert 0 < limited.retry_after_s <= PERIOD_S, limited
    # Nothing of r3 anywhere: not queued, no lease; the log holds the two it allowed.
    assert await c.leases.queue_depths(["m"], strict) == {"m": 1}
    assert (await c.leases.lease_usage(["n1"]))["n1"].leases == 1
    log = await c.rate_limits.rate_limit(rate_limit_key("key"), limit=2, period_s=PERIOD_S)
    assert not log.allowed, log
    # Another key has its own budget.
    other = await c.leases.admit(rated("r4", "t4", key="other"), strict)  # type: ignore[arg-type]
    assert other.outcome == "queued", other


async def test_an_ask_made_again_with_its_token_is_not_counted_twice(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, max_parallel=1)
    granted(await c.leases.admit(rated("r1", "t1", limit=2), rules()))  # type: ignore[arg-type]
    for _ in range(3):  # r2 polls the queue with its token: one count
        again = await c.leases.admit(rated("r2", "t2", limit=2), rules())  # type: ignore[arg-type]
        assert again.outcome == "queued", again
    # The standalone check with r2's token agrees it is in the window (counted once).
    same = await c.rate_limits.rate_limit(
        rate_limit_key("key"), limit=2, period_s=PERIOD_S, token="t2"
    )
    assert same.allowed and same.remaining == 0, same
    third = await c.leases.admit(rated("r3", "t3", limit=2), rules())  # type: ignore[arg-type]
    assert third.outcome == "rate_limited", third


async def test_without_a_rate_the_ask_counts_nothing(backend: Backend) -> None:
    c = backend.coord
    await beat(c, "O", "A")
    await node(c, max_parallel=4)
    for n in range(3):
        granted(await c.leases.admit(ask(f"r{n}"), rules()))
    log = await c.rate_limits.rate_limit(rate_limit_key("key"), limit=1, period_s=PERIOD_S)
    assert log.allowed and log.remaining == 0, log
