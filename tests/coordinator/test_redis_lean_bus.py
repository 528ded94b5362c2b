"""The lean pub/sub client (coordinator/coordination/redis/lean/), the bus's one client,
against a real redis-server (on a cluster and behind Sentinel: test_redis_cluster.py,
test_redis_sentinel.py).

* A burst of 10,000 publishes from many concurrent senders, pipelined by the one writer, reaches
  each channel's subscriber exactly once and in the order the publishes were issued.
* A connection killed under it (CLIENT KILL) is reported as a lost subscription
  (``CoordinationUnavailable``), and publishing works again on a fresh connection.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from coordinator.coordination import CoordinationUnavailable, create_coordination
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.coordination.redis.lean.subscription import LeanSubscription
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis

CHANNELS = ("inst:bus:A", "inst:bus:B", "inst:bus:C")
NOBODY = "inst:bus:nobody"
SENDERS_PER_CHANNEL = 20
PER_SENDER = 10_000 // (len(CHANNELS) * SENDERS_PER_CHANNEL) + 1  # 10,020 publishes in all


async def test_a_burst_arrives_exactly_once_in_order_per_channel(
    redis_server: RedisServer,
) -> None:
    async with (
        RedisCoordination(redis_server.url, key_prefix="t") as sender,
        RedisCoordination(redis_server.url, key_prefix="t") as receiver,
        trio.open_nursery() as nursery,
    ):
        received: dict[str, list[bytes]] = {channel: [] for channel in CHANNELS}
        expected = SENDERS_PER_CHANNEL * PER_SENDER

        async def read(channel: str, task_status: trio.TaskStatus[None]) -> None:
            async with receiver.pubsub.subscribe(channel) as inbox:
                task_status.started()
                async for payload in inbox:
                    received[channel].append(payload)
                    if len(received[channel]) == expected:
                        return

        for channel in CHANNELS:
            await nursery.start(read, channel)
        # How many subscribers each publish reached; "inst:bus:nobody" has none, so a reply
        # handed to the wrong caller shows.
        reached: dict[str, list[int]] = {channel: [] for channel in (*CHANNELS, NOBODY)}
        # Per channel, the order in which publish was called: numbered with no checkpoint
        # between taking the number and calling, so it is the order the calls were issued in,
        # whichever of the concurrent senders issued them.
        issued = dict.fromkeys((*CHANNELS, NOBODY), 0)

        async def send(channel: str, who: int) -> None:
            for _ in range(PER_SENDER):
                number = issued[channel]
                issued[channel] = number + 1
                payload = b"%s %d" % (channel.encode(), number)
                reached[channel].append(await sender.pubsub.publish(channel, payload))

        # Order is kept among publishes issued on an open connection (while the first one is
        # opened, senders queue for it and may be let in in any order, each in its own order).
        assert await sender.pubsub.publish("warm-up", b"") == 0
        with trio.fail_after(60):
            async with trio.open_nursery() as senders:
                for channel in (*CHANNELS, NOBODY):
                    for who in range(SENDERS_PER_CHANNEL):
                        senders.start_soon(send, channel, who)
            assert reached == {
                **{channel: [1] * expected for channel in CHANNELS},
                NOBODY: [0] * expected,
            }
            while any(len(got) < expected for got in received.values()):
                await trio.sleep(0.01)
        await trio.sleep(0.1)  # nothing more may come (a duplicate would land here)
        for channel, got in received.items():
            names = {payload.split()[0].decode() for payload in got}
            assert names == {channel}  # only the addressed channel
            # Exactly once and in the order issued: every number, each once, ascending.
            assert [int(payload.split()[1]) for payload in got] == list(range(expected))
        publisher = sender.link.lean._pipeline
        assert publisher is not None
        # Pipelined: the burst went out in far fewer writes than commands.
        assert publisher.commands_sent == expected * (len(CHANNELS) + 1) + 1  # + warm-up
        assert publisher.writes * 5 < publisher.commands_sent
        nursery.cancel_scope.cancel()


def _kill(server: RedisServer, client_type: str) -> int:
    reply = server.raw_command("CLIENT", "KILL", "TYPE", client_type)
    assert reply.startswith(b":"), reply
    return int(reply[1:])


async def test_a_killed_subscription_is_reported_lost(redis_server: RedisServer) -> None:
    server = redis_server
    async with RedisCoordination(server.url, key_prefix="t") as c:
        async with c.pubsub.subscribe("inst:bus:A") as inbox:
            assert await c.pubsub.publish("inst:bus:A", b"before") == 1
            got: list[bytes] = []
            with pytest.raises(CoordinationUnavailable) as caught, trio.fail_after(3):
                async for payload in inbox:
                    got.append(payload)
                    assert _kill(server, "pubsub") == 1
            assert got == [b"before"]
        assert await c.pubsub.subscriber_count("inst:bus:A") == 0
    # The message the coredis client gave, word for word (operators' alerts match it).
    assert str(caught.value) == (
        "lost the Redis subscription to 'inst:bus:A'; messages may be lost"
    )


async def test_publishing_recovers_from_a_killed_connection(redis_server: RedisServer) -> None:
    async with (
        RedisCoordination(redis_server.url, key_prefix="t") as c,
        c.pubsub.subscribe("inst:bus:A") as inbox,
    ):
        assert await c.pubsub.publish("inst:bus:A", b"1") == 1
        assert (
            _kill(redis_server, "normal") >= 1
        )  # the publishing connection(s), not the subscriber
        # Right after the kill a publish either already goes out on a fresh connection or
        # reports the loss; never a raw error, never a hang.
        with trio.fail_after(2):
            try:
                first = await c.pubsub.publish("inst:bus:A", b"2")
            except CoordinationUnavailable:
                first = None
            second = await c.pubsub.publish("inst:bus:A", b"3")
        assert first in (1, None) and second == 1
        want = [b"1", b"2", b"3"] if first else [b"1", b"3"]
        got: list[bytes] = []
        with trio.fail_after(2):
            async for payload in inbox:
                got.append(payload)
                if len(got) == len(want):
                    break
        assert got == want


async def _refusal(url: str, password: str, prefix: str) -> tuple[str, str]:
    """What PUBLISH and SUBSCRIBE raise for this identity."""
    async with RedisCoordination(url, key_prefix=prefix, password=password) as c:
        with pytest.raises(CoordinationUnavailable) as published:
            await c.pubsub.publish("inst:bus:A", b"x")
        with pytest.raises(CoordinationUnavailable) as subscribed:
            async with c.pubsub.subscribe("inst:bus:A"):
                pass
    return str(published.value), str(subscribed.value)


async def test_refused_identities_get_the_same_hints(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory(password="admin-secret")
    # A user whose channels are gn:* only (as `gemmanet redis-acl` makes them).
    server.raw_command(
        "ACL", "SETUSER", "bus-user", "on", ">bus-secret", "~gn:*", "&gn:*", "-@all",
        "+auth", "+ping", "+publish", "+subscribe", "+unsubscribe",
    )  # fmt: skip
    user_url = server.url.replace("redis://", "redis://bus-user@")
    for report in await _refusal(user_url, "wrong", "gn"):
        assert "(WRONGPASS: check the user name" in report, report
    published, subscribed = await _refusal(user_url, "bus-secret", "elsewhere")
    assert "(NOPERM: the ACL user lacks this right" in published, published
    assert "(NOPERM: the ACL user lacks this right" in subscribed, subscribed
    # The same identity on its own channels works.
    async with (
        RedisCoordination(user_url, password="bus-secret") as c,
        c.pubsub.subscribe("inst:bus:A") as inbox,
    ):
        assert await c.pubsub.publish("inst:bus:A", b"allowed") == 1
        with trio.fail_after(2):
            async for payload in inbox:
                assert payload == b"allowed"
                break


async def test_the_coordination_takes_the_lean_client(redis_server: RedisServer) -> None:
    """Through ``create_coordination`` (what ``gemmanet serve`` opens): the bus is the lean
    client, the only one."""
    coord = create_coordination(redis_server.url, key_prefix="t")
    assert isinstance(coord, RedisCoordination)
    async with coord, coord.pubsub.subscribe("inst:bus:A") as inbox:
        assert await coord.pubsub.publish("inst:bus:A", b"x") == 1
        assert coord.link.lean._pipeline is not None
        assert isinstance(inbox, LeanSubscription)
