"""Redis Sentinel (README "Redis Sentinel"): a master, a replica and three sentinels on
loopback. Under a steady trickle of operations the master is killed (SIGKILL): operations fail
with ``CoordinationUnavailable`` (a 503 at the HTTP API) for a bounded window, then succeed
again on the promoted replica without reopening anything, and the monitor's fencing token (the
epoch) read after the failover is never below one handed out before it."""

from __future__ import annotations

import pytest
import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.redis import RedisCoordination
from coordinator.coordination.redis_sentinel import parse_sentinel_url
from coordinator.errors import SettingsError
from coordinator.settings import Settings
from tests.fixtures.redis_sentinel import DOWN_AFTER_MS, RedisSentinelGroup

pytestmark = pytest.mark.redis

OP_TIMEOUT_S = 0.5
#: kill -> last failure: the sentinels' down-after, their vote and the promotion (~1.5 s here),
#: plus one operation timeout; generous for a loaded 2-core machine
FAILOVER_BOUND_S = DOWN_AFTER_MS / 1000 + 8.0


def test_sentinel_urls() -> None:
    target = parse_sentinel_url("redis+sentinel://me@a:1,b:2,c:3/svc?ssl_cert_reqs=none")
    assert target is not None
    assert target.sentinels == (("a", 1), ("b", 2), ("c", 3)) and target.service == "svc"
    assert target.master_url == "redis://me@a:1/0?ssl_cert_reqs=none"
    assert parse_sentinel_url("redis://a:1/0") is None
    for bad in ("redis+sentinel://a:1,b/svc", "redis+sentinel://a:1/", "redis+sentinel://a:x/s"):
        with pytest.raises(SettingsError):
            parse_sentinel_url(bad)
    url = "redis+sentinel://a:1,b:2/svc"
    assert Settings.from_env({"GEMMANET_REDIS_URL": url}).redis_url == url
    with pytest.raises(SettingsError, match="password"):
        Settings.from_env({"GEMMANET_REDIS_URL": "redis+sentinel://u:pw@a:1,b:2/svc"})


async def test_failover_under_load_bounded_failures_and_fencing_never_goes_back(
    redis_sentinel_group: RedisSentinelGroup,
) -> None:
    group = redis_sentinel_group
    outcomes: list[tuple[float, bool]] = []
    async with RedisCoordination(group.url, key_prefix="sen", op_timeout_s=OP_TIMEOUT_S) as c:
        claim = await c.monitor_acquire("M1", ttl_s=1.0)
        assert claim.held and claim.epoch == 1
        assert await c.monitor_resign("M1", claim.epoch)
        await _refused_while_the_replica_is_frozen(group, c)
        claim = await c.monitor_acquire("M1", ttl_s=1.0)
        assert claim.held and claim.epoch == 3

        async def trickle() -> None:
            while True:
                started = trio.current_time()
                try:
                    await c.incr("counter")
                    ok = True
                except CoordinationUnavailable:
                    ok = False
                outcomes.append((started, ok))
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle)
            await trio.sleep(0.5)
            killed_at = trio.current_time()
            await trio.to_thread.run_sync(group.master.stop)
            with trio.fail_after(FAILOVER_BOUND_S + 5):
                while not any(ok for t, ok in outcomes if t > killed_at) or not any(
                    not ok for t, ok in outcomes if t > killed_at
                ):
                    await trio.sleep(0.05)
                recovered = min(t for t, ok in outcomes if t > killed_at and ok)
                while len([1 for t, ok in outcomes if t > recovered]) < 20:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

        failures = [t for t, ok in outcomes if not ok]
        assert failures and min(failures) >= killed_at - OP_TIMEOUT_S
        window = max(failures) - killed_at
        assert window < FAILOVER_BOUND_S, (window, len(failures))
        # Once back, it stays back: every operation after the last failure succeeded.
        assert all(ok for t, ok in outcomes if t > max(failures))
        assert group.master_port() == group.replica.port
        # The promoted replica has every epoch handed out before the kill.
        status = await c.monitor_status()
        assert status.epoch >= claim.epoch
        await trio.sleep(1.1)  # M1's lease (TTL 1 s) runs out
        # No replica is left to hold a new epoch: no claim until the old master is back (the
        # sentinels turn it into a replica of the new one).
        with pytest.raises(CoordinationUnavailable, match="no replica acknowledged"):
            await c.monitor_acquire("M2", ttl_s=5.0)
        await trio.to_thread.run_sync(group.master.start)
        # What the sentinels would do on their own, a few seconds later.
        group.master.raw_command("REPLICAOF", "127.0.0.1", str(group.replica.port))
        with trio.fail_after(20):
            while True:
                try:
                    taken = await c.monitor_acquire("M2", ttl_s=5.0)
                    break
                except CoordinationUnavailable:
                    await trio.sleep(0.2)
        assert taken.held and taken.epoch > claim.epoch
        print(f"failover: {len(failures)} failed operations over {window:.2f} s")


async def _refused_while_the_replica_is_frozen(
    group: RedisSentinelGroup, c: RedisCoordination
) -> None:
    """A frozen replica cannot acknowledge (WAIT 1): the claim is refused, not handed out with
    a token a failover could lose, and its lease is given back at once."""
    group.replica.pause()
    try:
        with pytest.raises(CoordinationUnavailable, match="no replica acknowledged"):
            await c.monitor_acquire("M1", ttl_s=5.0)
        assert (await c.monitor_status()).holder is None
    finally:
        group.replica.resume()
