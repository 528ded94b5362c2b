"""In-process scenarios of one real Instance in multi-instance mode, on trio's MockClock.

Regression: a task whose owner was declared dead while the assign was being published was
placed a second time with the same id (``ValueError: task id reused``), found by a simulator
sweep. It must end with 502 instead."""

from __future__ import annotations

import random

import pytest
import trio

from coordinator.coordination.memory import MemoryCoordination
from coordinator.core import registry
from coordinator.core.registry import InstanceSnapshot, NodeEntry
from coordinator.errors import NodeDisconnected
from coordinator.runtime.bus import PubSubBus
from coordinator.runtime.cluster import Cluster
from coordinator.runtime.instance import Instance
from coordinator.settings import Settings
from sim.stand_ins import SimStore


class SweptWhileSending(PubSubBus):
    """The owner sweeper runs while the assign is on the wire and fails the task; the
    publish then finds nobody listening."""

    def __init__(self, coordination: MemoryCoordination) -> None:
        super().__init__(coordination)
        self.instance: Instance | None = None
        self.assigns = 0

    async def send(self, instance_id: str, payload: bytes) -> int:
        if b'"bus.assign"' in payload:
            self.assigns += 1
            assert self.instance is not None
            await trio.sleep(0.01)
            self.instance.fail_tasks_of_dead_owners({self.instance.instance_id})
            return 0
        return await super().send(instance_id, payload)


async def announce_peer(coordination: MemoryCoordination) -> None:
    snapshot = InstanceSnapshot(
        instance_id="B",
        in_flight=0,
        nodes=[NodeEntry(node_id="n1", conn_id="c-1", models=["m"], max_parallel=4, in_flight=0)],
    )
    await coordination.set(registry.alive_key("B"), b"B", ttl_s=60)
    await coordination.set(registry.snapshot_key("B"), registry.encode_snapshot(snapshot), ttl_s=60)


async def test_task_failed_during_dispatch_is_not_placed_twice(autojump_clock) -> None:
    coordination = MemoryCoordination(trio.current_time)
    settings = Settings(instance_id="A", multi_instance=True, redis_url="memory://")
    instance = Instance(settings, SimStore(), coordination, rng=random.Random(1))  # type: ignore[arg-type]
    bus = SweptWhileSending(coordination)
    bus.instance = instance
    instance.cluster = Cluster(instance, coordination, bus)
    await announce_peer(coordination)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(instance.run)
            await trio.sleep(1.0)  # a beat: the peer's snapshot is known
            assert [v.node_id for v in instance.node_views()] == ["n1"]
            handle = await instance.start_task(
                key_id="k", model="m", prompt="p", stream=False, timeout_s=10
            )
            with pytest.raises(NodeDisconnected):
                await handle.next_event()
            await instance.end_task(handle, "node_disconnected")
            assert bus.assigns == 1
            assert len(instance.tracker) == 0
            nursery.cancel_scope.cancel()
