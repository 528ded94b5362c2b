"""The owner's side of heartbeat telemetry (``runtime/node_telemetry.py``) over the memory
backend, in real time: junk is counted and never stored, and however fast a node sends,
at most one sample per node is written per interval (the newest of it)."""

from __future__ import annotations

import msgspec
import trio

from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.runtime.nodes.telemetry import NodeTelemetry
from protocol.telemetry import TelemetrySample, encode_sample, parse_sample


def raw(at: float) -> msgspec.Raw:
    return msgspec.Raw(encode_sample(TelemetrySample(at=at, cpu_busy=0.5)))


async def test_writes_are_paced_and_junk_is_dropped() -> None:
    async with MemoryCoordination() as coordination:
        store = coordination.telemetry
        telemetry = NodeTelemetry(store, interval_s=0.2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(telemetry.run)
            for i in range(50):  # a sample every 10 ms for half a second
                telemetry.offer("fast", raw(1000.0 + i))
                telemetry.offer("evil", msgspec.Raw(b'{"at": 1, "cpu_busy": 99}'))
                telemetry.offer("quiet", msgspec.UNSET)
                await trio.sleep(0.01)
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
        stored = await store.telemetry_history("fast")
        assert 2 <= len(stored) <= 4, len(stored)
        stamps = [s.at for s in map(parse_sample, stored) if s is not None]
        assert stamps == sorted(stamps) and stamps[-1] == 1049.0  # the newest one wins
        assert await store.telemetry_history("evil") == []
        assert await store.telemetry_history("quiet") == []
        assert telemetry.rejected == 50
        assert await telemetry.latest(["fast", "evil"]) == {
            "fast": TelemetrySample(at=1049.0, cpu_busy=0.5)
        }
