"""In-process scenarios of one real Instance in multi-instance mode, on trio's MockClock.

Regression: a task whose owner was declared dead while the assign was being published (and
reached nobody) was placed a second time with the same id and crashed the request
(``ValueError: task id reused``), found by a simulator sweep. Then it ended with 502 although
no node ever saw it (found by the load test after kill -9). Now it is placed again like any
assign that reached nobody: on another node, or 503 when none is left."""

from __future__ import annotations

import random

import pytest
import trio

from coordinator.coordination import keys
from coordinator.coordination.bus.base import PubSubBus
from coordinator.coordination.leases import NodeFacts
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.core import registry
from coordinator.core.registry import InstanceSnapshot, NodeEntry
from coordinator.errors import NoNodeForModel
from coordinator.runtime.instance import Instance
from coordinator.settings import Settings
from sim.stand_ins import SimStore


class SweptWhileSending(PubSubBus):
    """The owner sweeper runs while the assign to B is on the wire and fails the task; the
    publish then finds nobody listening. C receives what it is sent."""

    def __init__(self, coordination: MemoryCoordination) -> None:
        super().__init__(coordination.pubsub)
        self.instance: Instance | None = None
        self.assigns: list[str] = []
        # The peers listen on their inboxes (the sweep checks every listed peer's inbox) until
        # the scenario declares them dead.
        self.listening = {"B", "C"}

    async def is_listening(self, instance_id: str) -> bool:
        return instance_id in self.listening

    async def send(self, instance_id: str, payload: bytes) -> int:
        if b'"bus.assign"' not in payload:
            return await super().send(instance_id, payload)
        self.assigns.append(instance_id)
        if instance_id == "C":
            return 1
        assert self.instance is not None
        await trio.sleep(0.01)
        self.listening.discard("B")
        self.instance.peers_died({"B"})
        return 0


async def announce_peer(coordination: MemoryCoordination, instance_id: str, node_id: str) -> None:
    snapshot = InstanceSnapshot(
        instance_id=instance_id,
        in_flight=0,
        nodes=[
            NodeEntry(
                node_id=node_id, conn_id=f"c-{node_id}", models=["m"], max_parallel=4, in_flight=0
            )
        ],
    )
    await coordination.presence.presence_beat(
        keys.PRESENCE,
        instance_id,
        registry.encode_snapshot(snapshot),
        stall_after_s=1.0,
        forget_after_s=60,
    )
    # What the peer writes for capacity leases when its node connects.
    facts = NodeFacts(
        node_id=node_id, conn_id=f"c-{node_id}", instance_id=instance_id, max_parallel=4
    )
    await coordination.leases.put_node_facts(facts)


async def start_instance(
    nursery: trio.Nursery, peers: dict[str, str]
) -> tuple[Instance, SweptWhileSending]:
    coordination = MemoryCoordination(trio.current_time)
    settings = Settings(instance_id="A", multi_instance=True, redis_url="memory://")
    bus = SweptWhileSending(coordination)
    instance = Instance(settings, SimStore(), coordination, bus, rng=random.Random(1))  # type: ignore[arg-type]
    bus.instance = instance
    for peer, node in peers.items():
        await announce_peer(coordination, peer, node)
    await nursery.start(instance.run)
    await trio.sleep(1.0)  # a beat: the peers' snapshots are known
    return instance, bus


async def test_task_failed_during_an_unreached_dispatch_is_placed_again(autojump_clock) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            instance, bus = await start_instance(nursery, {"B": "n1", "C": "n2"})
            assert sorted(v.node_id for v in instance.machine.views()) == ["n1", "n2"]
            instance.machine.set_ratings({"n1": (5.0, 10)})  # B's node first; the retry: C
            handle = await instance.requests.start(
                key_id="k", model="m", prompt="p", stream=False, timeout_s=10
            )
            assert bus.assigns == ["B", "C"]
            assert handle.owner_instance == "C" and handle.node_id == "n2"
            assert handle.task_id in instance.machine.requester.tracker  # pending on C, not failed
            await instance.requests.end(handle, "client_gone")
            nursery.cancel_scope.cancel()


async def test_unreached_dispatch_with_no_other_node_is_503(autojump_clock) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            instance, bus = await start_instance(nursery, {"B": "n1"})
            with pytest.raises(NoNodeForModel):  # the dead peer was the only one serving "m"
                await instance.requests.start(
                    key_id="k", model="m", prompt="p", stream=False, timeout_s=10
                )
            assert bus.assigns == ["B"] and len(instance.machine.requester) == 0
            nursery.cancel_scope.cancel()


async def test_stopping_the_instance_closes_its_node_sockets(autojump_clock) -> None:
    """Each node socket is a task of the instance nursery: stopping the instance ends it, so
    the WebSocket handler that waits on it returns (and the server closes the socket)."""
    from coordinator.coordination.bus.memory import MemoryBus
    from protocol import Hello, encode
    from sim.actors import InstanceSide, SocketPair
    from sim.faults import Gate

    store = SimStore()
    token = store.enroll("n1")
    instance = Instance(
        Settings(instance_id="A"),
        store,  # type: ignore[arg-type]
        MemoryCoordination(trio.current_time),
        MemoryBus(trio.current_time),
        rng=random.Random(1),
    )
    pair = SocketPair()
    handler_returned = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as handlers:  # plays Quart's handler tasks
            instance_scope = trio.CancelScope()

            async def run_instance(task_status: trio.TaskStatus[None]) -> None:
                with instance_scope:
                    await instance.run(task_status=task_status)

            await handlers.start(run_instance)

            async def websocket_handler() -> None:
                await instance.serve_node(InstanceSide(pair, Gate()))
                handler_returned.set()

            handlers.start_soon(websocket_handler)
            await pair.node_send(encode(Hello(node_id="n1", token=token, models=["m"])).decode())
            assert '"welcome"' in await pair.node_receive()
            assert len(instance.nodes) == 1
            instance_scope.cancel()
            await handler_returned.wait()
    assert len(instance.nodes) == 0
