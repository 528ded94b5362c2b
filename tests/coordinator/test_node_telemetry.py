"""The owner's side of heartbeat telemetry (``runtime/nodes/telemetry.py``) over the memory
backend: junk is counted and never stored, and however fast a node sends, at most one sample
per node is written per interval (the newest of it).

The test runs on pytest-trio's virtual clock (``autojump_clock``): in real time a loaded machine
stretched the half-second of offers, so the number of writes varied with the load."""

from __future__ import annotations

import msgspec
import trio

from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.runtime.nodes.telemetry import NodeTelemetry
from protocol.telemetry import TelemetrySample, encode_sample, parse_sample


def raw(at: float) -> msgspec.Raw:
    return msgspec.Raw(encode_sample(TelemetrySample(at=at, cpu_busy=0.5)))


async def test_writes_are_paced_and_junk_is_dropped(autojump_clock: trio.abc.Clock) -> None:
    async with MemoryCoordination(trio.current_time) as coordination:
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
        # Writes at 0, 0.2, 0.4 and 0.6 s: the first sample at once, then the newest of each
        # interval, the last one after the offers stopped.
        stamps = [s.at for s in map(parse_sample, stored) if s is not None]
        assert len(stamps) == len(stored) == 4, stamps
        assert stamps == sorted(stamps) and stamps[0] == 1000.0 and stamps[-1] == 1049.0
        assert await store.telemetry_history("evil") == []
        assert await store.telemetry_history("quiet") == []
        assert telemetry.rejected == 50
        assert await telemetry.latest(["fast", "evil"]) == {
            "fast": TelemetrySample(at=1049.0, cpu_busy=0.5)
        }
