"""One candidate's hold on the monitor lease (semantics: coordination/monitor_types.py).

``epoch`` is the fencing token while this candidate believes it is the primary; every fact it
writes names it, and the store rejects the write once a newer epoch exists or the lease is no
longer this candidate's. Believing is not enough, which is the point: a primary paused past its
TTL still believes until its next write or renewal tells it otherwise.
"""

from __future__ import annotations

from coordinator.coordination.roles import MonitorStore

__all__ = ["Candidacy"]


class Candidacy:
    def __init__(self, coordination: MonitorStore, candidate: str, ttl_s: float) -> None:
        self.coordination = coordination
        self.candidate = candidate
        self.ttl_s = ttl_s
        #: the fencing token while this candidate thinks it holds the lease, else None
        self.epoch: int | None = None
        #: who held the lease at our last failed attempt (for logs)
        self.seen_holder: str | None = None

    @property
    def primary(self) -> bool:
        return self.epoch is not None

    async def try_acquire(self) -> bool:
        claim = await self.coordination.monitor_acquire(self.candidate, self.ttl_s)
        self.epoch = claim.epoch if claim.held else None
        self.seen_holder = claim.holder
        return claim.held

    async def renew(self) -> bool:
        if self.epoch is None:
            return False
        if await self.coordination.monitor_renew(self.candidate, self.epoch, self.ttl_s):
            return True
        self.epoch = None
        return False

    def step_down(self) -> None:
        self.epoch = None

    async def resign(self) -> None:
        if self.epoch is not None:
            await self.coordination.monitor_resign(self.candidate, self.epoch)
            self.epoch = None
