"""This instance's presence in the shared registry, and its view of its peers.

Each beat (``beat_s``) the instance refreshes its alive key (TTL ``alive_ttl_s``) and publishes a
snapshot of its nodes, then reads the live peers' snapshots. ``dead_among`` judges peers: an
instance whose inbox has no listener (a killed process's socket closes at once) or whose alive
key expired (a frozen process) is dead.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import trio

from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.coordination.bus import Bus
from coordinator.core import registry
from coordinator.core.registry import InstanceSnapshot
from coordinator.errors import StartupRefused
from coordinator.settings import Settings

log = logging.getLogger("gemmanet.membership")


class Membership:
    def __init__(
        self,
        coordination: Coordination,
        bus: Bus,
        settings: Settings,
        *,
        snapshot: Callable[[], InstanceSnapshot],
        clock: Callable[[], float],
    ) -> None:
        self._coordination, self._bus, self._settings = coordination, bus, settings
        self.me = settings.instance_id
        self._snapshot = snapshot
        self._clock = clock
        self._alive_value = self.me.encode()
        self._peers: dict[str, InstanceSnapshot] = {}
        self._dirty = trio.Event()
        self.on_presence_lapsed: Callable[[], Awaitable[None]] | None = None
        self.on_peers: Callable[[list[InstanceSnapshot]], None] | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._announce(first=True)
        except CoordinationUnavailable as exc:
            raise StartupRefused(f"cannot register this instance in Redis: {exc}") from None
        task_status.started()
        while True:
            with trio.move_on_after(self._settings.beat_s):
                await self._dirty.wait()
            self._dirty = trio.Event()
            try:
                await self._announce(first=False)
                await self._refresh_peers()
            except CoordinationUnavailable as exc:
                log.warning("heartbeat failed: %s", exc)

    def snapshot_changed(self) -> None:
        """A node came or went: publish the registry now, not at the next beat."""
        self._dirty.set()

    async def _announce(self, *, first: bool) -> None:
        ttl, key = self._settings.alive_ttl_s, registry.alive_key(self.me)
        was_alive = await self._coordination.refresh_if(key, self._alive_value, ttl)
        if not was_alive:
            await self._coordination.set(key, self._alive_value, ttl_s=ttl)
        snapshot = registry.encode_snapshot(self._snapshot())
        await self._coordination.set(registry.snapshot_key(self.me), snapshot, ttl_s=ttl)
        if not was_alive and not first and self.on_presence_lapsed is not None:
            await self.on_presence_lapsed()

    async def _refresh_peers(self) -> None:
        keys = await self._coordination.keys_with_prefix(registry.ALIVE_PREFIX)
        alive = sorted(k[len(registry.ALIVE_PREFIX) :] for k in keys)
        values = await self._coordination.get_many([registry.snapshot_key(i) for i in alive])
        peers = {}
        for instance_id, value in zip(alive, values, strict=True):
            snap = registry.decode_snapshot(value) if value else None
            if snap is not None and instance_id != self.me:
                peers[instance_id] = snap
        self._peers = peers
        if self.on_peers is not None:
            self.on_peers(self.peers())

    def peers(self) -> list[InstanceSnapshot]:
        """Last known snapshots of the other live instances, by instance id."""
        return [self._peers[i] for i in sorted(self._peers)]

    def forget_peer(self, instance_id: str) -> None:
        self._peers.pop(instance_id, None)

    async def dead_among(self, instance_ids: Sequence[str]) -> set[str]:
        """The instances among ``instance_ids`` that are dead. Raises CoordinationUnavailable
        when it cannot tell."""
        keys = [registry.alive_key(i) for i in instance_ids]
        values = await self._coordination.get_many(keys)
        dead = set()
        for instance_id, value in zip(instance_ids, values, strict=True):
            if value is None or not await self._bus.is_listening(instance_id):
                dead.add(instance_id)
        return dead

    async def leave(self) -> None:
        """Leave politely: peers see us gone now rather than at the TTL."""
        # Shielded from the cancellation that stops us, but bounded: the deadline sits inside.
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            try:
                alive = registry.alive_key(self.me)
                await self._coordination.compare_and_set(alive, self._alive_value, None)
                await self._coordination.delete(registry.snapshot_key(self.me))
            except CoordinationUnavailable:
                pass
