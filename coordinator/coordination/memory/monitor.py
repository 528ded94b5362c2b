"""The embedded backend's monitor election and fenced fact writes, with the semantics of
``monitor_types`` (the Redis scripts are in ``redis/monitor.py``).

The lease, the epoch and the counters live in the state's ordinary keys (so ``delete`` and
``get`` see them exactly as on Redis); the facts live in dicts here. Every function runs
synchronously inside one facade call, which is what makes it atomic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from coordinator.coordination.keys import (
    HOST_PLACEMENT,
    MONITOR_EPOCH,
    MONITOR_FENCED_REJECTS,
    MONITOR_LEASE,
    monitor_accepted_key,
)
from coordinator.coordination.monitor_types import (
    ACCEPTED_TTL_S,
    HostFacts,
    MonitorClaim,
    MonitorStatus,
    PlacementSwitch,
    decode_facts,
    lease_value,
    parse_lease,
)

__all__ = ["MonitorTables"]


class _KeyStore(Protocol):
    """The parts of ``MemoryState`` used here (a protocol: the state owns these tables)."""

    def now(self) -> float: ...
    def get(self, key: str) -> bytes | None: ...
    def set(
        self, key: str, value: bytes, *, ttl_s: float | None = None, only_if_absent: bool = False
    ) -> bool: ...
    def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int: ...
    def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool: ...
    def compare_and_set(
        self,
        key: str,
        expected: bytes | None,
        value: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool: ...


def _whole(raw: bytes | None) -> int:
    return int(raw) if raw else 0


class MonitorTables:
    """The facts of one memory state (host id -> (record, write time))."""

    def __init__(self, state: _KeyStore) -> None:
        self._state = state
        self._facts: dict[str, tuple[bytes, float]] = {}

    def acquire(self, candidate: str, ttl_s: float) -> MonitorClaim:
        state = self._state
        holder, epoch = parse_lease(state.get(MONITOR_LEASE))
        if holder is not None:
            return MonitorClaim(held=False, holder=holder, epoch=epoch)
        new_epoch = state.incr(MONITOR_EPOCH)
        state.set(MONITOR_LEASE, lease_value(candidate, new_epoch), ttl_s=ttl_s)
        return MonitorClaim(held=True, holder=candidate, epoch=new_epoch)

    def renew(self, candidate: str, epoch: int, ttl_s: float) -> bool:
        return self._state.refresh_if(MONITOR_LEASE, lease_value(candidate, epoch), ttl_s)

    def resign(self, candidate: str, epoch: int) -> bool:
        return self._state.compare_and_set(MONITOR_LEASE, lease_value(candidate, epoch), None)

    def status(self) -> MonitorStatus:
        state = self._state
        holder, lease_epoch = parse_lease(state.get(MONITOR_LEASE))
        return MonitorStatus(
            holder=holder,
            lease_epoch=lease_epoch,
            epoch=_whole(state.get(MONITOR_EPOCH)),
            fenced_rejects=_whole(state.get(MONITOR_FENCED_REJECTS)),
        )

    def write(
        self, candidate: str, epoch: int, host_id: str, record: bytes, *, fenced: bool
    ) -> bool:
        state = self._state
        current = _whole(state.get(MONITOR_EPOCH))
        lease = state.get(MONITOR_LEASE)
        if fenced and (epoch != current or lease != lease_value(candidate, epoch)):
            state.incr(MONITOR_FENCED_REJECTS)
            return False
        self._facts[host_id] = (bytes(record), state.now())
        state.incr(monitor_accepted_key(epoch), ttl_s=ACCEPTED_TTL_S)
        return True

    def accepted(self, epoch: int) -> int:
        return _whole(self._state.get(monitor_accepted_key(epoch)))

    def read(self, host_ids: Sequence[str] | None) -> dict[str, HostFacts]:
        now = self._state.now()
        wanted = sorted(self._facts) if host_ids is None else host_ids
        return {
            host: decode_facts(host, *self._facts[host], now)
            for host in wanted
            if host in self._facts
        }

    def placement(self) -> PlacementSwitch | None:
        return PlacementSwitch.decode(self._state.get(HOST_PLACEMENT))

    def set_placement(self, switch: PlacementSwitch) -> None:
        self._state.set(HOST_PLACEMENT, switch.encode())
