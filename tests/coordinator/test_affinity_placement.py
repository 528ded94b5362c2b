"""Prefix affinity end to end in one real Instance (memory backend, trio's MockClock, two
nodes on in-process sockets): the second turn of a conversation goes to the node that answered
the first even when the load ranking prefers the other node, and does not when that node is
full — the lease, not the prediction, decides who has room, even with a prefix weight that
ranks the full node first."""

from __future__ import annotations

import random

import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.bus.memory import MemoryBus
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.runtime.instance import Instance
from coordinator.runtime.requests.task_handle import TaskHandle
from coordinator.settings import Settings
from protocol import Assign, Heartbeat, Hello, Message, Result, decode_node, encode
from sim.actors import InstanceSide, SocketPair
from sim.faults import Gate
from sim.stand_ins import SimStore

SYSTEM = Message(role="system", content="You answer questions about the weather. " * 20)


class OneSlotNode:
    """A node with one slot that answers each task at once, or when ``hold`` is set, only
    once it is cleared."""

    def __init__(self, node_id: str, token: str) -> None:
        self.node_id, self.token = node_id, token
        self.pair = SocketPair()
        self.ran: list[str] = []
        self.hold = False
        self.released = trio.Event()

    async def run(self, instance: Instance) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(instance.serve_node, InstanceSide(self.pair, Gate()))
            hello = Hello(node_id=self.node_id, token=self.token, models=["m"], max_parallel=1)
            await self.pair.node_send(encode(hello).decode())
            assert '"welcome"' in await self.pair.node_receive()
            nursery.start_soon(self._beat)
            while True:
                envelope = decode_node(await self.pair.node_receive())
                if isinstance(envelope, Assign):
                    self.ran.append(envelope.task_id)
                    nursery.start_soon(self._answer, envelope.task_id, self.hold)

    async def _beat(self) -> None:
        while True:
            await trio.sleep(1.0)
            await self.pair.node_send(encode(Heartbeat(in_flight=0)).decode())

    async def _answer(self, task_id: str, held: bool) -> None:
        if held:
            await self.released.wait()
        result = Result(task_id=task_id, output=f"answer from {self.node_id}")
        await self.pair.node_send(encode(result).decode())


async def ask(instance: Instance, messages: list[Message]) -> tuple[TaskHandle, str]:
    handle = await instance.requests.start(
        key_id="k", model="m", messages=messages, stream=False, timeout_s=60
    )
    done = await handle.result()
    await instance.requests.end(handle, "ok")
    return handle, done.output


async def test_the_next_turn_follows_the_prefix_unless_its_node_is_full(autojump_clock) -> None:
    store = SimStore()
    # A prefix weight that ranks even a full-looking node holding the prefix first.
    settings = Settings(instance_id="A", affinity_prefix_weight=10.0)
    coordination = MemoryCoordination(trio.current_time)
    instance = Instance(
        settings, store, coordination, MemoryBus(trio.current_time), rng=random.Random(1)
    )  # type: ignore[arg-type]
    n1, n2 = (OneSlotNode(n, store.enroll(n)) for n in ("n1", "n2"))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(instance.run)
            nursery.start_soon(n1.run, instance)
            nursery.start_soon(n2.run, instance)
            await trio.sleep(1.0)  # both connected, their facts written
            instance.machine.set_ratings({"n1": (5.0, 10)})
            turn = [SYSTEM, Message(role="user", content="Will it rain in Lyon today? " * 10)]
            first, answer = await ask(instance, turn)
            assert first.node_id == "n1"
            await trio.sleep(0.1)  # the record is written off the answer's path

            # Load alone now prefers n2 (both idle, n2 rated best): the prefix goes to n1.
            instance.machine.set_ratings({"n2": (5.0, 10)})
            turn += [
                Message(role="assistant", content=answer),
                Message(role="user", content="And tomorrow?"),
            ]
            second, answer = await ask(instance, turn)
            assert second.node_id == "n1"
            await trio.sleep(0.1)

            # Another conversation takes n1's only slot and keeps it.
            instance.machine.set_ratings({"n1": (5.0, 10)})
            n1.hold = True
            other = await instance.requests.start(
                key_id="k", model="m", prompt="something else", stream=False, timeout_s=60
            )
            assert other.node_id == "n1"
            turn += [
                Message(role="assistant", content=answer),
                Message(role="user", content="And the day after?"),
            ]
            third, _ = await ask(instance, turn)
            assert third.node_id == "n2"  # n1 is full: no lease there, whatever it holds

            n1.released.set()
            await other.result()
            await instance.requests.end(other, "ok")
            assert n1.ran == [first.task_id, second.task_id, other.task_id]
            assert n2.ran == [third.task_id]
            counts = instance.affinity.counts
            assert (counts.hits, counts.misses, counts.unavailable) == (1, 3, 0)
            nursery.cancel_scope.cancel()


class BrokenAffinity:
    """The prefix affinity role of a store that hangs on lookups (``hang``) or refuses them,
    and refuses every record."""

    def __init__(self, *, hang: bool) -> None:
        self.hang = hang
        self.records = 0

    async def prefix_holders(self, model: str, hashes: object) -> list[list[str]]:
        if self.hang:
            await trio.sleep_forever()
        raise CoordinationUnavailable("the store is down")

    async def record_prefix(self, *args: object, **kwargs: object) -> None:
        self.records += 1
        raise CoordinationUnavailable("the store is down")


async def test_a_slow_or_failing_affinity_store_never_fails_a_request(autojump_clock) -> None:
    for hang in (True, False):
        store = SimStore()
        coordination = MemoryCoordination(trio.current_time)
        broken = BrokenAffinity(hang=hang)
        coordination.affinity = broken  # type: ignore[assignment]
        instance = Instance(
            Settings(instance_id="A"),
            store,  # type: ignore[arg-type]
            coordination,
            MemoryBus(trio.current_time),
            rng=random.Random(1),
        )
        node = OneSlotNode("n1", store.enroll("n1"))
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(instance.run)
                nursery.start_soon(node.run, instance)
                await trio.sleep(1.0)
                turn = [SYSTEM, Message(role="user", content="Is it sunny? " * 30)]
                for _ in range(2):
                    began = trio.current_time()
                    handle, _answer = await ask(instance, turn)
                    assert handle.node_id == "n1"
                    # At most the lookup's bound was spent waiting for the store.
                    assert (
                        trio.current_time() - began <= Settings().affinity_lookup_timeout_s + 0.01
                    )
                await trio.sleep(0.1)
                assert instance.affinity.counts.unavailable == 2
                assert broken.records == 2  # tried, failed, dropped
                nursery.cancel_scope.cancel()
