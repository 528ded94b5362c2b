"""One contract, four instance buses: every test here runs against ``MemoryBus`` (pub/sub and
durable, on trio's autojump clock), ``PubSubBus`` over a real ``RedisCoordination`` (its lean
pub/sub client, on one server and on a cluster) and ``StreamsBus``, on a real redis-server.

Shared: order per sender, delivery to the addressed inbox only, 0 for an inbox nobody opened,
``is_listening`` while open and not after a close, byte-exact payloads up to 1 MiB. Then the
difference: pub/sub kinds lose what is sent while nobody listens; durable kinds (memory durable,
streams) keep it across a dropped listener that listens again.

Time: memory kinds run on virtual time (the ``clock`` argument each test takes is how
pytest-trio hands trio.run a MockClock); Redis kinds on real time, so TTLs here are short.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from coordinator.coordination import CoordinationUnavailable, Subscription
from coordinator.coordination.bus.base import Bus, PubSubBus
from coordinator.coordination.bus.memory import MemoryBus, MemoryBusHub
from coordinator.coordination.bus.streams import StreamsBus
from coordinator.coordination.keys import listening_key
from coordinator.coordination.redis.connect.cluster import key_slot, tagged_prefix
from coordinator.coordination.redis.coordination import RedisCoordination
from tests.coordinator.test_streams_bus import kill_listener_connection
from tests.fixtures.redis_cluster import RedisClusterHandle

# Durable kinds: short enough to wait out for real against Redis, long enough to refresh in.
PRESENCE_TTL_S = 1.0
REFRESH_S = 0.25
# Margin for real-time checks against Redis (scheduling, round trips).
SLACK = 0.3

# "redis-pubsub": PubSubBus on one redis-server. "redis-cluster-pubsub": on a 3-master Redis
# Cluster (sharded pub/sub, at the master of the prefix's slot). StreamsBus runs there unchanged
# (its keys carry the tag);
# test_redis_cluster.py sends through it. Adding "redis-cluster-streams" to DURABLE_KINDS runs
# this suite on it too (it passes; left out for the suite's time).
PUBSUB_KINDS = [
    "memory",
    pytest.param("redis-pubsub", marks=pytest.mark.redis),
    pytest.param("redis-cluster-pubsub", marks=pytest.mark.redis),
]
DURABLE_KINDS = [
    "memory-durable",
    pytest.param("redis-streams", marks=pytest.mark.redis),
]
KINDS = [*PUBSUB_KINDS, *DURABLE_KINDS]
# A test parametrized over "kind" directly (PUBSUB_KINDS, DURABLE_KINDS) overrides the fixture.
only_pubsub = pytest.mark.parametrize("kind", PUBSUB_KINDS)
only_durable = pytest.mark.parametrize("kind", DURABLE_KINDS)


@dataclass
class BusKind:
    name: str
    durable: bool
    bus: Bus
    #: another process's bus on the same store (a fresh object: it never listened anywhere)
    open_peer: Callable[[], AbstractAsyncContextManager[Bus]]
    #: cut the open listen of an inbox like a lost connection (CLIENT KILL)
    drop: Callable[[str], None]
    #: make an inbox's presence expire now, as if its refreshes had stopped (durable kinds)
    lapse: Callable[[str], None] = lambda instance_id: None


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock(kind: str) -> trio.testing.MockClock | None:
    return trio.testing.MockClock(autojump_threshold=0) if kind.startswith("memory") else None


@pytest.fixture
async def bus_kind(kind: str, request: pytest.FixtureRequest) -> AsyncIterator[BusKind]:
    if kind.startswith("memory"):
        durable = kind == "memory-durable"
        hub = MemoryBusHub(trio.current_time)

        def memory_bus() -> MemoryBus:
            return MemoryBus(
                hub=hub, durable=durable, presence_ttl_s=PRESENCE_TTL_S, refresh_s=REFRESH_S
            )

        @asynccontextmanager
        async def memory_peer() -> AsyncIterator[Bus]:
            yield memory_bus()

        bus = memory_bus()

        def memory_drop(instance_id: str) -> None:
            assert bus.drop(instance_id)

        yield BusKind(kind, durable, bus, memory_peer, memory_drop, hub.lapse)
        return

    prefix: str = request.getfixturevalue("redis_key_prefix")
    streams = kind.endswith("-streams")
    if kind.startswith("redis-cluster"):
        cluster: RedisClusterHandle = request.getfixturevalue("redis_cluster_session")
        url = cluster.url
        # The master of the prefix's slot holds every key and channel of this test.
        server = cluster.node_for_slot(key_slot(tagged_prefix(prefix)))
    else:
        server = request.getfixturevalue("redis_server_session")
        url = server.url

    def redis_bus(coordination: RedisCoordination) -> Bus:
        if streams:
            return StreamsBus(coordination.link, presence_ttl_s=PRESENCE_TTL_S, refresh_s=REFRESH_S)
        return PubSubBus(coordination.pubsub)

    @asynccontextmanager
    async def redis_peer() -> AsyncIterator[Bus]:
        async with RedisCoordination(url, key_prefix=prefix) as peer:
            yield redis_bus(peer)

    async with RedisCoordination(url, key_prefix=prefix) as coordination:

        def redis_drop(instance_id: str) -> None:
            if streams:
                kill_listener_connection(server, coordination, instance_id)
            else:
                # Only this test's listener is subscribed on the session server.
                assert server.raw_command("CLIENT", "KILL", "TYPE", "pubsub") == b":1\r\n"

        def redis_lapse(instance_id: str) -> None:
            server.raw_command("DEL", coordination.link.redis_key(listening_key(instance_id)))

        yield BusKind(kind, streams, redis_bus(coordination), redis_peer, redis_drop, redis_lapse)


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


async def assert_nothing_more(inbox: Subscription) -> None:
    with trio.move_on_after(0.2):
        extra = await receive(inbox, 1)
        raise AssertionError(f"unexpected {extra}")


# -- shared contract ----------------------------------------------------------------------------


async def test_an_inbox_nobody_opened_reaches_nobody(bus_kind: BusKind, clock: object) -> None:
    bus = bus_kind.bus
    assert await bus.is_listening("never") is False
    assert await bus.send("never", b"hello?") == 0
    assert await bus.is_listening("never") is False


async def test_each_senders_envelopes_arrive_in_order(bus_kind: BusKind, clock: object) -> None:
    bus = bus_kind.bus
    async with bus_kind.open_peer() as peer, bus.listen("X") as inbox:

        async def sender(name: bytes, via: Bus) -> None:
            for i in range(50):
                assert await via.send("X", b"%s %03d" % (name, i)) == 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender, b"a", bus)
            nursery.start_soon(sender, b"b", peer)
            got = await receive(inbox, 100)
    for name in (b"a", b"b"):
        assert [p for p in got if p.startswith(name)] == [b"%s %03d" % (name, i) for i in range(50)]


async def test_a_thousand_envelopes_arrive_in_order(bus_kind: BusKind, clock: object) -> None:
    bus = bus_kind.bus
    sent = [b"message %04d" % i for i in range(1000)]
    async with bus.listen("X") as inbox, trio.open_nursery() as nursery:

        async def sender() -> None:
            for payload in sent:
                assert await bus.send("X", payload) == 1

        nursery.start_soon(sender)
        assert await receive(inbox, len(sent), timeout_s=10) == sent


async def test_delivered_only_to_the_addressed_inbox(bus_kind: BusKind, clock: object) -> None:
    bus = bus_kind.bus
    async with (
        bus_kind.open_peer() as peer,
        bus.listen("X") as x_inbox,
        peer.listen("Y") as y_inbox,
    ):
        assert await peer.send("X", b"for X") == 1
        assert await bus.send("Y", b"for Y") == 1
        assert await bus.send("Z", b"for nobody") == 0
        assert await receive(x_inbox, 1) == [b"for X"]
        assert await receive(y_inbox, 1) == [b"for Y"]
        await assert_nothing_more(x_inbox)
        await assert_nothing_more(y_inbox)


async def test_is_listening_while_open_and_not_after_close(
    bus_kind: BusKind, clock: object
) -> None:
    bus = bus_kind.bus
    async with bus_kind.open_peer() as peer:
        async with bus.listen("X") as inbox:
            assert await bus.is_listening("X") is True
            assert await peer.is_listening("X") is True  # any process sees it
            # Past the presence TTL: the listener keeps itself present.
            await trio.sleep(PRESENCE_TTL_S + 2 * REFRESH_S)
            assert await peer.is_listening("X") is True
            assert await peer.send("X", b"still there") == 1
            assert await receive(inbox, 1) == [b"still there"]
        # Closed on purpose: gone at once (durable kinds withdraw their presence), not at a TTL.
        assert await peer.is_listening("X") is False
        assert await peer.send("X", b"after") == 0


async def test_payloads_arrive_byte_exact(bus_kind: BusKind, clock: object) -> None:
    bus = bus_kind.bus
    payloads = [
        b"plain",
        bytes(range(256)),
        b"\x00\r\n$-1\r\n\x00",  # looks like RESP framing
        "ünïcödé ✓".encode(),
        b"",
        random.Random(7).randbytes(1 << 20),  # 1 MiB, the envelope limit
    ]
    async with bus.listen("X") as inbox:
        for payload in payloads:
            assert await bus.send("X", payload) == 1
        got = await receive(inbox, len(payloads), timeout_s=10)
    assert [len(p) for p in got] == [len(p) for p in payloads]
    assert got == payloads


async def test_a_new_listener_gets_only_what_is_sent_after_it_opened(
    bus_kind: BusKind, clock: object
) -> None:
    # e.g. a previous process with the same instance id
    async with bus_kind.open_peer() as earlier, earlier.listen("X"):
        assert await earlier.send("X", b"old, never read") == 1
    async with bus_kind.open_peer() as later, later.listen("X") as inbox:
        assert await later.send("X", b"new") == 1
        assert await receive(inbox, 1) == [b"new"]
        await assert_nothing_more(inbox)


async def test_a_dropped_listener_raises(bus_kind: BusKind, clock: object) -> None:
    bus = bus_kind.bus
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"a") == 1
        assert await receive(inbox, 1) == [b"a"]
        bus_kind.drop("X")
        with pytest.raises(CoordinationUnavailable):
            await receive(inbox, 1)


# -- pub/sub kinds: at-most-once ------------------------------------------------------------


@only_pubsub
async def test_pubsub_loses_what_is_sent_while_nobody_listens(
    bus_kind: BusKind, clock: object
) -> None:
    bus = bus_kind.bus
    with pytest.raises(CoordinationUnavailable):
        async with bus.listen("X") as inbox:
            bus_kind.drop("X")
            await receive(inbox, 1)
    # The dropped subscriber is gone at once: nothing waits for it.
    assert await bus.is_listening("X") is False
    assert await bus.send("X", b"meanwhile") == 0
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"after") == 1
        assert await receive(inbox, 1) == [b"after"]
        await assert_nothing_more(inbox)


@only_pubsub
async def test_pubsub_loses_what_was_unread_at_close(bus_kind: BusKind, clock: object) -> None:
    bus = bus_kind.bus
    async with bus.listen("X") as inbox:
        for i in range(10):
            assert await bus.send("X", b"%d" % i) == 1
        assert await receive(inbox, 3) == [b"0", b"1", b"2"]
    async with bus.listen("X") as inbox:
        await assert_nothing_more(inbox)


# -- durable kinds: a listener that comes back loses nothing ---------------------------------


@only_durable
async def test_durable_keeps_what_is_sent_between_a_drop_and_listening_again(
    bus_kind: BusKind, clock: object
) -> None:
    bus = bus_kind.bus
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"a") == 1
        assert await receive(inbox, 1) == [b"a"]
        bus_kind.drop("X")
        with pytest.raises(CoordinationUnavailable, match="resumes after entry"):
            await receive(inbox, 1)
    # Away: the presence has not expired, so sends still land in the inbox.
    async with bus_kind.open_peer() as peer:
        for payload in (b"b", b"c", b"d"):
            assert await peer.send("X", payload) == 1
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"e") == 1
        assert await receive(inbox, 4) == [b"b", b"c", b"d", b"e"]
        await assert_nothing_more(inbox)  # and nothing twice


@only_durable
async def test_durable_presence_outlives_a_drop_until_its_ttl(
    bus_kind: BusKind, clock: object
) -> None:
    bus = bus_kind.bus
    async with bus.listen("X") as inbox:
        await trio.sleep(REFRESH_S * 2)  # refreshed at least once
        bus_kind.drop("X")
        cut_at = trio.current_time()
        with pytest.raises(CoordinationUnavailable):
            await receive(inbox, 1)
        assert trio.current_time() - cut_at < SLACK  # the reader notices at once
    # Not withdrawn: a killed process's presence lingers like this too ...
    assert await bus.is_listening("X") is True
    # ... until the TTL after its last refresh.
    with trio.fail_after(PRESENCE_TTL_S + SLACK):
        while await bus.is_listening("X"):
            await trio.sleep(0.05)
    assert trio.current_time() - cut_at > PRESENCE_TTL_S - REFRESH_S - 0.05
    assert await bus.send("X", b"too late") == 0


@only_durable
async def test_durable_resumes_after_the_last_delivered_entry(
    bus_kind: BusKind, clock: object
) -> None:
    bus = bus_kind.bus
    async with bus.listen("X") as inbox:
        for i in range(10):
            assert await bus.send("X", b"%d" % i) == 1
        assert await receive(inbox, 3) == [b"0", b"1", b"2"]  # the rest sent, not delivered
    async with bus.listen("X") as inbox:
        assert await receive(inbox, 7) == [b"%d" % i for i in range(3, 10)]
        await assert_nothing_more(inbox)


@only_durable
async def test_durable_says_whether_a_relisten_resumed_with_nothing_missing(
    bus_kind: BusKind, clock: object
) -> None:
    """Issue 13, item 10: the cluster keeps its remote tasks over a reader reconnect only when
    the bus says the re-listen resumed: quickly enough that the presence never lapsed (no
    sender was told nobody listens)."""
    bus = bus_kind.bus
    assert bus.resume_window_s == PRESENCE_TTL_S
    async with bus.listen("X") as inbox:
        assert not inbox.resumed  # a first listen resumes nothing
        bus_kind.drop("X")
        with pytest.raises(CoordinationUnavailable):
            await receive(inbox, 1)
    async with bus_kind.open_peer() as peer:
        assert await peer.send("X", b"meanwhile") == 1
    async with bus.listen("X") as inbox:
        assert inbox.resumed
        assert await receive(inbox, 1) == [b"meanwhile"]
        bus_kind.drop("X")
        with pytest.raises(CoordinationUnavailable):
            await receive(inbox, 1)
    await trio.sleep(PRESENCE_TTL_S + SLACK)  # the presence lapses: senders saw nobody
    async with bus_kind.open_peer() as peer:
        assert await peer.send("X", b"lost") == 0
    async with bus.listen("X") as inbox:
        assert not inbox.resumed
    async with bus.listen("X") as inbox:
        assert not inbox.resumed  # closed on purpose before: a fresh start, not a resume


@only_durable
async def test_durable_a_lapse_that_refused_nothing_still_resumes(
    bus_kind: BusKind, clock: object
) -> None:
    """What ``resumed`` means is that no sender was told nobody listens: a presence that
    lapsed (as in a Redis pause longer than the TTL, where every sender appends all the same)
    while nobody was refused does not stop a re-listen from resuming."""
    bus = bus_kind.bus
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"a") == 1
        assert await receive(inbox, 1) == [b"a"]
        bus_kind.drop("X")
        with pytest.raises(CoordinationUnavailable):
            await receive(inbox, 1)
    await trio.sleep(PRESENCE_TTL_S + SLACK)
    async with bus_kind.open_peer() as peer:
        assert await peer.is_listening("X") is False  # lapsed, and believed so
    async with bus.listen("X") as inbox:
        assert inbox.resumed
        assert await bus.send("X", b"b") == 1
        assert await receive(inbox, 1) == [b"b"]


@only_durable
async def test_durable_a_refusal_while_listening_ends_the_listen_unresumed(
    bus_kind: BusKind, clock: object
) -> None:
    """A live listener whose presence lapsed (a refresh held up for a TTL) while a sender
    was told nobody listens learns it at its next refresh: its inbox raises like a lost
    connection, and the re-listen is not resumed (the cluster then fails the tasks whose
    answers may have been refused, instead of waiting for them)."""
    bus = bus_kind.bus
    async with bus_kind.open_peer() as peer:
        with pytest.raises(CoordinationUnavailable, match="resumes after entry"):
            async with bus.listen("X") as inbox:
                assert await peer.send("X", b"before") == 1
                assert await receive(inbox, 1) == [b"before"]
                refused_at = None
                for _ in range(20):  # a refresh may come between the lapse and the send
                    bus_kind.lapse("X")
                    if await peer.send("X", b"refused") == 0:
                        refused_at = trio.current_time()
                        break
                assert refused_at is not None
                await receive(inbox, 1, timeout_s=REFRESH_S + SLACK + 1.0)
        assert trio.current_time() - refused_at < REFRESH_S + SLACK + 1.0
    async with bus.listen("X") as inbox:
        assert not inbox.resumed
        assert await bus.send("X", b"after") == 1
        assert await receive(inbox, 1) == [b"after"]


@only_pubsub
async def test_pubsub_never_resumes(bus_kind: BusKind, clock: object) -> None:
    bus = bus_kind.bus
    assert bus.resume_window_s == 0
    async with bus.listen("X") as inbox:
        bus_kind.drop("X")
        with pytest.raises(CoordinationUnavailable):
            await receive(inbox, 1)
    async with bus.listen("X") as inbox:
        assert not inbox.resumed
