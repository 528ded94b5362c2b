"""Redis Sentinel (docs/redis.md "Redis Sentinel"): the URLs, and the pub/sub bus across a failover.
The failover of a whole instance, with the fencing token across it, is
tests/e2e/test_redis_sentinel_e2e.py.

The bus's own connections (the lean client) go where the link's do, the master the sentinels
name: after a failover, a subscription on the old master is reported lost, and re-subscribing
and publishing, as the bus reader does, meet again at the promoted replica. Whether the old
master died (kill -9) or was demoted by the sentinels and still answers (SENTINEL FAILOVER): a
demoted master takes PUBLISH and SUBSCRIBE as a replica does, so only the handshake's ROLE
check keeps the bus from settling there.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.redis.connect.sentinel import parse_sentinel_url
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.errors import SettingsError
from coordinator.settings import Settings
from tests.fixtures.redis_sentinel import DOWN_AFTER_MS, SERVICE, RedisSentinelGroup

#: the failover (down-after, vote, promotion: ~2 s here) plus margin for a loaded 2-core box
FAILOVER_BOUND_S = DOWN_AFTER_MS / 1000 + 15.0


def test_sentinel_urls() -> None:
    target = parse_sentinel_url("redis+sentinel://me@a:1,b:2,c:3/svc?ssl_cert_reqs=none")
    assert target is not None
    assert target.sentinels == (("a", 1), ("b", 2), ("c", 3)) and target.service == "svc"
    assert target.master_url == "redis://me@a:1/0?ssl_cert_reqs=none"
    assert target.shown == "redis+sentinel://a:1,b:2,c:3/svc"
    assert parse_sentinel_url("redis://a:1/0") is None
    for bad in ("redis+sentinel://a:1,b/svc", "redis+sentinel://a:1/", "redis+sentinel://a:x/s"):
        with pytest.raises(SettingsError):
            parse_sentinel_url(bad)
    url = "redis+sentinel://a:1,b:2/svc"
    assert Settings.from_env({"GEMMANET_REDIS_URL": url}).redis_url == url
    with pytest.raises(SettingsError, match="password"):
        Settings.from_env({"GEMMANET_REDIS_URL": "redis+sentinel://u:pw@a:1,b:2/svc"})


def _subscribers(group: RedisSentinelGroup, port: int, channel: str) -> int:
    server = group.master if group.master.port == port else group.replica
    return int(server.raw_command("PUBSUB", "NUMSUB", channel).split(b"\r\n")[-2].lstrip(b":"))


async def _across_a_failover(group: RedisSentinelGroup, fail_over: Callable[[], None]) -> None:
    async with RedisCoordination(group.url, key_prefix="t", op_timeout_s=0.5) as c:
        async with c.pubsub.subscribe("ch") as inbox:
            assert await c.pubsub.publish("ch", b"before") == 1
            with trio.fail_after(5):
                assert await inbox.__anext__() == b"before"
            assert c.link.lean._pipeline_at is not None
            assert c.link.lean._pipeline_at.port == group.master.port
            await trio.to_thread.run_sync(fail_over)
            with (
                trio.fail_after(FAILOVER_BOUND_S),
                pytest.raises(CoordinationUnavailable, match="lost"),
            ):
                await inbox.__anext__()
        # The bus reader's contract: subscribe again (and publish) until Redis is back.
        with trio.fail_after(FAILOVER_BOUND_S):
            while True:
                try:
                    async with c.pubsub.subscribe("ch") as inbox:
                        if await c.pubsub.publish("ch", b"after") == 1:
                            with trio.fail_after(5):
                                assert await inbox.__anext__() == b"after"
                            # Both at the promoted replica, nothing left on the old master.
                            assert _subscribers(group, group.replica.port, "t:ch") == 1
                            break
                except CoordinationUnavailable:
                    pass
                await trio.sleep(0.1)
        assert group.master_port() == group.replica.port
        assert c.link.lean._pipeline_at is not None
        assert c.link.lean._pipeline_at.port == group.replica.port
        where = await c.link.master()
        assert where is not None and where.port == group.replica.port


@pytest.mark.redis
async def test_the_bus_follows_a_failover_after_the_master_died(
    redis_sentinel_group: RedisSentinelGroup,
) -> None:
    await _across_a_failover(redis_sentinel_group, redis_sentinel_group.master.stop)


@pytest.mark.redis
async def test_the_bus_leaves_a_demoted_master(redis_sentinel_group: RedisSentinelGroup) -> None:
    group = redis_sentinel_group

    def demote() -> None:
        reply = group.sentinels[0].raw_command("SENTINEL", "FAILOVER", SERVICE)
        assert reply.startswith(b"+OK"), reply

    await _across_a_failover(group, demote)
    # The old master still runs, now a replica of the new one.
    assert b"role:slave" in group.master.raw_command("INFO", "replication")
    assert _subscribers(group, group.master.port, "t:ch") == 0
