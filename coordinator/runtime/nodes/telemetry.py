"""The host telemetry nodes send in their heartbeats: checked, then kept as a short history
per node in the shared store, where every instance reads it.

A node is not trusted: ``offer`` keeps only what ``protocol.parse_sample`` accepts (an object
of bounded finite numbers) and counts the rest in ``rejected``; the heartbeat itself has
already counted. Writes are paced: at most one per node every ``interval_s`` (the newest
sample of that interval wins), so a node beating fast, or a hostile one, cannot turn its
heartbeats into store writes. Telemetry is read-only: nothing here touches budgets, facts or
placement, and a store that cannot be reached loses telemetry, never a request.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec
import trio

from coordinator.coordination import CoordinationUnavailable, TelemetryStore
from protocol.telemetry import TelemetrySample, encode_sample, parse_sample

__all__ = ["HISTORY_LENGTH", "NodeTelemetry", "history_ttl_s"]

log = logging.getLogger("gemmanet.telemetry")

#: samples kept per node
HISTORY_LENGTH = 60


def history_ttl_s(interval_s: float) -> float:
    """A history lives twice as long as it takes to fill (at least a minute) after its node's
    last sample, so a node that went away leaves no key behind for long."""
    return max(60.0, 2 * HISTORY_LENGTH * interval_s)


def decode_stored(samples: Sequence[bytes]) -> list[TelemetrySample]:
    """Samples as read back from the store; anything that is not one is skipped (the store is
    shared: another writer, or an older version, may have put something else there)."""
    return [s for s in (parse_sample(raw) for raw in samples) if s is not None]


class NodeTelemetry:
    def __init__(self, coordination: TelemetryStore, *, interval_s: float) -> None:
        self._coordination = coordination
        self.interval_s = interval_s
        self._pending: dict[str, TelemetrySample] = {}
        self._arrived = trio.Event()
        #: heartbeat samples dropped because they were not valid samples
        self.rejected = 0

    def offer(self, node_id: str, raw: msgspec.Raw | msgspec.UnsetType) -> None:
        """A heartbeat's ``telemetry`` field (UNSET: the node sent none)."""
        if raw is msgspec.UNSET:
            return
        sample = parse_sample(raw)
        if sample is None:
            self.rejected += 1
            log.debug("node %s sent telemetry that is not a valid sample; dropped", node_id)
            return
        self._pending[node_id] = sample
        self._arrived.set()

    async def run(self) -> None:
        # Idle (no timer) until a sample arrives: instances without telemetry do nothing here.
        while True:
            await self._arrived.wait()
            self._arrived = trio.Event()
            pending, self._pending = self._pending, {}
            ttl_s = history_ttl_s(self.interval_s)
            for node_id, sample in pending.items():
                try:
                    await self._coordination.append_telemetry(
                        node_id, encode_sample(sample), keep=HISTORY_LENGTH, ttl_s=ttl_s
                    )
                except CoordinationUnavailable as exc:
                    log.warning("could not store the telemetry of node %s: %s", node_id, exc)
            await trio.sleep(self.interval_s)

    async def latest(self, node_ids: Sequence[str]) -> dict[str, TelemetrySample] | None:
        """The newest stored sample per node (any instance's nodes); None when the store cannot
        be read."""
        try:
            found = await self._coordination.latest_telemetry(node_ids)
        except CoordinationUnavailable as exc:
            log.warning("nodes: cannot read the telemetry: %s", exc)
            return None
        samples = {node: decode_stored([raw]) for node, raw in found.items()}
        return {node: s[0] for node, s in samples.items() if s}

    async def history(self, node_id: str) -> list[TelemetrySample]:
        """Oldest first. Raises CoordinationUnavailable."""
        return decode_stored(await self._coordination.telemetry_history(node_id))
