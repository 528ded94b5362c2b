"""The hot-path scripts on the lean pipeline (``redis/lean/lane.py``), against a real
redis-server: the admission and the release of every request go there (not coredis), a
flushed script cache is refilled (NOSCRIPT -> EVAL), and the guard's rules hold on it: a
killed connection fails its waiting callers as down (not slow) and the next call reopens it, a
paused server is a timeout (slow), and a cancelled caller's command may still run without its
reply going to the next caller."""

from __future__ import annotations

import pytest
import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.leases import LeaseRelease, NodeFacts
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.coordination.redis.lease_scripts import ADMIT
from coordinator.coordination.redis.scripts import INCR_WITH_TTL
from coordinator.errors import CoordinationTimeout
from tests.coordinator.test_lease_contract import REGISTRY, ask, rules
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis


def _sent(c: RedisCoordination) -> int:
    """Commands the lean pipeline has sent so far."""
    pipeline = c.link.lean._pipeline
    return 0 if pipeline is None else pipeline.commands_sent


async def _incr(c: RedisCoordination) -> int:
    """A write script (CLIENT PAUSE WRITE holds it) on the lean pipeline."""
    return int(await c.link.run_script(INCR_WITH_TTL, ["t:n"], ["1", ""], lane="lean"))


async def test_admission_and_release_take_the_lean_pipeline(redis_server: RedisServer) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t") as c:
        await c.presence.presence_beat(REGISTRY, "A", b"", stall_after_s=60, forget_after_s=60)
        await c.presence.presence_beat(REGISTRY, "O", b"", stall_after_s=60, forget_after_s=60)
        await c.leases.put_node_facts(NodeFacts("n1", "c1", "O", 2, None, {}))
        # A fresh server: each script's EVALSHA gets NOSCRIPT, then EVAL runs and caches it.
        first = await c.leases.admit(ask("r1"), rules())
        assert first.outcome == "granted"
        assert _sent(c) == 2  # both on the lean pipeline
        release = LeaseRelease("r1", "key", "m", (first.node_id, first.lease_id))
        assert await c.leases.release(release, rules()) == []
        assert _sent(c) == 4
        second = await c.leases.admit(ask("r2"), rules())
        assert second.outcome == "granted"
        assert _sent(c) == 5  # cached: one EVALSHA
        # A flushed script cache: NOSCRIPT again, and EVAL caches it again.
        assert redis_server.raw_command("SCRIPT", "FLUSH") == b"+OK\r\n"
        third = await c.leases.admit(ask("r3"), rules())
        assert third.outcome == "granted" and third.lease_id != second.lease_id
        assert _sent(c) == 7
        sha = ADMIT.sha.decode()
        assert redis_server.raw_command("SCRIPT", "EXISTS", sha) == b"*1\r\n:1\r\n"
        usage = await c.leases.lease_usage(["n1"])
        assert usage["n1"].leases == 2  # r1 released, r2 and r3 held


async def test_a_killed_connection_fails_its_callers_and_reopens(
    redis_server: RedisServer,
) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t", op_timeout_s=10) as c:
        assert await _incr(c) == 1
        failures: list[BaseException] = []

        async def waiting() -> None:
            try:
                await _incr(c)
            except CoordinationUnavailable as exc:
                failures.append(exc)

        with trio.fail_after(8):
            assert redis_server.raw_command("CLIENT", "PAUSE", "20000", "WRITE") == b"+OK\r\n"
            try:
                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(waiting)
                    await trio.sleep(0.3)  # the three are sent and held by the pause
                    killed = redis_server.raw_command("CLIENT", "KILL", "TYPE", "normal")
                    assert killed.startswith(b":") and int(killed[1:]) >= 1, killed
            finally:
                redis_server.raw_command("CLIENT", "UNPAUSE")
        # Every waiting caller failed, as down (a closed connection), not as slow.
        assert len(failures) == 3
        assert not any(isinstance(exc, CoordinationTimeout) for exc in failures), failures
        assert all("connection lost" in str(exc) for exc in failures), failures
        # The next call reopens the pipeline; the killed commands never ran.
        assert await _incr(c) == 2


async def test_a_paused_server_is_slow_and_a_cancelled_call_may_still_run(
    redis_server: RedisServer,
) -> None:
    server = redis_server
    async with RedisCoordination(server.url, key_prefix="t", op_timeout_s=0.5) as c:
        assert await _incr(c) == 1
        try:
            assert server.raw_command("CLIENT", "PAUSE", "20000", "WRITE") == b"+OK\r\n"
            with pytest.raises(CoordinationTimeout), trio.fail_after(8):
                await _incr(c)  # dropped: nothing heard within the timeout
            with trio.move_on_after(0.2) as cancelled:
                await _incr(c)  # sent on a fresh pipeline, its caller cancelled
            assert cancelled.cancelled_caught
        finally:
            server.raw_command("CLIENT", "UNPAUSE")
        # The cancelled caller's command ran after all (at-most-once, not never), and its
        # reply (2, or 3 if the timed-out one also ran) did not go to the next caller.
        with trio.fail_after(8):
            after = await _incr(c)
        ran = int(server.raw_command("GET", "t:n").split(b"\r\n")[1])
        assert after == ran and ran in (3, 4)
