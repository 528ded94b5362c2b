"""A refusal that overtakes its own dispatch: the owner (here B, draining) refuses the assign
and its answer is read before the bus has confirmed the send. The request is placed again in
the background (on C) and must follow it there, not fail with ``502 could not be placed``
(found by tests/e2e/test_rolling_restart.py before ``_placed_meanwhile``)."""

from __future__ import annotations

import random

import trio

from coordinator.coordination.bus.base import PubSubBus
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.runtime.instance import Instance
from coordinator.settings import Settings
from protocol import BusAssign, BusRefused, TaskErrorCode, decode_bus
from sim.stand_ins import SimStore
from tests.coordinator.test_instance_dispatch import announce_peer


class RefusedBeforeTheSendReturns(PubSubBus):
    def __init__(self, coordination: MemoryCoordination) -> None:
        super().__init__(coordination.pubsub)
        self.instance: Instance | None = None
        self.assigns: list[str] = []

    async def is_listening(self, instance_id: str) -> bool:
        return instance_id in ("B", "C")  # the peers listen; our own id is free

    async def send(self, instance_id: str, payload: bytes) -> int:
        if b'"bus.assign"' not in payload:
            return await super().send(instance_id, payload)
        self.assigns.append(instance_id)
        if instance_id == "B":
            assign = decode_bus(payload)
            assert isinstance(assign, BusAssign) and self.instance is not None
            refusal = BusRefused(
                task_id=assign.task_id,
                node_id=assign.node_id,
                conn_id=assign.conn_id,
                code=TaskErrorCode.NODE_DRAINING,
                message="moving",
            )
            inst = self.instance
            # Read now; the placing again it starts runs in the background, after this send
            # has returned (the PUBLISH reply comes first).
            inst.apply(inst.machine.bus_envelope(refusal, inst.clock()))
        return 1


async def test_a_refusal_read_before_the_dispatch_returned_is_followed(autojump_clock) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            coordination = MemoryCoordination(trio.current_time)
            settings = Settings(instance_id="A", multi_instance=True, redis_url="memory://")
            bus = RefusedBeforeTheSendReturns(coordination)
            instance = Instance(settings, SimStore(), coordination, bus, rng=random.Random(1))  # type: ignore[arg-type]
            bus.instance = instance
            for peer, node in {"B": "n1", "C": "n2"}.items():
                await announce_peer(coordination, peer, node)
            await nursery.start(instance.run)
            await trio.sleep(1.0)  # a beat: the peers' snapshots are known
            instance.machine.set_ratings({"n1": (5.0, 10)})  # B's node first
            handle = await instance.requests.start(
                key_id="k", model="m", prompt="p", stream=False, timeout_s=10
            )
            assert bus.assigns == ["B", "C"]
            assert handle.owner_instance == "C" and handle.node_id == "n2"
            await instance.requests.end(handle, "client_gone")
            nursery.cancel_scope.cancel()
