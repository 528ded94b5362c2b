"""What only the in-process ``MemoryBus`` has (the shared contract is test_bus_contract.py):
the simulator's hooks (``kill``, ``before_io``), its bounds, and the ``create_bus`` factory."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from coordinator.coordination import CoordinationUnavailable, MemoryCoordination
from coordinator.coordination.bus.base import PubSubBus
from coordinator.coordination.bus.memory import MemoryBus, MemoryBusHub
from coordinator.coordination.factory import create_bus


async def test_a_killed_durable_listener_stays_present_until_its_ttl(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = MemoryBusHub()
    victim, peer = MemoryBus(hub=hub, durable=True), MemoryBus(hub=hub, durable=True)
    with trio.CancelScope() as process:
        async with victim.listen("X"):
            victim.kill()
            process.cancel()  # like kill -9: no cleanup runs
            await trio.sleep_forever()
    killed_at = trio.current_time()
    # No refresh any more, no withdrawal: senders still append until the TTL runs out.
    assert await peer.send("X", b"lands") == 1
    await trio.sleep(victim.presence_ttl_s - 0.01)
    assert await peer.is_listening("X") is True
    await trio.sleep(0.02)
    assert await peer.is_listening("X") is False
    assert trio.current_time() - killed_at == pytest.approx(victim.presence_ttl_s, abs=0.02)


async def test_a_killed_pubsub_listener_leaves_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = MemoryBusHub()
    victim, peer = MemoryBus(hub=hub), MemoryBus(hub=hub)
    with trio.CancelScope() as process:
        async with victim.listen("X"):
            victim.kill()
            process.cancel()
            await trio.sleep_forever()
    assert await peer.is_listening("X") is False
    assert await peer.send("X", b"lost") == 0


async def test_before_io_gates_every_store_call(autojump_clock: trio.testing.MockClock) -> None:
    down = False
    calls = 0

    async def store() -> None:
        nonlocal calls
        calls += 1
        if down:
            raise CoordinationUnavailable("simulated outage")

    hub = MemoryBusHub()
    bus = MemoryBus(hub=hub, durable=True, before_io=store)
    async with bus.listen("X") as inbox:
        assert await bus.send("X", b"up") == 1
        assert [p async for p in _take(inbox, 1)] == [b"up"]
        down = True
        with pytest.raises(CoordinationUnavailable):
            await bus.send("X", b"down")
        with pytest.raises(CoordinationUnavailable):
            await bus.is_listening("X")
        # The refresher fails too, so the presence lapses as it would with Redis away.
        await trio.sleep(bus.presence_ttl_s + bus.refresh_s)
        assert hub.present("X") is False  # (read past the hook)
        down = False
        await trio.sleep(bus.refresh_s * 1.5)  # the next refresh brings it back
        assert await bus.is_listening("X") is True
    assert calls > 6


async def test_durable_inbox_is_bounded_and_expires(autojump_clock: trio.testing.MockClock) -> None:
    hub = MemoryBusHub()
    bus = MemoryBus(hub=hub, durable=True, maxlen=100, retention_s=10.0)
    async with bus.listen("X") as inbox:
        for i in range(250):
            assert await bus.send("X", b"%d" % i) == 1
        assert hub.size()["entries"] == 100
        # The oldest were trimmed before anybody read them, as with MAXLEN.
        assert [p async for p in _take(inbox, 1)] == [b"150"]
    await trio.sleep(10.0)
    assert hub.size() == {
        "listeners": 0,
        "streams": 0,
        "entries": 0,
        "presences": 0,
        "waiters": 0,
    }


async def test_create_bus_picks_the_implementation() -> None:
    async with MemoryCoordination() as coordination:
        assert isinstance(create_bus("pubsub", coordination), PubSubBus)
        with pytest.raises(TypeError, match="needs the Redis"):
            create_bus("streams", coordination)
        hub = MemoryBusHub()
        memory = create_bus("streams", coordination, memory_hub=hub)
        assert isinstance(memory, MemoryBus) and memory.durable and memory.hub is hub
        assert not create_bus("pubsub", coordination, memory_hub=hub).durable  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="unknown bus"):
            create_bus("carrier-pigeon", coordination)


async def _take(inbox: object, n: int):  # type: ignore[no-untyped-def]
    with trio.fail_after(5):
        async for payload in inbox:  # type: ignore[attr-defined]
            yield payload
            n -= 1
            if n == 0:
                return


async def test_a_durable_relisten_after_trimming_past_the_last_entry_read_is_not_resumed() -> None:
    hub = MemoryBusHub(trio.current_time)
    bus, peer = (MemoryBus(hub=hub, durable=True, maxlen=2) for _ in range(2))
    for sent_meanwhile, resumed in ((1, True), (3, False)):
        async with bus.listen("X") as inbox:
            assert await peer.send("X", b"read") == 1
            async for payload in inbox:
                assert payload == b"read"
                break
            assert bus.drop("X")
            with pytest.raises(CoordinationUnavailable):
                await inbox.__aiter__().__anext__()
        for i in range(sent_meanwhile):
            assert await peer.send("X", b"%d" % i) == 1
        async with bus.listen("X") as inbox:
            # maxlen 2: one entry sent meanwhile keeps all; three drop one never read.
            assert inbox.resumed is resumed
        hub = MemoryBusHub(trio.current_time)
        bus, peer = (MemoryBus(hub=hub, durable=True, maxlen=2) for _ in range(2))
