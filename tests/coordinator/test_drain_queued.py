"""A request waiting in the admission queue when a drain's window ends is refused then with
``instance_shutting_down`` (docs/operations.md), not at its queue timeout: one Instance on the
memory store, its only node's one slot held by another request, on a mock clock."""

from __future__ import annotations

import random

import pytest
import trio
import trio.lowlevel

from coordinator.coordination import keys
from coordinator.coordination.bus.base import PubSubBus
from coordinator.coordination.leases import LeaseAsk, NodeFacts
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.core import registry
from coordinator.core.registry import InstanceSnapshot, NodeEntry
from coordinator.errors import InstanceShuttingDown
from coordinator.runtime.instance import Instance
from coordinator.settings import Settings
from sim.stand_ins import SimStore

WINDOW_S = 3.0
QUEUE_TIMEOUT_S = 60.0


class PeerListens(PubSubBus):
    """Peer B listens, and an assign sent to it is taken as delivered (B itself is only its
    beats and its node's facts here)."""

    async def is_listening(self, instance_id: str) -> bool:
        return instance_id == "B"

    async def send(self, instance_id: str, payload: bytes) -> int:
        if instance_id == "B" and b'"bus.assign"' in payload:
            return 1
        return await super().send(instance_id, payload)


async def beat_as_b(coordination: MemoryCoordination, max_parallel: int = 1) -> None:
    """Peer B, alive, with its node n1."""
    node = NodeEntry(
        node_id="n1", conn_id="c-n1", models=["m"], max_parallel=max_parallel, in_flight=1
    )
    data = registry.encode_snapshot(InstanceSnapshot(instance_id="B", in_flight=1, nodes=[node]))
    while True:
        await coordination.presence.presence_beat(
            keys.PRESENCE, "B", data, stall_after_s=1.0, forget_after_s=600
        )
        await trio.sleep(0.5)


async def full_peer_node(
    coordination: MemoryCoordination, rules: object, max_parallel: int = 1
) -> None:
    """B's node's facts, one of its slots taken by a request of B's."""
    facts = NodeFacts(node_id="n1", conn_id="c-n1", instance_id="B", max_parallel=max_parallel)
    await coordination.leases.put_node_facts(facts)
    held = LeaseAsk(
        request_id="t-other",
        instance_id="B",
        key_id="k2",
        model="m",
        model_gb=0.0,
        kv_gb=0.0,
        candidates=(("n1", "c-n1"),),
        lease_id="l-other",
        queue_entry_ttl_s=600.0,
    )
    granted = await coordination.leases.admit(held, rules)  # type: ignore[arg-type]
    assert granted.outcome == "granted"


async def test_a_queued_request_is_refused_when_the_drain_window_ends(autojump_clock) -> None:
    with trio.fail_after(QUEUE_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            coordination = MemoryCoordination(trio.current_time)
            settings = Settings(
                instance_id="A",
                multi_instance=True,
                redis_url="memory://",
                drain_s=WINDOW_S,
                queue_timeout_s=QUEUE_TIMEOUT_S,
            )
            bus = PeerListens(coordination.pubsub)
            instance = Instance(settings, SimStore(), coordination, bus, rng=random.Random(1))  # type: ignore[arg-type]
            nursery.start_soon(beat_as_b, coordination)
            await trio.lowlevel.checkpoint()
            await full_peer_node(coordination, instance.admissions.rules)
            await nursery.start(instance.run)
            await trio.sleep(1.0)  # a beat: B's snapshot is known

            async def drain_soon() -> None:
                await trio.sleep(1.0)  # the request is queued by then
                assert instance.admissions.queued() == {"m": 1}
                instance.drain.begin()
                await instance.drain.run()

            nursery.start_soon(drain_soon)
            began = trio.current_time()
            with pytest.raises(InstanceShuttingDown):
                await instance.requests.start(
                    key_id="k", model="m", prompt="p", stream=False, timeout_s=None
                )
            waited = trio.current_time() - began
            # Refused at the window's end (begun 1 s in), long before the queue timeout.
            assert 1.0 + WINDOW_S - 0.5 <= waited <= 1.0 + WINDOW_S + 1.0, waited
            assert instance.admissions.queued() == {}
            nursery.cancel_scope.cancel()
