"""What only the Redis Streams instance bus (GEMMANET_BUS=streams) has, against a real
redis-server: nothing appended for nobody, the MAXLEN bound, a hung or restarted Redis. What it
shares with the other buses (order, presence, resuming without loss) is in
test_bus_contract.py, which also uses the helpers here."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import trio

from coordinator.coordination import (
    CoordinationUnavailable,
    MemoryCoordination,
    Subscription,
    create_bus,
)
from coordinator.coordination.bus.streams import StreamsBus
from coordinator.coordination.keys import listening_key, refused_key, stream_key
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
    return _int_reply(server.raw_command("XLEN", coord.link.redis_key(stream_key(instance_id))))


def kill_listener_connection(
    server: RedisServer, coord: RedisCoordination, instance_id: str
) -> None:
    """CLIENT KILL the listener's own connection (found by its client name), nothing else."""
    name = coord.link.redis_key(listening_key(instance_id)).encode()
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
            create_bus("streams", memory)


async def test_send_to_nobody_appends_nothing(
    coordination: RedisCoordination, redis_server_session: RedisServer
) -> None:
    bus = StreamsBus(coordination.link)
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
    assert StreamsBus(coordination.link).maxlen == 10_000
    bus = StreamsBus(coordination.link, maxlen=100)
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
        bus = StreamsBus(coord.link, block_ms=200)
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
        bus = StreamsBus(coord.link)
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
    bus = StreamsBus(coordination.link, maxlen=1)
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


async def _keep_listening(
    bus: StreamsBus, instance_id: str, got: list[bytes], gates: dict[str, trio.Event]
) -> None:
    """What the cluster's bus reader does: listen again whenever the listen is lost (once
    ``gates[instance_id]`` is set: a peer that is late to come back, on a busy box)."""
    while True:
        await gates[instance_id].wait()
        try:
            async with bus.listen(instance_id) as inbox:
                async for payload in inbox:
                    got.append(payload)
        except CoordinationUnavailable:
            await trio.sleep(0.05)


async def test_a_pause_longer_than_the_presence_ttl_does_not_make_live_listeners_look_gone(
    redis_server: RedisServer,
) -> None:
    """A pause longer than the presence TTL lets a live listener's key expire (here A's: its
    listen was cut just before, and it is late to listen again). A bus that saw the stall (its
    own refresh timed out) does not take the missing key for a gone listener until Redis has
    been responsive for a whole TTL again: ``is_listening`` says yes and ``send`` appends, so
    A gets it when it listens again. Then absence is believed again."""
    ttl, url = 1.0, redis_server.url
    async with (
        RedisCoordination(url, key_prefix="t", op_timeout_s=0.4) as coord_a,
        RedisCoordination(url, key_prefix="t", op_timeout_s=0.4) as coord_b,
        trio.open_nursery() as nursery,
    ):
        a = StreamsBus(coord_a.link, presence_ttl_s=ttl, refresh_s=0.25, block_ms=200)
        b = StreamsBus(coord_b.link, presence_ttl_s=ttl, refresh_s=0.25, block_ms=200)
        got_a: list[bytes] = []
        gates = {"A": trio.Event(), "B": trio.Event()}
        gates["A"].set()
        gates["B"].set()
        nursery.start_soon(_keep_listening, a, "A", got_a, gates)
        nursery.start_soon(_keep_listening, b, "B", [], gates)
        await trio.sleep(0.6)
        assert await b.is_listening("A") and b.absence_believed()
        gates["A"] = trio.Event()
        kill_listener_connection(redis_server, coord_a, "A")  # A's listen is cut...
        await trio.sleep(0.1)
        redis_server.pause()  # ...and Redis stops for longer than the TTL
        try:
            await trio.sleep(ttl + 0.6)
        finally:
            redis_server.resume()
        key = coord_a.link.redis_key(listening_key("A"))
        assert redis_server.raw_command("EXISTS", key) == b":0\r\n"  # expired meanwhile
        # B saw the stall: a missing key is not a gone listener yet.
        assert not b.absence_believed()
        assert await b.is_listening("A") is True
        assert await b.send("A", b"during") == 1
        gates["A"].set()  # A listens again, resuming after the last entry it read
        with trio.fail_after(5):
            while got_a != [b"during"]:
                await trio.sleep(0.05)
        # Responsive for a TTL again: absence is believed again.
        with trio.fail_after(5):
            while not b.absence_believed():
                await trio.sleep(0.05)
        assert await b.is_listening("A") is True
        assert await b.is_listening("nobody") is False
        assert await b.send("nobody", b"x") == 0
        nursery.cancel_scope.cancel()


async def test_a_send_that_went_out_as_redis_stopped_refuses_nothing(
    redis_server: RedisServer,
) -> None:
    """B sends to A just as Redis stops, before B has any sign of the stall, and Redis runs
    the send only after a pause longer than the presence TTL, when A's key has lapsed (A's
    listen was cut just before, and it is late to listen again). The send only asked: its
    answer ("nobody there") came back too late to be believed, so B appends after all and
    records no refusal, and A's re-listen resumes with the envelope, though its presence
    lapsed meanwhile."""
    ttl, url = 1.0, redis_server.url
    async with (
        RedisCoordination(url, key_prefix="t", op_timeout_s=3.0) as coord_a,
        RedisCoordination(url, key_prefix="t", op_timeout_s=3.0) as coord_b,
        trio.open_nursery() as nursery,
    ):
        a = StreamsBus(coord_a.link, presence_ttl_s=ttl, refresh_s=0.25, block_ms=200)
        b = StreamsBus(coord_b.link, presence_ttl_s=ttl, refresh_s=0.25, block_ms=200)
        got_a: list[bytes] = []
        resumed: list[bool] = []
        gates = {"A": trio.Event(), "B": trio.Event()}
        gates["B"].set()

        async def listen_a() -> None:
            while True:
                await gates["A"].wait()
                try:
                    async with a.listen("A") as inbox:
                        resumed.append(inbox.resumed)
                        async for payload in inbox:
                            got_a.append(payload)
                except CoordinationUnavailable:
                    await trio.sleep(0.05)

        gates["A"].set()
        nursery.start_soon(listen_a)
        nursery.start_soon(_keep_listening, b, "B", [], gates)
        await trio.sleep(0.6)
        assert await b.send("A", b"before") == 1
        with trio.fail_after(5):
            while got_a != [b"before"]:
                await trio.sleep(0.02)
        gates["A"] = trio.Event()
        kill_listener_connection(redis_server, coord_a, "A")  # A's listen is cut
        await trio.sleep(0.1)
        outcome: list[int] = []

        async def send() -> None:
            outcome.append(await b.send("A", b"as Redis stopped"))

        redis_server.pause()
        try:
            assert b.absence_believed()  # no sign of the stall yet
            nursery.start_soon(send)
            await trio.sleep(ttl + 0.5)
        finally:
            redis_server.resume()
        with trio.fail_after(5):
            while not outcome:
                await trio.sleep(0.02)
        assert outcome == [1]
        refused = coord_b.link.redis_key(refused_key("A"))
        assert redis_server.raw_command("EXISTS", refused) == b":0\r\n"
        gates["A"].set()
        with trio.fail_after(5):
            while got_a != [b"before", b"as Redis stopped"]:
                await trio.sleep(0.02)
        assert resumed == [False, True]
        nursery.cancel_scope.cancel()
