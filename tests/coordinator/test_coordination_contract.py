"""One contract, two backends: every test here runs against the embedded memory backend (on a
fake clock) and against RedisCoordination talking to a real redis-server.

The ``backend`` fixture lives in tests/fixtures/coordination_backend.py (the lease contract
suite uses it too). Time: ``backend.advance(s)`` moves the memory backend's injected clock,
and really sleeps for Redis, so TTLs here are short (tenths of a second) to keep the suite fast.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.coordination.memory.coordination import MemoryCoordination, MemoryState
from coordinator.coordination.redis.coordination import RedisCoordination
from tests.fixtures.coordination_backend import SLACK, Backend, FakeClock
from tests.fixtures.redis_server import RedisServer

# -- keys -------------------------------------------------------------------------------------


async def test_get_set_and_absent_keys(backend: Backend) -> None:
    c = backend.coord.key_value
    assert await c.get("missing") is None
    assert await c.set("k", b"v1") is True
    assert await c.get("k") == b"v1"
    assert await c.set("k", b"v2") is True
    assert await c.get("k") == b"v2"
    binary = bytes(range(256))
    await c.set("bin", binary)
    assert await c.get("bin") == binary


async def test_set_only_if_absent(backend: Backend) -> None:
    c = backend.coord.key_value
    assert await c.set("lock", b"a", only_if_absent=True) is True
    assert await c.set("lock", b"b", only_if_absent=True) is False
    assert await c.get("lock") == b"a"


async def test_ttl_expiry(backend: Backend) -> None:
    c = backend.coord.key_value
    await c.set("short", b"x", ttl_s=0.2)
    await c.set("forever", b"y")
    await backend.advance(0.1)
    assert await c.get("short") == b"x"
    await backend.advance(0.1 + SLACK)
    assert await c.get("short") is None
    assert await c.get_many(["short", "forever"]) == [None, b"y"]
    assert await c.keys_with_prefix("") == ["forever"]
    # An expired key is absent for only_if_absent too.
    assert await c.set("short", b"again", only_if_absent=True) is True


async def test_plain_set_clears_a_previous_ttl(backend: Backend) -> None:
    c = backend.coord.key_value
    await c.set("k", b"1", ttl_s=0.2)
    await c.set("k", b"2")
    await backend.advance(0.2 + SLACK)
    assert await c.get("k") == b"2"


async def test_swap_returns_previous_value(backend: Backend) -> None:
    c = backend.coord.key_value
    assert await c.swap("s", b"first") is None
    assert await c.swap("s", b"second", ttl_s=0.2) == b"first"
    assert await c.get("s") == b"second"
    await backend.advance(0.2 + SLACK)
    assert await c.swap("s", b"third") is None


async def test_swap_many_swaps_each_key_and_returns_the_previous_values(
    backend: Backend,
) -> None:
    c = backend.coord.key_value
    await c.set("a", b"old-a")
    assert await c.swap_many([("a", b"new-a"), ("b", b"new-b")], ttl_s=0.2) == [b"old-a", None]
    assert await c.get_many(["a", "b"]) == [b"new-a", b"new-b"]
    await backend.advance(0.2 + SLACK)  # the TTL applies to every key
    assert await c.get_many(["a", "b"]) == [None, None]
    assert await c.swap_many([("a", b"1")]) == [None]
    assert await c.swap_many([]) == []
    assert await c.swap_many([("a", b"2")]) == [b"1"]  # no TTL: still there
    # With a counter bumped in the same step, once per call (empty calls change nothing).
    assert await c.swap_many([("x", b"1"), ("y", b"1")], bump="claims") == [None, None]
    assert await c.swap_many([("x", b"2")], bump="claims") == [b"1"]
    assert await c.swap_many([], bump="claims") == []
    assert await c.get("claims") == b"2"
    await backend.advance(0.2 + SLACK)
    assert await c.get("a") == b"2"


async def test_compare_and_set(backend: Backend) -> None:
    c = backend.coord.key_value
    # expected None: only when absent
    assert await c.compare_and_set("owner", None, b"A") is True
    assert await c.compare_and_set("owner", None, b"B") is False
    assert await c.get("owner") == b"A"
    # expected value: must match exactly
    assert await c.compare_and_set("owner", b"X", b"B") is False
    assert await c.compare_and_set("owner", b"A", b"B", ttl_s=0.2) is True
    assert await c.get("owner") == b"B"
    # value None deletes
    assert await c.compare_and_set("owner", b"A", None) is False
    assert await c.compare_and_set("owner", b"B", None) is True
    assert await c.get("owner") is None
    # absent and expected None, value None: nothing to do, and that counts as done
    assert await c.compare_and_set("owner", None, None) is True
    # the TTL given on a successful swap applies
    assert await c.compare_and_set("owner", None, b"C", ttl_s=0.2) is True
    await backend.advance(0.2 + SLACK)
    assert await c.get("owner") is None
    # an expired key counts as absent
    assert await c.compare_and_set("owner", None, b"D") is True


async def test_compare_and_set_distinguishes_empty_value_from_absent(backend: Backend) -> None:
    c = backend.coord.key_value
    assert await c.compare_and_set("e", b"", b"x") is False
    await c.set("e", b"")
    assert await c.compare_and_set("e", None, b"x") is False
    assert await c.compare_and_set("e", b"", b"x") is True
    assert await c.get("e") == b"x"


async def test_refresh_if(backend: Backend) -> None:
    # Seconds, not tenths: on Redis these are real sleeps, and with a 0.2 s TTL a loaded
    # machine let the key expire between the set and the refresh (two round trips later).
    c = backend.coord.key_value
    assert await c.refresh_if("alive", b"me", 1.5) is False
    await c.set("alive", b"me", ttl_s=1.0)
    await backend.advance(0.5)
    assert await c.refresh_if("alive", b"someone-else", 1.5) is False
    assert await c.refresh_if("alive", b"me", 1.5) is True
    await backend.advance(0.8)  # past the original TTL, inside the refreshed one
    assert await c.get("alive") == b"me"
    await backend.advance(0.7 + SLACK)
    assert await c.get("alive") is None
    assert await c.refresh_if("alive", b"me", 1.5) is False


async def test_refresh_many_refreshes_only_the_keys_that_hold_their_expected_value(
    backend: Backend,
) -> None:
    c = backend.coord.key_value
    for i in range(3):
        await c.set(f"own:{i}", b"me", ttl_s=0.2)
    await backend.advance(0.1)
    expected = [("own:0", b"me"), ("own:1", b"someone-else"), ("absent", b"me"), ("own:2", b"me")]
    assert await c.refresh_many(expected, 0.3) == [True, False, False, True]
    await backend.advance(0.2)  # past the original TTL, inside the refreshed one
    assert [await c.get(f"own:{i}") for i in range(3)] == [b"me", None, b"me"]
    assert await c.get("absent") is None
    assert await c.refresh_many([], 0.3) == []


async def test_delete(backend: Backend) -> None:
    c = backend.coord.key_value
    await c.set("d", b"1")
    await c.delete("d")
    assert await c.get("d") is None
    await c.delete("d")  # absent: no error


async def test_incr_with_ttl_on_create_only(backend: Backend) -> None:
    c = backend.coord.key_value
    assert await c.incr("n") == 1
    assert await c.incr("n", 5) == 6
    assert await c.incr("n", -10) == -4
    assert await c.get("n") == b"-4"

    assert await c.incr("t", ttl_s=0.2) == 1
    await backend.advance(0.1)
    # The TTL is not pushed back by later increments.
    assert await c.incr("t", ttl_s=0.2) == 2
    await backend.advance(0.1 + SLACK)
    assert await c.get("t") is None
    assert await c.incr("t") == 1


async def test_incr_of_a_non_integer_is_refused(backend: Backend) -> None:
    c = backend.coord.key_value
    await c.set("text", b"hello")
    with pytest.raises(ValueError):
        await c.incr("text")
    assert await c.get("text") == b"hello"


async def test_get_many(backend: Backend) -> None:
    c = backend.coord.key_value
    assert await c.get_many([]) == []
    await c.set("a", b"1")
    await c.set("c", b"3")
    assert await c.get_many(["a", "b", "c", "a"]) == [b"1", None, b"3", b"1"]


async def test_keys_with_prefix(backend: Backend) -> None:
    c = backend.coord.key_value
    for key in ["node:1", "node:2", "node:10", "nodes", "inst:1", "n*x", "n?y", "n[z]"]:
        await c.set(key, b"v")
    await c.set("node:gone", b"v", ttl_s=0.1)
    await backend.advance(0.1 + SLACK)
    assert sorted(await c.keys_with_prefix("node:")) == ["node:1", "node:10", "node:2"]
    assert sorted(await c.keys_with_prefix("node")) == ["node:1", "node:10", "node:2", "nodes"]
    # glob characters in the prefix are literal
    assert await c.keys_with_prefix("n*") == ["n*x"]
    assert await c.keys_with_prefix("n?") == ["n?y"]
    assert await c.keys_with_prefix("n[") == ["n[z]"]
    assert await c.keys_with_prefix("nothing") == []


async def test_keys_with_prefix_sees_many_keys(backend: Backend) -> None:
    c = backend.coord.key_value
    for i in range(1500):  # more than one SCAN batch
        await c.set(f"bulk:{i}", b"v")
    keys = await c.keys_with_prefix("bulk:")
    assert len(keys) == 1500
    assert set(keys) == {f"bulk:{i}" for i in range(1500)}


async def test_invalid_arguments_are_refused(backend: Backend) -> None:
    c = backend.coord
    with pytest.raises(ValueError):
        await c.key_value.set("k", b"v", ttl_s=0)
    with pytest.raises(ValueError):
        await c.rate_limits.rate_limit("r", limit=0, period_s=1)
    with pytest.raises(ValueError):
        await c.rate_limits.rate_limit("r", limit=1, period_s=0)


# -- rate limits ------------------------------------------------------------------------------


async def test_rate_limit_allows_exactly_limit_then_slides(backend: Backend) -> None:
    c = backend.coord.rate_limits
    period = 0.5
    decisions = [await c.rate_limit("api:k1", limit=5, period_s=period) for _ in range(5)]
    assert [d.allowed for d in decisions] == [True] * 5
    assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0]
    assert all(d.retry_after_s == 0 for d in decisions)

    refused = await c.rate_limit("api:k1", limit=5, period_s=period)
    assert not refused.allowed
    assert refused.remaining == 0
    assert 0 < refused.retry_after_s <= period
    again = await c.rate_limit("api:k1", limit=5, period_s=period)
    assert not again.allowed
    assert again.retry_after_s <= refused.retry_after_s

    # Other keys have their own window.
    assert (await c.rate_limit("api:k2", limit=5, period_s=period)).allowed

    await backend.advance(refused.retry_after_s + SLACK)
    assert (await c.rate_limit("api:k1", limit=5, period_s=period)).allowed


async def test_rate_limit_window_slides_per_call(backend: Backend) -> None:
    c = backend.coord.rate_limits
    period = 0.6
    for _ in range(3):
        assert (await c.rate_limit("slide", limit=5, period_s=period)).allowed
    await backend.advance(0.3)
    for _ in range(2):
        assert (await c.rate_limit("slide", limit=5, period_s=period)).allowed
    refused = await c.rate_limit("slide", limit=5, period_s=period)
    assert not refused.allowed
    # The first three calls leave the window first, about 0.3 s from now.
    assert 0.3 - 0.1 < refused.retry_after_s <= 0.3 + 1e-6
    await backend.advance(refused.retry_after_s + SLACK)
    # Only the three oldest calls left the window: three more fit, not five.
    allowed = [(await c.rate_limit("slide", limit=5, period_s=period)).allowed for _ in range(5)]
    assert allowed == [True, True, True, False, False]


async def test_rate_limit_refused_calls_are_not_counted(backend: Backend) -> None:
    c = backend.coord.rate_limits
    assert (await c.rate_limit("r", limit=1, period_s=0.3)).allowed
    for _ in range(10):
        assert not (await c.rate_limit("r", limit=1, period_s=0.3)).allowed
    await backend.advance(0.3 + SLACK)
    assert (await c.rate_limit("r", limit=1, period_s=0.3)).allowed


async def test_rate_limit_counts_a_token_once(backend: Backend) -> None:
    """A request asks again after a timeout with the same token: if its first ask was counted
    (the answer was lost), the second is allowed and not counted again."""
    c = backend.coord.rate_limits
    period = 0.5
    first = await c.rate_limit("tok", limit=2, period_s=period, token="req-1")
    assert (first.allowed, first.remaining) == (True, 1)
    for _ in range(3):
        again = await c.rate_limit("tok", limit=2, period_s=period, token="req-1")
        assert (again.allowed, again.remaining) == (True, 1)
    # The key has one call counted, not four: one more request fits, then the key is full.
    assert (await c.rate_limit("tok", limit=2, period_s=period, token="req-2")).allowed
    assert not (await c.rate_limit("tok", limit=2, period_s=period, token="req-3")).allowed
    # Full, yet a counted request asking again is still allowed (it was counted).
    assert (await c.rate_limit("tok", limit=2, period_s=period, token="req-1")).allowed
    # Calls without a token each count.
    assert not (await c.rate_limit("tok", limit=2, period_s=period)).allowed
    # Once its call left the window, the same token counts anew.
    await backend.advance(period + SLACK)
    assert (await c.rate_limit("tok", limit=2, period_s=period, token="req-1")).remaining == 1
    assert (await c.rate_limit("tok", limit=2, period_s=period, token="req-4")).remaining == 0


async def test_rate_limit_is_exact_under_concurrency(backend: Backend) -> None:
    c = backend.coord
    results: list[bool] = []

    async def call(coord: Coordination) -> None:
        decision = await coord.rate_limits.rate_limit("burst", limit=10, period_s=30)
        results.append(decision.allowed)

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(call, c)
    assert results.count(True) == 10
    assert len(results) == 50


async def test_rate_limit_is_shared_between_instances(backend: Backend) -> None:
    results: list[bool] = []

    async def call(coord: Coordination) -> None:
        decision = await coord.rate_limits.rate_limit("shared", limit=10, period_s=30)
        results.append(decision.allowed)

    async with backend.open_peer() as peer, trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(call, backend.coord if i % 2 else peer)
    assert results.count(True) == 10


# -- bus --------------------------------------------------------------------------------------


async def _next(subscription: object, timeout: float = 2.0) -> bytes:
    with trio.fail_after(timeout):
        async for message in subscription:  # type: ignore[attr-defined]
            return bytes(message)
    raise AssertionError("subscription ended")


async def test_publish_without_subscribers_reaches_nobody(backend: Backend) -> None:
    assert await backend.coord.pubsub.publish("inst:nobody", b"hello") == 0
    assert await backend.coord.pubsub.subscriber_count("inst:nobody") == 0


async def test_subscription_gets_messages_in_order(backend: Backend) -> None:
    c = backend.coord.pubsub
    async with c.subscribe("inst:a") as sub:
        assert await c.subscriber_count("inst:a") == 1
        for i in range(200):
            assert await c.publish("inst:a", b"m%d" % i) == 1
        received = [await _next(sub) for _ in range(200)]
    assert received == [b"m%d" % i for i in range(200)]
    assert await c.subscriber_count("inst:a") == 0
    assert await c.publish("inst:a", b"late") == 0


async def test_publish_counts_every_subscriber(backend: Backend) -> None:
    c = backend.coord.pubsub
    async with backend.open_peer() as peer:
        async with c.subscribe("fan") as first, peer.pubsub.subscribe("fan") as second:
            assert await c.subscriber_count("fan") == 2
            assert await peer.pubsub.publish("fan", b"\x00\xffbinary") == 2
            assert await _next(first) == b"\x00\xffbinary"
            assert await _next(second) == b"\x00\xffbinary"
            async with c.subscribe("other") as unrelated:
                assert await c.publish("fan", b"two") == 2
                assert await c.publish("other", b"only-other") == 1
                assert await _next(unrelated) == b"only-other"
            assert await _next(first) == b"two"
        assert await c.subscriber_count("fan") == 0


async def test_messages_published_before_subscribing_are_lost(backend: Backend) -> None:
    c = backend.coord.pubsub
    assert await c.publish("late", b"before") == 0
    async with c.subscribe("late") as sub:
        await c.publish("late", b"after")
        assert await _next(sub) == b"after"


async def test_subscriber_leaving_is_seen_by_publisher(backend: Backend) -> None:
    c = backend.coord.pubsub
    async with backend.open_peer() as peer:
        async with peer.pubsub.subscribe("reply:1"):
            assert await c.publish("reply:1", b"x") == 1
        assert await c.publish("reply:1", b"x") == 0


async def test_closed_backend_is_unavailable(backend: Backend) -> None:
    async with backend.open_peer() as peer:
        await peer.key_value.set("k", b"v")
        await peer.aclose()
        await peer.aclose()  # idempotent
        with pytest.raises(CoordinationUnavailable):
            await peer.key_value.get("k")
        with pytest.raises(CoordinationUnavailable):
            await peer.pubsub.publish("c", b"x")
    assert await backend.coord.key_value.get("k") == b"v"


async def test_closing_ends_open_subscriptions(backend: Backend) -> None:
    async with backend.open_peer() as peer, peer.pubsub.subscribe("bye") as sub:
        await peer.aclose()
        with trio.fail_after(2):
            async for _ in sub:
                raise AssertionError("no message expected")
        # The closed instance's subscription is gone for everyone else (Redis learns it from
        # the closed socket, so allow it a moment).
        with trio.move_on_after(1):
            while await backend.coord.pubsub.subscriber_count("bye"):
                await trio.sleep(0.01)
        assert await backend.coord.pubsub.publish("bye", b"x") == 0


# -- Redis only -------------------------------------------------------------------------------


@pytest.mark.redis
async def test_key_prefixes_isolate_deployments(redis_server_session: RedisServer) -> None:
    url = redis_server_session.url
    async with (
        RedisCoordination(url, key_prefix="iso-a") as a,
        RedisCoordination(url, key_prefix="iso-b") as b,
    ):
        await a.key_value.set("node:1", b"a")
        await b.key_value.set("node:2", b"b")
        assert await a.key_value.keys_with_prefix("node:") == ["node:1"]
        assert await b.key_value.keys_with_prefix("node:") == ["node:2"]
        assert await a.key_value.get("node:2") is None
        for _ in range(3):
            assert (await a.rate_limits.rate_limit("r", limit=3, period_s=30)).allowed
        assert (await b.rate_limits.rate_limit("r", limit=3, period_s=30)).allowed
        async with a.pubsub.subscribe("inst:x"):
            assert await b.pubsub.publish("inst:x", b"hi") == 0
            assert await b.pubsub.subscriber_count("inst:x") == 0
            assert await a.pubsub.publish("inst:x", b"hi") == 1


# -- memory only ------------------------------------------------------------------------------


def test_memory_state_stays_flat() -> None:
    clock = FakeClock()
    state = MemoryState(clock)
    for round_ in range(50):
        for i in range(200):
            state.set(f"task:{round_}:{i}", b"x", ttl_s=1.0)
            state.rate_limit(f"api:{round_}:{i}", limit=5, period_s=1.0)
            state.refresh_if(f"task:{round_}:{i}", b"x", 1.0)
        clock.now += 2.0
        state.get("anything")
    size = state.size()
    assert size["keys"] == 0
    assert size["expiry_heap"] == 0
    assert size["rate_logs"] == 0
    assert size["rate_heap"] == 0


def test_memory_state_decides_on_the_injected_clock() -> None:
    clock = FakeClock(0.0)
    state = MemoryState(clock)
    state.set("k", b"v", ttl_s=5)
    assert state.ttl("k") == 5
    clock.now = 4.999
    assert state.get("k") == b"v"
    clock.now = 5.0
    assert state.get("k") is None
    for _ in range(3):
        assert state.rate_limit("r", limit=3, period_s=10).allowed
    clock.now = 7.5
    refused = state.rate_limit("r", limit=3, period_s=10)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(7.5)  # 5 + 10 - 7.5
    clock.now = 15.0
    assert state.rate_limit("r", limit=3, period_s=10).allowed


def test_memory_state_fans_out_to_sinks_in_subscription_order() -> None:
    state = MemoryState(FakeClock())
    seen: list[tuple[str, bytes]] = []

    def sink(name: str) -> Callable[[bytes], bool]:
        def offer(payload: bytes) -> bool:
            seen.append((name, payload))
            return True

        return offer

    first = state.add_subscriber("c", sink("first"))
    state.add_subscriber("c", sink("second"))
    state.add_subscriber("c", lambda payload: False)  # a full buffer
    assert state.publish("c", b"1") == 3
    assert seen == [("first", b"1"), ("second", b"1")]
    assert state.dropped == 1
    state.remove_subscriber("c", first)
    assert state.subscriber_count("c") == 2


async def test_memory_slow_subscriber_drops_instead_of_blocking() -> None:
    coord = MemoryCoordination(subscriber_buffer=3)
    async with coord, coord.pubsub.subscribe("slow") as sub:
        for i in range(5):
            with trio.fail_after(1):  # publish never blocks
                assert await coord.pubsub.publish("slow", b"%d" % i) == 1
        assert [await _next(sub) for _ in range(3)] == [b"0", b"1", b"2"]
        assert sub.dropped == 2  # type: ignore[attr-defined]
        assert coord.state.dropped == 2


async def test_memory_backend_runs_on_trio_virtual_clock(autojump_clock: trio.abc.Clock) -> None:
    async with MemoryCoordination(clock=trio.current_time) as coord:
        await coord.key_value.set("k", b"v", ttl_s=60)
        await trio.sleep(59)
        assert await coord.key_value.get("k") == b"v"
        await trio.sleep(1)
        assert await coord.key_value.get("k") is None


# -- presence ---------------------------------------------------------------------------------

REG = "presence:test"


async def test_presence_beat_stamps_members_with_the_backend_clock(backend: Backend) -> None:
    c = backend.coord.presence
    first = await c.presence_beat(REG, "A", b"a1", stall_after_s=5, forget_after_s=10)
    assert first.previous_beat is None and first.stalls == ()
    assert [(e.member, e.data) for e in first.entries] == [("A", b"a1")]
    assert first.entries[0].last_beat == first.now
    await backend.advance(0.2)
    async with backend.open_peer() as peer:
        second = await peer.presence.presence_beat(
            REG, "B", b"b1", stall_after_s=5, forget_after_s=10
        )
    assert [(e.member, e.data) for e in second.entries] == [("A", b"a1"), ("B", b"b1")]
    beats = {e.member: e.last_beat for e in second.entries}
    assert 0.2 - SLACK <= beats["B"] - beats["A"] <= 0.2 + 1.0
    again = await c.presence_beat(REG, "A", b"a2", stall_after_s=5, forget_after_s=10)
    assert again.previous_beat == pytest.approx(first.now, abs=1e-6)
    read = await c.presence_read(REG, stall_after_s=5)
    assert [(e.member, e.data) for e in read.entries] == [("A", b"a2"), ("B", b"b1")]
    assert read.now >= again.now and read.previous_beat is None


async def test_presence_keeps_stale_members_until_forgotten(backend: Backend) -> None:
    c = backend.coord.presence
    await c.presence_beat(REG, "old", b"", stall_after_s=5, forget_after_s=0.3)
    await backend.advance(0.15)
    view = await c.presence_beat(REG, "new", b"", stall_after_s=5, forget_after_s=0.3)
    assert [e.member for e in view.entries] == ["new", "old"]  # stale, still listed
    await backend.advance(0.25)
    view = await c.presence_beat(REG, "new", b"", stall_after_s=5, forget_after_s=0.3)
    assert [e.member for e in view.entries] == ["new"]  # forgotten by the beat


async def test_presence_leave_removes_at_once(backend: Backend) -> None:
    c = backend.coord.presence
    await c.presence_beat(REG, "A", b"x", stall_after_s=5, forget_after_s=10)
    await c.presence_leave(REG, "A")
    assert (await c.presence_read(REG, stall_after_s=5)).entries == ()
    again = await c.presence_beat(REG, "A", b"x", stall_after_s=5, forget_after_s=10)
    assert again.previous_beat is None


async def test_presence_records_stalls_of_the_backend(backend: Backend) -> None:
    c = backend.coord.presence
    first = await c.presence_beat(REG, "A", b"", stall_after_s=0.2, forget_after_s=10)
    await backend.advance(0.1)
    await c.presence_read(REG, stall_after_s=0.2)  # calls 0.1 apart: no stall
    await backend.advance(0.4)  # nobody called for 0.4 s: a stall
    view = await c.presence_beat(REG, "A", b"", stall_after_s=0.2, forget_after_s=10)
    assert len(view.stalls) == 1
    start, end = view.stalls[0]
    assert end == pytest.approx(view.now, abs=1e-6)
    assert 0.4 - SLACK <= end - start <= 0.4 + 1.0
    assert start >= first.now
    # Reported only to beats whose previous beat is older than the stall.
    view = await c.presence_beat(REG, "A", b"", stall_after_s=0.2, forget_after_s=10)
    assert view.stalls == ()
