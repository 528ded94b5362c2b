"""What a node agent tells its coordinator between tasks: a heartbeat every interval (in-flight
count, resident models, host telemetry, the backend's state), and one at once when the backend
goes down or answers again."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import trio

from protocol import Heartbeat
from protocol.telemetry import TelemetrySample, encode_sample
from tools.node_agent.backends import Backend
from tools.node_agent.connection import Outbound
from tools.node_agent.health import BackendHealth

__all__ = ["Heartbeats"]


class Heartbeats:
    def __init__(
        self,
        backend: Backend,
        health: BackendHealth,
        models: tuple[str, ...],
        *,
        in_flight: Callable[[], int],
        telemetry: Callable[[], TelemetrySample | None] | None,
    ) -> None:
        self._backend = backend
        self._health = health
        self._models = models
        self._in_flight = in_flight
        # The host's latest telemetry sample, sent in every heartbeat (None: send none).
        self._telemetry = telemetry
        #: the heartbeat interval of the current connection (its welcome's, or what the
        #: coordinator asked for since)
        self.interval = 2.0
        #: the backend's state as the coordinator last heard it from us (hello or heartbeat)
        self.said_down: str | None = None

    async def send_every_interval(self, outbox: trio.MemorySendChannel[Outbound]) -> None:
        while True:
            interval = self.interval
            await trio.sleep(interval)
            resident = None
            with trio.move_on_after(interval / 2):
                resident = await self._backend.resident(self._models)
            await outbox.send(self.heartbeat(resident))

    def heartbeat(self, resident: list[str] | None) -> Heartbeat:
        sample = self._telemetry() if self._telemetry is not None else None
        telemetry = msgspec.Raw(encode_sample(sample)) if sample is not None else msgspec.UNSET
        down = self.said_down = self._health.problem
        return Heartbeat(
            in_flight=self._in_flight(),
            resident=resident,
            telemetry=telemetry,
            backend_down=msgspec.UNSET if down is None else down,
        )

    async def report_health(self, outbox: trio.MemorySendChannel[Outbound]) -> None:
        """A heartbeat as soon as the backend goes down or answers again (not at the next
        interval): the coordinator stops placing here, or places here again, at once."""
        while True:
            changed = self._health.changed
            if (self._health.problem is None) != (self.said_down is None):
                await outbox.send(self.heartbeat(None))  # resident None: not said here
            await changed.wait()
