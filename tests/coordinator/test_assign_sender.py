"""An assign handed to its owner over the bus while Redis is paused (``runtime/cluster/
assign_sender.py``), on a real redis-server stopped with SIGSTOP: the send times out, is made
again, and arrives once Redis runs again; the request never fails for a pause shorter than the
store outage bound. Past the bound, or once the request stopped waiting, the sender stops."""

from __future__ import annotations

import pytest
import trio

from coordinator.coordination.factory import create_bus
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.errors import CoordinationTimeout
from coordinator.runtime.cluster.assign_sender import send_assign
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis

#: each bus call gives up after this long, so a 1.2 s pause costs several timeouts
OP_TIMEOUT_S = 0.3


async def _paused_for(redis: RedisServer, seconds: float) -> None:
    redis.pause()
    try:
        await trio.sleep(seconds)
    finally:
        redis.resume()


async def test_an_assign_sent_during_a_pause_arrives_after_it(redis_server: RedisServer) -> None:
    async with (
        RedisCoordination(redis_server.url, key_prefix="as", op_timeout_s=OP_TIMEOUT_S) as a,
        RedisCoordination(redis_server.url, key_prefix="as", op_timeout_s=OP_TIMEOUT_S) as b,
    ):
        sender, owner = create_bus("pubsub", a), create_bus("pubsub", b)
        async with owner.listen("owner") as inbox, trio.open_nursery() as nursery:
            nursery.start_soon(_paused_for, redis_server, 1.2)
            await trio.sleep(0.05)  # the pause has begun
            started = trio.current_time()
            reached = await send_assign(
                sender,
                "owner",
                b"assign-1",
                task_id="t1",
                still_waiting=lambda: True,
                store_outage_s=2.9,
                timeout_s=30.0,
            )
            assert reached == 1
            assert trio.current_time() - started >= 1.0  # it waited the pause out
            with trio.fail_after(5):
                async for got in inbox:
                    break
            assert got == b"assign-1"  # (a timed-out send may land too: owners drop replays)


async def test_past_the_outage_bound_the_send_fails(redis_server: RedisServer) -> None:
    async with RedisCoordination(
        redis_server.url, key_prefix="as2", op_timeout_s=OP_TIMEOUT_S
    ) as a:
        bus = create_bus("pubsub", a)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_paused_for, redis_server, 2.5)
            await trio.sleep(0.05)
            started = trio.current_time()
            with pytest.raises(CoordinationTimeout):
                await send_assign(
                    bus,
                    "owner",
                    b"x",
                    task_id="t2",
                    still_waiting=lambda: True,
                    store_outage_s=1.0,
                    timeout_s=30.0,
                )
            assert 0.9 <= trio.current_time() - started < 2.0


async def test_the_sender_stops_once_the_request_stopped_waiting(
    redis_server: RedisServer,
) -> None:
    async with RedisCoordination(
        redis_server.url, key_prefix="as3", op_timeout_s=OP_TIMEOUT_S
    ) as a:
        bus = create_bus("pubsub", a)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_paused_for, redis_server, 1.5)
            await trio.sleep(0.05)
            reached = await send_assign(
                bus,
                "owner",
                b"x",
                task_id="t3",
                still_waiting=lambda: False,
                store_outage_s=2.9,
                timeout_s=30.0,
            )
            assert reached is None
