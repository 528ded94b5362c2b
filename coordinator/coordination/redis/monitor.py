"""The monitor election and fenced host facts in Redis (semantics: ``monitor_types``): each
operation one Lua script, so the token compare and the write it guards are one atomic step
that no other client's command can fall between. The ``MonitorStore`` role on Redis.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.coordination.base import CoordinationUnavailable
from coordinator.coordination.keys import (
    HOST_PLACEMENT,
    MONITOR_EPOCH,
    MONITOR_FACTS,
    MONITOR_FACTS_AT,
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
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.scripts import COMPARE_AND_SET, REFRESH_IF, LuaScript

__all__ = ["MONITOR_ACQUIRE", "MONITOR_WRITE_FACTS", "RedisMonitor"]

# KEYS[1] lease, KEYS[2] epoch; ARGV[1] candidate, ARGV[2] TTL ms.
# -> {1, epoch, candidate} when taken, {0, lease value} when someone holds it.
MONITOR_ACQUIRE = LuaScript(
    "monitor_acquire",
    b"""
local lease = redis.call('GET', KEYS[1])
if lease then return {0, lease} end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. epoch, 'PX', ARGV[2])
return {1, tostring(epoch)}
""".strip(),
)

# KEYS[1] lease, KEYS[2] epoch, KEYS[3] facts hash, KEYS[4] write-time hash, KEYS[5] rejects,
# KEYS[6] accepted counter of this epoch; ARGV[1] writer, ARGV[2] its epoch, ARGV[3] host id,
# ARGV[4] record, ARGV[5] "1" fenced / "0" the test-only unfenced switch, ARGV[6] counter TTL ms.
# The compare reads the epoch and the lease *in the script*: a deposed writer (its token older,
# or its lease gone) is rejected even if it was paused between deciding to write and writing.
MONITOR_WRITE_FACTS = LuaScript(
    "monitor_write_facts",
    b"""
if ARGV[5] == '1' then
  local current = redis.call('GET', KEYS[2]) or '0'
  local lease = redis.call('GET', KEYS[1])
  if current ~= ARGV[2] or lease ~= (ARGV[1] .. '|' .. ARGV[2]) then
    redis.call('INCR', KEYS[5])
    return 0
  end
end
local t = redis.call('TIME')
local micros = t[1] .. string.rep('0', 6 - string.len(t[2])) .. t[2]
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[4], ARGV[3], micros)
if redis.call('INCR', KEYS[6]) == 1 then redis.call('PEXPIRE', KEYS[6], ARGV[6]) end
return 1
""".strip(),
)

# KEYS[1] facts hash, KEYS[2] write-time hash; ARGV host ids (none: every host).
# -> {now micros, {host, record, micros, ...}}
MONITOR_READ_FACTS = LuaScript(
    "monitor_read_facts",
    b"""
local t = redis.call('TIME')
local now = t[1] .. string.rep('0', 6 - string.len(t[2])) .. t[2]
local hosts = ARGV
if #hosts == 0 then hosts = redis.call('HKEYS', KEYS[1]) end
local found = {}
for _, host in ipairs(hosts) do
  local record = redis.call('HGET', KEYS[1], host)
  local at = redis.call('HGET', KEYS[2], host)
  if record and at then
    table.insert(found, host)
    table.insert(found, record)
    table.insert(found, at)
  end
end
return {now, found}
""".strip(),
)


def _ms(seconds: float) -> str:
    if not seconds > 0:
        raise ValueError(f"a TTL must be positive, got {seconds!r}")
    return str(max(1, round(seconds * 1000)))


def _text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes | bytearray) else str(raw)


class RedisMonitor:
    """``MonitorStore`` on the keys of one link's prefix."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link
        self._name = link.redis_key

    async def monitor_acquire(self, candidate: str, ttl_s: float) -> MonitorClaim:
        keys = [self._name(MONITOR_LEASE), self._name(MONITOR_EPOCH)]
        reply = await self._link.run_script(MONITOR_ACQUIRE, keys, [candidate, _ms(ttl_s)])
        if int(reply[0]) == 1:
            taken = int(_text(reply[1]))
            if self._link.sentinel is not None:
                await self._replicated(candidate, taken)
            return MonitorClaim(held=True, holder=candidate, epoch=taken)
        holder, epoch = parse_lease(_text(reply[1]).encode())
        return MonitorClaim(held=False, holder=holder, epoch=epoch)

    async def _replicated(self, candidate: str, epoch: int) -> None:
        """Under Sentinel, hand out a new epoch (a fencing token) only once a replica has it:
        a failover promotes a replica, and replication is asynchronous, so an epoch only the
        old master knew could be issued again, and tokens would go backwards."""
        wait_ms = max(1, round(self._link.op_timeout_s * 500))
        acks = await self._link.execute("WAIT", b"WAIT", b"1", str(wait_ms))
        if int(acks) >= 1:
            return
        try:
            await self.monitor_resign(candidate, epoch)
        except CoordinationUnavailable:
            pass  # then the lease runs out by its TTL
        raise CoordinationUnavailable(
            f"no replica acknowledged monitor epoch {epoch} within {wait_ms} ms; "
            "not handed out (a failover could lose it)"
        )

    async def monitor_renew(self, candidate: str, epoch: int, ttl_s: float) -> bool:
        value = lease_value(candidate, epoch)
        lease = [self._name(MONITOR_LEASE)]
        return bool(await self._link.run_script(REFRESH_IF, lease, [value, _ms(ttl_s)]))

    async def monitor_resign(self, candidate: str, epoch: int) -> bool:
        args = [b"1", lease_value(candidate, epoch), b"0", b"", ""]
        return bool(await self._link.run_script(COMPARE_AND_SET, [self._name(MONITOR_LEASE)], args))

    async def monitor_status(self) -> MonitorStatus:
        names = [self._name(k) for k in (MONITOR_LEASE, MONITOR_EPOCH, MONITOR_FENCED_REJECTS)]
        lease, epoch, rejects = await self._link.execute("MGET monitor", b"MGET", *names)
        holder, lease_epoch = parse_lease(lease)
        return MonitorStatus(
            holder=holder,
            lease_epoch=lease_epoch,
            epoch=int(epoch or 0),
            fenced_rejects=int(rejects or 0),
        )

    async def write_host_facts(
        self, candidate: str, epoch: int, host_id: str, record: bytes, *, fenced: bool = True
    ) -> bool:
        keys = [
            self._name(key)
            for key in (
                MONITOR_LEASE,
                MONITOR_EPOCH,
                MONITOR_FACTS,
                MONITOR_FACTS_AT,
                MONITOR_FENCED_REJECTS,
                monitor_accepted_key(epoch),
            )
        ]
        args = [candidate, str(int(epoch)), host_id, record, b"1" if fenced else b"0"]
        args.append(_ms(ACCEPTED_TTL_S))
        return bool(await self._link.run_script(MONITOR_WRITE_FACTS, keys, args))

    async def host_facts(self, host_ids: Sequence[str] | None = None) -> dict[str, HostFacts]:
        if host_ids is not None and not host_ids:
            return {}
        keys = [self._name(MONITOR_FACTS), self._name(MONITOR_FACTS_AT)]
        reply = await self._link.run_script(MONITOR_READ_FACTS, keys, list(host_ids or ()))
        now = int(_text(reply[0])) / 1e6
        found: dict[str, HostFacts] = {}
        flat = list(reply[1])
        for i in range(0, len(flat), 3):
            host = _text(flat[i])
            found[host] = decode_facts(host, bytes(flat[i + 1]), int(_text(flat[i + 2])) / 1e6, now)
        return found

    async def accepted_fact_writes(self, epoch: int) -> int:
        reply = await self._link.execute(
            "GET accepted", b"GET", self._name(monitor_accepted_key(epoch))
        )
        return int(reply or 0)

    async def host_placement(self) -> PlacementSwitch | None:
        raw = await self._link.execute("GET placement", b"GET", self._name(HOST_PLACEMENT))
        return PlacementSwitch.decode(raw)

    async def set_host_placement(self, switch: PlacementSwitch) -> None:
        key = self._name(HOST_PLACEMENT)
        await self._link.execute("SET placement", b"SET", key, switch.encode())
