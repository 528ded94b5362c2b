"""Redis Sentinel failover (docs/redis.md "Redis Sentinel"): a master, a replica and three sentinels on
loopback, a real coordinator instance on GEMMANET_REDIS_URL=redis+sentinel://…, and a steady
trickle of HTTP requests while the master is killed (kill -9). Requests during the failover get
503 for a bounded window, then succeed again on the promoted replica without restarting
anything; the monitor's fencing token (epoch) read after the failover is never below one handed
out before it, and a new epoch is handed out only once a replica holds it (WAIT 1)."""

from __future__ import annotations

import os
import time

import pytest
import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.redis.coordination import RedisCoordination
from tests.fixtures.processes import Processes
from tests.fixtures.redis_sentinel import DOWN_AFTER_MS, RedisSentinelGroup

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

#: kill -> last failed request: sentinel down-after, vote and promotion (~2 s here), the
#: instance's Redis timeouts, and margin for a loaded 2-core machine
WINDOW_BOUND_S = DOWN_AFTER_MS / 1000 + 10.0


def _monitor(group: RedisSentinelGroup, prefix: str) -> RedisCoordination:
    return RedisCoordination(group.url, key_prefix=prefix, op_timeout_s=0.5)


async def _claim_before(group: RedisSentinelGroup, prefix: str) -> int:
    """Epochs 1 and 3 handed out; 2 refused while the replica was frozen (WAIT 1 unanswered),
    its lease given back at once."""
    async with _monitor(group, prefix) as c:
        first = await c.monitor.monitor_acquire("M1", ttl_s=5.0)
        assert first.held and first.epoch == 1
        assert await c.monitor.monitor_resign("M1", first.epoch)
        group.replica.pause()
        try:
            with pytest.raises(CoordinationUnavailable, match="no replica acknowledged"):
                await c.monitor.monitor_acquire("M1", ttl_s=5.0)
            assert (await c.monitor.monitor_status()).holder is None
        finally:
            group.replica.resume()
        claim = await c.monitor.monitor_acquire("M1", ttl_s=5.0)
        assert claim.held and claim.epoch == 3
        assert await c.monitor.monitor_resign("M1", claim.epoch)
        return claim.epoch


async def _claims_after(group: RedisSentinelGroup, prefix: str, before: int) -> None:
    async with _monitor(group, prefix) as c:
        assert (await c.monitor.monitor_status()).epoch >= before
        # No replica is left to hold a new epoch: no claim until the old master is back.
        with pytest.raises(CoordinationUnavailable, match="no replica acknowledged"):
            await c.monitor.monitor_acquire("M2", ttl_s=5.0)
        await trio.to_thread.run_sync(group.master.start)
        # What the sentinels would do on their own, a few seconds later.
        group.master.raw_command("REPLICAOF", "127.0.0.1", str(group.replica.port))
        with trio.fail_after(20):
            while True:
                try:
                    taken = await c.monitor.monitor_acquire("M2", ttl_s=5.0)
                    break
                except CoordinationUnavailable:
                    await trio.sleep(0.1)
        assert taken.held and taken.epoch > before


def test_failover_bounded_503s_then_success_and_fencing_never_goes_back(
    procs: Processes, redis_sentinel_group: RedisSentinelGroup
) -> None:
    group = redis_sentinel_group
    prefix = f"e2es{os.getpid()}"
    shared = procs.share_redis(group, prefix)
    a = shared.coordinator(GEMMANET_INSTANCE_ID="A")
    shared.node(a, "on-a")
    key = shared.create_key("client")
    assert a.request(key, model="echo", prompt="before").status_code == 200
    epoch_before = trio.run(_claim_before, group, prefix)

    outcomes: list[tuple[float, int]] = []
    killed_at = 0.0
    started = time.monotonic()
    deadline = started + 1.0 + WINDOW_BOUND_S + 10
    while time.monotonic() < deadline:
        now = time.monotonic()
        if not killed_at and now - started > 0.5:
            group.master.stop()
            killed_at = time.monotonic()
        status = a.request(key, model="echo", prompt="trickle").status_code
        outcomes.append((now, status))
        after_kill = [s for t, s in outcomes if killed_at and t > killed_at]
        # Done once the failover showed (a failure) and 20 requests in a row succeeded after it.
        if any(s != 200 for s in after_kill) and after_kill[-20:] == [200] * 20:
            break
        time.sleep(0.05)

    failed = [(t, s) for t, s in outcomes if s != 200]
    assert killed_at and failed, outcomes
    assert {s for _, s in failed} == {503}, failed
    assert min(t for t, _ in failed) >= killed_at - 1.0
    window = max(t for t, _ in failed) - killed_at
    assert window < WINDOW_BOUND_S, (window, len(failed))
    assert [s for _, s in outcomes[-20:]] == [200] * 20, outcomes[-30:]
    assert group.master_port() == group.replica.port
    print(f"sentinel failover over HTTP: {len(failed)} x 503 within {window:.2f} s of the kill")

    trio.run(_claims_after, group, prefix, epoch_before)
