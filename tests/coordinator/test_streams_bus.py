"""The Redis Streams instance bus (GEMMANET_BUS=streams) against a real redis-server: order,
the "nobody there" signal, presence after a lost connection, resuming without loss, bounds."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import trio

from coordinator.coordination import CoordinationUnavailable, MemoryCoordination, Subscription
from coordinator.coordination.redis import RedisCoordination
from coordinator.coordination.streams_bus import StreamsBus, listening_key, stream_key
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
async def coordination(
    redis_server_session: RedisServer, redis_key_prefix: str
) -> AsyncIterator[RedisCoordination]:
    async with RedisCoordination(redis_server_session.url, key_prefix=redis_key_prefix) as coord:
        yield coord


def _int_reply(raw: bytes) -> int:
    assert raw.startswith(b":"), raw
    return int(raw[1:].strip())


def xlen(server: RedisServer, coord: RedisCoordination, instance_id: str) -> int:
    return _int_reply(server.raw_command("XLEN", coord.redis_key(stream_key(instance_id))))


def kill_listener_connection(
    server: RedisServer, coord: RedisCoordination, instance_id: str
) -> None:
    """CLIENT KILL the listener's own connection (found by its client name), nothing else."""
    name = coord.redis_key(listening_key(instance_id)).encode()
    listing = server.raw_command("CLIENT", "LIST")
    ids = [
        line.split(b" ", 1)[0].removeprefix(b"id=")
        for line in listing.split(b"\n")
        if b" name=" + name + b" " in line
    ]
    assert len(ids) == 1, listing
    assert _int_reply(server.raw_command("CLIENT", "KILL", "ID", ids[0])) == 1


async def receive(inbox: Subscription, n: int, timeout_s: float = 5.0) -> list[bytes]:
    got: list[bytes] = []
    if n == 0:
        return got
    with trio.fail_after(timeout_s):
        async for payload in inbox:
            got.append(payload)
            if len(got) == n:
                break
    return got


async def test_refuses_a_non_redis_backend() -> None:
    async with MemoryCoordination() as memory:
        with pytest.raises(TypeError, match="GEMMANET_BUS=streams needs the Redis"):
            StreamsBus(memory)


async def test_send_then_listen_in_order(coordination: RedisCoordination) -> None:
    bus = StreamsBus(coordination)
    async with bus.listen("X") as inbox:
        for i in range(5):
            assert await bus.send("X", b"m%d" % i) == 1
        assert await receive(inbox, 5) == [b"m%d" % i for i in range(5)]
        # arrives while the reader is blocked in XREAD
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: bus.send("X", b"late"))
            assert await receive(inbox, 1) == [b"late"]


async def test_send_reports_whether_anybody_listens(
    coordination: RedisCoordination, redis_server_session: RedisServer
) -> None:
    bus = StreamsBus(coordination)
    assert await bus.is_listening("X") is False
    assert await bus.send("X", b"nobody") == 0
    assert xlen(redis_server_session, coordination, "X") == 0  # nothing appended
    async with bus.listen("X") as inbox:
        assert await bus.is_listening("X") is True
        assert await StreamsBus(coordination).is_listening("X") is True  # any process sees it
        assert await bus.send("X", b"somebody") == 1
        assert await receive(inbox, 1) == [b"somebody"]
    # closed on purpose: gone at once, not at the TTL
    assert await bus.is_listening("X") is False
    assert await bus.send("X", b"after") == 0
    assert xlen(redis_server_session, coordination, "X") == 1


async def test_listen_starts_at_the_end_of_the_stream(coordination: RedisCoordination) -> None:
    earlier = StreamsBus(coordination)  # e.g. a previous process with the same instance id
    async with earlier.listen("X"):
        assert await earlier.send("X", b"old") == 1
    bus = StreamsBus(coordination)
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"new") == 1
        assert await receive(inbox, 1) == [b"new"]


async def test_is_listening_goes_false_after_the_listener_connection_is_cut(
    coordination: RedisCoordination, redis_server_session: RedisServer
) -> None:
    bus = StreamsBus(coordination)
    async with bus.listen("X") as inbox:
        await trio.sleep(0.6)  # let the presence be refreshed at least once
        kill_listener_connection(redis_server_session, coordination, "X")
        cut_at = time.monotonic()
        with pytest.raises(CoordinationUnavailable, match="resumes after entry"):
            await receive(inbox, 1)
        assert time.monotonic() - cut_at < 0.5  # the reader notices at once
    # Not deleted: what is sent meanwhile waits for a re-listen ...
    assert await bus.is_listening("X") is True
    # ... until the presence key expires (TTL 2 s after its last refresh).
    with trio.fail_after(3):
        while await bus.is_listening("X"):
            await trio.sleep(0.05)
    gone_after = time.monotonic() - cut_at
    assert gone_after < 2.5, gone_after
    assert await bus.send("X", b"too late") == 0


async def test_listening_again_resumes_without_loss(
    coordination: RedisCoordination, redis_server_session: RedisServer
) -> None:
    bus = StreamsBus(coordination)
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"a") == 1
        assert await receive(inbox, 1) == [b"a"]
        kill_listener_connection(redis_server_session, coordination, "X")
        with pytest.raises(CoordinationUnavailable):
            await receive(inbox, 1)
    # Away: sends still land in the inbox (the presence key has not expired yet).
    for payload in (b"b", b"c", b"d"):
        assert await bus.send("X", payload) == 1
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"e") == 1
        assert await receive(inbox, 4) == [b"b", b"c", b"d", b"e"]
        with trio.move_on_after(0.2):  # and nothing twice
            extra = await receive(inbox, 1)
            raise AssertionError(f"unexpected {extra}")


async def test_resumes_after_the_consumer_left_mid_batch(coordination: RedisCoordination) -> None:
    bus = StreamsBus(coordination, read_count=100)
    async with bus.listen("X") as inbox:
        for i in range(10):
            await bus.send("X", b"%d" % i)
        assert await receive(inbox, 3) == [b"0", b"1", b"2"]  # 7 more were read, not delivered
    # The next listen continues after the last entry delivered, not the last one read.
    async with bus.listen("X") as inbox:
        assert await receive(inbox, 7) == [b"%d" % i for i in range(3, 10)]


async def test_a_thousand_messages_arrive_in_order(coordination: RedisCoordination) -> None:
    bus = StreamsBus(coordination)
    sent = [b"message %04d" % i for i in range(1000)]
    async with bus.listen("X") as inbox:
        started = time.monotonic()
        async with trio.open_nursery() as nursery:

            async def sender() -> None:
                for payload in sent:
                    assert await bus.send("X", payload) == 1

            nursery.start_soon(sender)
            got = await receive(inbox, len(sent), timeout_s=10)
        elapsed = time.monotonic() - started
    assert got == sent
    print(f"1000 messages through the streams bus in {elapsed:.3f} s")


async def test_maxlen_bounds_the_stream(
    coordination: RedisCoordination, redis_server_session: RedisServer
) -> None:
    assert StreamsBus(coordination).maxlen == 10_000
    bus = StreamsBus(coordination, maxlen=100)
    async with bus.listen("X"):  # listening but not reading
        async with trio.open_nursery() as nursery:
            for shard in range(10):

                async def sender(shard: int = shard) -> None:
                    for i in range(100):
                        await bus.send("X", b"%d-%d" % (shard, i))

                nursery.start_soon(sender)
        length = xlen(redis_server_session, coordination, "X")
    # Approximate trimming cuts whole nodes of 100 entries.
    assert 100 <= length <= 200, length


async def test_inbox_raises_when_redis_hangs(redis_server: RedisServer) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t", op_timeout_s=0.3) as coord:
        bus = StreamsBus(coord, block_ms=200)
        async with bus.listen("X") as inbox:
            redis_server.pause()
            try:
                started = time.monotonic()
                with pytest.raises(CoordinationUnavailable):
                    await receive(inbox, 1)
                assert time.monotonic() - started < 1.0
            finally:
                redis_server.resume()


async def test_works_again_after_redis_restarts(redis_server: RedisServer) -> None:
    async with RedisCoordination(redis_server.url, key_prefix="t") as coord:
        bus = StreamsBus(coord)
        async with bus.listen("X") as inbox:
            assert await bus.send("X", b"before") == 1
            assert await receive(inbox, 1) == [b"before"]
            redis_server.stop()
            with pytest.raises(CoordinationUnavailable):
                await receive(inbox, 1)
        with pytest.raises(CoordinationUnavailable):
            async with bus.listen("X"):
                pass
        redis_server.start()  # without its data: the stream starts over with new ids
        async with bus.listen("X") as inbox:
            assert await bus.send("X", b"after") == 1
            assert await receive(inbox, 1) == [b"after"]
