"""The ``TelemetryStore`` role on Redis: one list per node (``keys.telemetry_key``), appended,
trimmed and given its TTL by one script, so a reader never sees a list that is too long or
one that would never expire.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.coordination.keys import telemetry_key
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.scripts import LuaScript

__all__ = ["APPEND_TELEMETRY", "LATEST_TELEMETRY", "RedisTelemetry"]

# KEYS[1] the node's list; ARGV[1] the sample, ARGV[2] how many to keep, ARGV[3] TTL ms.
APPEND_TELEMETRY = LuaScript(
    "append_telemetry",
    b"""
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
""".strip(),
)

# KEYS the nodes' lists; the newest sample of each, false where a list is absent.
LATEST_TELEMETRY = LuaScript(
    "latest_telemetry",
    b"""
local found = {}
for i, key in ipairs(KEYS) do
  found[i] = redis.call('LINDEX', key, -1)
end
return found
""".strip(),
)


class RedisTelemetry:
    """``TelemetryStore`` on the keys of one link's prefix."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link
        self._name = link.redis_key

    async def append_telemetry(
        self, node_id: str, sample: bytes, *, keep: int, ttl_s: float
    ) -> None:
        if keep < 1 or not ttl_s > 0:
            raise ValueError(f"keep must be >= 1 and ttl_s > 0, got {keep!r}, {ttl_s!r}")
        ttl_ms = str(max(1, round(ttl_s * 1000)))
        key = self._name(telemetry_key(node_id))
        await self._link.run_script(APPEND_TELEMETRY, [key], [sample, str(int(keep)), ttl_ms])

    async def telemetry_history(self, node_id: str) -> list[bytes]:
        key = self._name(telemetry_key(node_id))
        reply = await self._link.execute("LRANGE telemetry", b"LRANGE", key, 0, -1)
        return [bytes(item) for item in reply or []]

    async def latest_telemetry(self, node_ids: Sequence[str]) -> dict[str, bytes]:
        if not node_ids:
            return {}
        keys = [self._name(telemetry_key(node)) for node in node_ids]
        reply = await self._link.run_script(LATEST_TELEMETRY, keys, [])
        return {
            node: bytes(item)
            for node, item in zip(node_ids, reply, strict=True)
            if isinstance(item, bytes | bytearray)
        }
