"""What only the Redis Streams instance bus (GEMMANET_BUS=streams) has, against a real
redis-server: nothing appended for nobody, the MAXLEN bound, a hung or restarted Redis. What it
shares with the other buses (order, presence, resuming without loss) is in
test_bus_contract.py, which also uses the helpers here."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import trio

from coordinator.coordination import CoordinationUnavailable, MemoryCoordination, Subscription
from coordinator.coordination.bus.streams import StreamsBus, listening_key, stream_key
from coordinator.coordination.redis.coordination import RedisCoordination
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


async def test_send_to_nobody_appends_nothing(
    coordination: RedisCoordination, redis_server_session: RedisServer
) -> None:
    bus = StreamsBus(coordination)
    assert await bus.send("X", b"nobody") == 0
    assert xlen(redis_server_session, coordination, "X") == 0
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"somebody") == 1
        assert await receive(inbox, 1) == [b"somebody"]
    assert await bus.send("X", b"after") == 0
    assert xlen(redis_server_session, coordination, "X") == 1


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


async def test_a_relisten_after_trimming_past_the_last_entry_read_is_not_resumed(
    coordination: RedisCoordination, redis_server_session: RedisServer
) -> None:
    """MAXLEN trimmed entries that were never read: the re-listen cannot claim nothing is
    missing, so the cluster fails the tasks whose answers may be among them."""
    bus = StreamsBus(coordination, maxlen=1)
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"read") == 1
        assert await receive(inbox, 1) == [b"read"]
        kill_listener_connection(redis_server_session, coordination, "X")
        with pytest.raises(CoordinationUnavailable):
            await receive(inbox, 1)
    for i in range(300):  # approximate trimming drops whole nodes of 100 entries
        assert await bus.send("X", b"%d" % i) == 1
    async with bus.listen("X") as inbox:
        assert not inbox.resumed
