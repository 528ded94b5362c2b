"""The ``Presence`` role on Redis: one script (``scripts.py`` PRESENCE) per call, on server
TIME. Presence calls run on a connection of their own (the "presence" lane): a beat or a
judge's read is never queued behind request traffic, a SCAN or a burst of publishes."""

from __future__ import annotations

from coordinator.coordination.base import PresenceEntry, PresenceView
from coordinator.coordination.keys import presence_keys
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.scripts import PRESENCE

__all__ = ["RedisPresence"]


def _us(seconds: float) -> str:
    return str(max(1, round(seconds * 1_000_000)))


class RedisPresence:
    """``Presence`` on the registries of one link's prefix."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link

    async def _presence(
        self, registry: str, mode: bytes, member: str, data: bytes, stall_s: float, forget_s: float
    ) -> PresenceView:
        link = self._link
        keys = [link.redis_key(key) for key in presence_keys(registry)]
        args = [member, data, _us(stall_s), _us(forget_s), mode]
        reply = await link.run_script(PRESENCE, keys, args, lane="presence")
        now, previous, members, data_list, stalls = reply
        entries = tuple(
            PresenceEntry(
                member=members[i].decode(),
                last_beat=int(float(members[i + 1])) / 1e6,
                data=data_list[i // 2] or b"",
            )
            for i in range(0, len(members), 2)
        )
        windows = []
        for raw in stalls:
            start, _, end = raw.partition(b":")
            windows.append((int(start) / 1e6, int(end) / 1e6))
        return PresenceView(
            now=int(now) / 1e6,
            entries=tuple(sorted(entries, key=lambda e: e.member)),
            previous_beat=int(float(previous)) / 1e6 if previous else None,
            stalls=tuple(windows),
        )

    async def presence_beat(
        self,
        registry: str,
        member: str,
        data: bytes,
        *,
        stall_after_s: float,
        forget_after_s: float,
    ) -> PresenceView:
        return await self._presence(registry, b"beat", member, data, stall_after_s, forget_after_s)

    async def presence_read(self, registry: str, *, stall_after_s: float) -> PresenceView:
        return await self._presence(registry, b"read", "", b"", stall_after_s, 1.0)

    async def presence_leave(self, registry: str, member: str) -> None:
        await self._presence(registry, b"leave", member, b"", 1.0, 1.0)
