"""The embedded backend's telemetry histories: a bounded list per node that expires as a whole
``ttl_s`` after its last append, like the Redis list (RPUSH + LTRIM + PEXPIRE)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["TelemetryHistories"]


class TelemetryHistories:
    """Callers pass ``now`` (the state's injected clock)."""

    def __init__(self) -> None:
        # node id -> (samples oldest first, deadline)
        self._histories: dict[str, tuple[deque[bytes], float]] = {}

    def _forget_expired(self, now: float) -> None:
        # A handful of nodes per process: a scan per call keeps memory flat without a heap.
        expired = [node for node, (_, deadline) in self._histories.items() if deadline <= now]
        for node in expired:
            del self._histories[node]

    def append(self, node_id: str, sample: bytes, keep: int, ttl_s: float, now: float) -> None:
        if keep < 1 or not ttl_s > 0:
            raise ValueError(f"keep must be >= 1 and ttl_s > 0, got {keep!r}, {ttl_s!r}")
        self._forget_expired(now)
        samples, _ = self._histories.get(node_id, (deque(), now))
        samples.append(bytes(sample))
        while len(samples) > keep:
            samples.popleft()
        self._histories[node_id] = (samples, now + ttl_s)

    def history(self, node_id: str, now: float) -> list[bytes]:
        self._forget_expired(now)
        found = self._histories.get(node_id)
        return [] if found is None else list(found[0])

    def latest(self, node_ids: Sequence[str], now: float) -> dict[str, bytes]:
        self._forget_expired(now)
        return {node: self._histories[node][0][-1] for node in node_ids if node in self._histories}
