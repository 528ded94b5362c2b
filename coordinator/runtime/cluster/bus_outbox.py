"""Envelopes waiting to go out on the instance bus.

Senders never block: ``send`` queues and returns. A few ordered lanes drain the queue; a task's
envelopes always take the same lane, so its chunks and result arrive in order. A send that fails
because Redis is briefly away is retried until the envelope's own deadline (the task is over by
then); a send that reaches nobody calls ``on_unreached`` (the addressed instance is gone)."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.bus.base import Bus
from coordinator.runtime.metrics import Metrics
from protocol import encode

log = logging.getLogger("gemmanet.bus")

LANES = 4
RETRY_S = 0.2
LANE_CAPACITY = 10_000


@dataclass(frozen=True, slots=True)
class _Outgoing:
    target: str
    payload: bytes
    give_up_at: float
    on_unreached: Callable[[], None] | None


class BusOutbox:
    def __init__(self, bus: Bus, clock: Callable[[], float], metrics: Metrics) -> None:
        self._bus, self._clock = bus, clock
        self._metrics = metrics
        self._lanes = [trio.open_memory_channel[_Outgoing](LANE_CAPACITY) for _ in range(LANES)]
        self.dropped_full = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for _, receive in self._lanes:
                nursery.start_soon(self._drain, receive)
            task_status.started()

    def send(
        self,
        target: str,
        envelope: msgspec.Struct,
        *,
        give_up_in: float = 5.0,
        give_up_at: float | None = None,
        on_unreached: Callable[[], None] | None = None,
    ) -> None:
        if give_up_at is None:
            give_up_at = self._clock() + give_up_in
        # A task's envelopes share a lane so they stay in order (a node's, when not per task).
        task_id = getattr(envelope, "task_id", None)
        key = str(task_id) if task_id else str(getattr(envelope, "node_id", ""))
        lane = zlib.crc32(key.encode()) % LANES
        try:
            self._lanes[lane][0].send_nowait(
                _Outgoing(target, encode(envelope), give_up_at, on_unreached)
            )
        except trio.WouldBlock:
            self.dropped_full += 1
            self._metrics.bus_dropped.labels(reason="outbox_full").inc()
            log.error("bus outbox full; dropped an envelope to %s", target)

    async def _drain(self, receive: trio.MemoryReceiveChannel[_Outgoing]) -> None:
        async for item in receive:
            while True:
                try:
                    reached = await self._bus.send(item.target, item.payload)
                except CoordinationUnavailable:
                    if self._clock() >= item.give_up_at:
                        self._metrics.bus_dropped.labels(reason="gave_up").inc()
                        break
                    await trio.sleep(RETRY_S)
                    continue
                self._metrics.bus_sent.inc()
                if reached == 0:
                    self._metrics.bus_dropped.labels(reason="unreached").inc()
                    if item.on_unreached is not None:
                        item.on_unreached()
                break
