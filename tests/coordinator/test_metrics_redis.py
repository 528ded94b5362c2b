"""The Redis link's metrics hook on a real redis-server: every command is timed by its op name
(not its arguments), and a command that fails because Redis is gone counts as an error."""

from __future__ import annotations

import pytest
import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.runtime.metrics import Metrics
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_redis_ops_are_timed_and_failures_counted(redis_server: RedisServer) -> None:
    metrics = Metrics(dict)
    async with RedisCoordination(redis_server.url, key_prefix="m") as c:
        c.op_observer = metrics.redis_op
        await c.key_value.set("k", b"v")
        await c.key_value.get("k")
        await c.key_value.get("k")
        async with c.pubsub.subscribe("ch"):
            pass
        count = "gemmanet_redis_op_duration_seconds_count"
        assert sample(metrics, count, op="GET") == 2
        assert sample(metrics, count, op="SET") == 1
        assert sample(metrics, count, op="SUBSCRIBE") == 1  # the channel is not a label
        assert sample(metrics, "gemmanet_redis_errors_total", op="GET") == 0
        redis_server.stop()
        with pytest.raises(CoordinationUnavailable), trio.fail_after(5):
            await c.key_value.get("k")
        assert sample(metrics, "gemmanet_redis_errors_total", op="GET") == 1
        assert sample(metrics, count, op="GET") == 3
