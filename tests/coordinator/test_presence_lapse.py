"""After this instance's presence lapsed (peers may have declared it dead), it re-checks the
ownership of all its nodes in one batched round trip (coordinator/runtime/cluster/supervision.py). One
round trip per node, inside the beat, kept a 3,334-node instance from its next beat for
seconds, so the lapse fed itself (seen in the 10,000-node scale benchmark)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import trio

from coordinator.coordination import keys
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.coordination.memory.roles import MemoryKeyValue
from coordinator.core import registry
from coordinator.core.effects import Effect
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.runtime.cluster.ownership import Ownership
from coordinator.runtime.cluster.supervision import Supervisor
from coordinator.settings import Settings


class CountingCoordination(MemoryKeyValue):
    """Counts the operations the instance asks for: against Redis each is one round trip (a
    batch too); this in-memory store carries out a batch key by key, which is not counted."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(MemoryCoordination(clock).link)
        self.calls: list[str] = []
        self._in_batch = False

    async def refresh_many(self, expected: Sequence[tuple[str, bytes]], ttl_s: float) -> list[bool]:
        self.calls.append("refresh_many")
        self._in_batch = True
        try:
            return await super().refresh_many(expected, ttl_s)
        finally:
            self._in_batch = False

    async def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        if not self._in_batch:
            self.calls.append("refresh_if")
        return await super().refresh_if(key, expected, ttl_s)

    async def compare_and_set(
        self, key: str, expected: bytes | None, new: bytes | None, *, ttl_s: float | None = None
    ) -> bool:
        self.calls.append("compare_and_set")
        return await super().compare_and_set(key, expected, new, ttl_s=ttl_s)

    async def get(self, key: str) -> bytes | None:
        self.calls.append("get")
        return await super().get(key)


class LapsedInstance:
    """The parts of an instance the supervisor uses after a lapse, with a real machine and real
    ownership records."""

    def __init__(self, coordination: CountingCoordination) -> None:
        self.instance_id = "A"
        self.settings = Settings(instance_id="A", multi_instance=True, redis_url="memory://")
        self.machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(1))
        self.ownership = Ownership(coordination, "A", ttl_s=15.0)
        self.clock = trio.current_time
        self.lost: list[str] = []

    @property
    def nodes(self) -> NodeTable:
        return self.machine.owner.nodes

    def apply(self, effects: list[Effect]) -> None:
        pass

    def node_owned_elsewhere(self, conn: NodeConnection) -> None:
        self.lost.append(conn.node_id)


def connection(name: str) -> NodeConnection:
    return NodeConnection(conn_id=f"c-{name}", node_id=name, models=frozenset({"m"}),
                          max_parallel=1, vram_gb=None, agent_version="", connected_at=0.0,
                          last_seen=0.0)  # fmt: skip


async def test_a_lapse_rechecks_every_node_in_one_round_trip() -> None:
    coordination = CountingCoordination(trio.current_time)
    instance = LapsedInstance(coordination)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(instance.ownership.run)
        for i in range(200):
            conn = connection(f"n{i}")
            instance.machine.node_connected(conn, 0.0)
            await instance.ownership.claim(conn)
        # while we were gone, another instance took n7 over
        await coordination.swap_many(
            [(keys.owner_key("n7"), registry.owner_value("B", "c-elsewhere"))],
            ttl_s=15.0,
            bump=keys.OWNERS_CHANGED,
        )
        coordination.calls.clear()
        await Supervisor(instance).after_presence_lapsed()  # type: ignore[arg-type]
        nursery.cancel_scope.cancel()
    assert instance.lost == ["n7"]
    # one batched refresh; for the one record it could not refresh, a claim-back and a read
    assert coordination.calls == ["refresh_many", "compare_and_set", "get"]
