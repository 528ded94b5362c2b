"""What the Redis backend does when Redis dies, hangs or comes back.

Each test gets its own redis-server (``redis_server``) so it can SIGKILL, restart or SIGSTOP it.
The promise under test: every operation ends within about a second with
``CoordinationUnavailable`` (never a hang, never a raw coredis error), and the same client object
works again once Redis is back.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import pytest
import trio

from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.errors import CoordinationTimeout
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis

BOUND_S = 1.5  # the promise: CoordinationUnavailable within ~1 s, asserted with some slack

OPERATIONS: dict[str, Callable[[Coordination], Awaitable[object]]] = {
    "get": lambda c: c.key_value.get("k"),
    "get_many": lambda c: c.key_value.get_many(["k", "j"]),
    "set": lambda c: c.key_value.set("k", b"v", ttl_s=5),
    "swap": lambda c: c.key_value.swap("k", b"v"),
    "compare_and_set": lambda c: c.key_value.compare_and_set("k", None, b"v"),
    "refresh_if": lambda c: c.key_value.refresh_if("k", b"v", 5),
    "delete": lambda c: c.key_value.delete("k"),
    "incr": lambda c: c.key_value.incr("n", ttl_s=5),
    "keys_with_prefix": lambda c: c.key_value.keys_with_prefix(""),
    "rate_limit": lambda c: c.rate_limits.rate_limit("r", limit=5, period_s=1),
    "publish": lambda c: c.pubsub.publish("ch", b"x"),
    "subscriber_count": lambda c: c.pubsub.subscriber_count("ch"),
    "ping": lambda c: c.ping(),
}


async def _subscribe_once(c: Coordination) -> None:
    async with c.pubsub.subscribe("ch"):
        pass


async def _assert_unavailable_fast(operation: Awaitable[object]) -> float:
    started = time.monotonic()
    with pytest.raises(CoordinationUnavailable):
        with trio.fail_after(5):  # a hang fails the test instead of blocking it
            await operation
    elapsed = time.monotonic() - started
    assert elapsed < BOUND_S, f"took {elapsed:.2f} s"
    return elapsed


async def _assert_works(c: Coordination) -> None:
    await c.ping()
    assert await c.key_value.set("probe", b"ok") is True
    assert await c.key_value.get("probe") == b"ok"
    assert await c.key_value.incr("probe-n") >= 1
    assert (await c.rate_limits.rate_limit("probe-r", limit=100, period_s=1)).allowed
    async with c.pubsub.subscribe("probe-ch") as sub:
        assert await c.pubsub.publish("probe-ch", b"hi") == 1
        with trio.fail_after(2):
            async for message in sub:
                assert message == b"hi"
                break


async def _assert_connections_settle(c: RedisCoordination, at_most: int) -> None:
    with trio.move_on_after(1):
        while c.link.open_connections > at_most:
            await trio.sleep(0.01)
    assert c.link.open_connections <= at_most


async def test_every_operation_fails_fast_when_redis_is_killed(redis_server: RedisServer) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t") as c:
        await _assert_works(c)
        redis_server.stop()
        for operation in OPERATIONS.values():
            await _assert_unavailable_fast(operation(c))
        await _assert_unavailable_fast(_subscribe_once(c))


async def test_concurrent_operations_all_fail_fast_when_redis_dies_mid_flight(
    redis_server: RedisServer,
) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t") as c:
        await c.ping()
        outcomes: list[str] = []

        async def hammer() -> None:
            deadline = time.monotonic() + 0.6
            while time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    await c.key_value.incr("n")
                    outcomes.append("ok")
                except CoordinationUnavailable:
                    outcomes.append("unavailable")
                assert time.monotonic() - started < BOUND_S

        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(hammer)
            await trio.sleep(0.2)
            redis_server.stop()
        assert "ok" in outcomes and "unavailable" in outcomes


async def test_same_client_works_again_after_restart(redis_server: RedisServer) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t") as c:
        await _assert_works(c)
        for _ in range(3):  # repeated outages leave nothing behind
            redis_server.stop()
            await _assert_unavailable_fast(c.key_value.get("probe"))
            await _assert_unavailable_fast(c.rate_limits.rate_limit("probe-r", limit=1, period_s=1))
            redis_server.start()
            # The restarted server lost its data and its Lua script cache; both are fine.
            await _assert_works(c)
        # The shared one plus the bus's publisher: no leaked subscriptions.
        await _assert_connections_settle(c, 2)


async def test_client_started_while_redis_is_down(redis_server: RedisServer) -> None:
    redis_server.stop()
    async with RedisCoordination(redis_server.url, key_prefix="t") as c:
        await _assert_unavailable_fast(c.ping())
        redis_server.start()
        await _assert_works(c)


async def test_operations_time_out_when_redis_hangs(redis_server: RedisServer) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t", op_timeout_s=0.5) as c:
        await c.key_value.set("k", b"v")
        redis_server.pause()
        try:
            for name in ("get", "set", "rate_limit", "publish"):
                elapsed = await _assert_unavailable_fast(OPERATIONS[name](c))
                assert elapsed >= 0.45  # it really waited for the timeout
            await _assert_unavailable_fast(_subscribe_once(c))
        finally:
            redis_server.resume()
        assert await c.key_value.get("k") == b"v"
        await _assert_works(c)


async def test_subscription_raises_when_redis_is_killed(redis_server: RedisServer) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t") as c:
        async with c.pubsub.subscribe("inst:1") as sub:
            await c.pubsub.publish("inst:1", b"before")
            received: list[bytes] = []
            with pytest.raises(CoordinationUnavailable), trio.fail_after(BOUND_S):
                async for message in sub:
                    received.append(message)
                    redis_server.stop()
            assert received == [b"before"]
        # The caller re-subscribes once Redis is back.
        redis_server.start()
        async with c.pubsub.subscribe("inst:1") as sub:
            assert await c.pubsub.publish("inst:1", b"after") == 1
            with trio.fail_after(2):
                async for message in sub:
                    assert message == b"after"
                    break


async def test_subscription_raises_when_redis_hangs_past_the_stall_limit(
    redis_server: RedisServer,
) -> None:
    async with RedisCoordination(
        redis_server.url,
        key_prefix="t",
        op_timeout_s=0.3,
        subscription_keepalive_s=0.2,
        subscription_stall_s=0.5,
    ) as c:
        async with c.pubsub.subscribe("inst:1") as sub:
            redis_server.pause()
            try:
                started = time.monotonic()
                with pytest.raises(CoordinationUnavailable), trio.fail_after(3):
                    async for _ in sub:
                        raise AssertionError("no message expected")
                # keepalive interval + stall limit, plus slack
                assert time.monotonic() - started < 0.2 + 0.5 + 0.5
            finally:
                redis_server.resume()
        await _assert_works(c)


async def test_subscription_survives_a_3_s_redis_pause(redis_server: RedisServer) -> None:
    """A paused Redis loses no message on an intact connection: the subscription must not
    report a loss (that would fail every cross-instance task of the instance)."""
    async with (
        RedisCoordination(
            redis_server.url, key_prefix="t", op_timeout_s=0.3, subscription_keepalive_s=0.2
        ) as c,
        c.pubsub.subscribe("inst:1") as sub,
        trio.open_nursery() as nursery,
    ):
        got: list[bytes] = []
        arrived = trio.Event()

        async def read() -> None:
            async for message in sub:  # keepalive PINGs run in here while idle
                got.append(message)
                arrived.set()

        nursery.start_soon(read)
        await trio.sleep(0.3)
        redis_server.pause()
        try:
            await trio.sleep(3.0)  # several keepalive PINGs go unanswered meanwhile
        finally:
            redis_server.resume()
        assert await c.pubsub.publish("inst:1", b"after the pause") == 1
        with trio.fail_after(3):
            await arrived.wait()
        assert got == [b"after the pause"]
        nursery.cancel_scope.cancel()


async def test_leaving_a_subscription_does_not_hang_on_a_dead_or_hung_redis(
    redis_server: RedisServer,
) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t", op_timeout_s=0.5) as c:
        with trio.fail_after(BOUND_S):
            async with c.pubsub.subscribe("inst:1"):
                redis_server.pause()
        redis_server.resume()
        with trio.fail_after(BOUND_S):
            async with c.pubsub.subscribe("inst:1"):
                redis_server.stop()
                await trio.sleep(0.05)
        await _assert_connections_settle(c, 0)


async def test_a_hang_is_a_timeout_that_says_how_long_redis_was_silent_a_refusal_is_not(
    redis_server: RedisServer,
) -> None:
    """The two failures a caller tells apart (docs/redis.md "Redis failures"): a hung Redis is
    ``CoordinationTimeout`` (slow, maybe not down: admission and the rate limit wait and ask
    again), with how long Redis has answered nothing; a refused connection is plain
    ``CoordinationUnavailable`` (down: fail at once)."""
    async with RedisCoordination(redis_server.url, key_prefix="t", op_timeout_s=0.5) as c:
        await c.key_value.set("k", b"v")
        redis_server.pause()
        try:
            with pytest.raises(CoordinationTimeout) as first:
                await c.key_value.get("k")
            with pytest.raises(CoordinationTimeout) as second:
                await c.rate_limits.rate_limit("r", limit=5, period_s=1)
        finally:
            redis_server.resume()
        assert first.value.silent_for_s is not None and first.value.silent_for_s >= 0.45
        assert second.value.silent_for_s is not None and second.value.silent_for_s >= 0.95
        assert await c.key_value.get("k") == b"v"
        redis_server.stop()
        with pytest.raises(CoordinationUnavailable) as refused:
            await c.key_value.get("k")
        assert not isinstance(refused.value, CoordinationTimeout)
