"""The ``PrefixAffinity`` role on Redis: per model a hash of block -> its holders (``node
deadline_ms`` lines, most recent first) and a sorted set of the blocks by their latest record
deadline (``keys.affinity_keys``). One script per lookup, one per record, on the server's
clock (TIME), so instances whose clocks differ agree on what expired. On a Cluster both keys
share the deployment's hash tag like every other key (``connect/cluster.py``).

A record drops up to ``EXPIRED_PER_RECORD`` expired blocks, then the least recently recorded
ones beyond the model's bound, and sets both keys' TTL, so an idle model's blocks go as a
whole and a busy one's stay within ``max_blocks``.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.coordination.keys import affinity_keys
from coordinator.coordination.memory.affinity import check_record
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.scripts import LuaScript
from coordinator.coordination.roles import PREFIX_HOLDERS_KEPT

__all__ = ["PREFIX_HOLDERS", "RECORD_PREFIX", "RedisAffinity"]

EXPIRED_PER_RECORD = 128

# KEYS[1] the blocks, ARGV the block hashes. Per hash, its fresh holders joined by spaces.
PREFIX_HOLDERS = LuaScript(
    "prefix_holders",
    b"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local values = redis.call('HMGET', KEYS[1], unpack(ARGV))
local found = {}
for i = 1, #ARGV do
  local fresh = {}
  local value = values[i]
  if value then
    for node, deadline in string.gmatch(value, '(%S+) (%d+)') do
      if tonumber(deadline) > now then fresh[#fresh + 1] = node end
    end
  end
  found[i] = table.concat(fresh, ' ')
end
return found
""".strip(),
)

# KEYS[1] the blocks, KEYS[2] their deadlines; ARGV[1] node id, ARGV[2] TTL ms, ARGV[3] the
# model's bound, ARGV[4] holders kept per block, ARGV[5] expired blocks dropped at most, then
# the block hashes.
RECORD_PREFIX = LuaScript(
    "record_prefix",
    b"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local node, ttl = ARGV[1], tonumber(ARGV[2])
local deadline = string.format('%d', now + ttl)
local kept = tonumber(ARGV[4])
for i = 6, #ARGV do
  local block = ARGV[i]
  local holders = {node .. ' ' .. deadline}
  local old = redis.call('HGET', KEYS[1], block)
  if old then
    for other, until_ms in string.gmatch(old, '(%S+) (%d+)') do
      if #holders < kept and other ~= node and tonumber(until_ms) > now then
        holders[#holders + 1] = other .. ' ' .. until_ms
      end
    end
  end
  redis.call('HSET', KEYS[1], block, table.concat(holders, '\\n'))
  redis.call('ZADD', KEYS[2], deadline, block)
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
for _, block in ipairs(expired) do
  redis.call('HDEL', KEYS[1], block)
  redis.call('ZREM', KEYS[2], block)
end
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if over > 0 then
  local gone = redis.call('ZRANGE', KEYS[2], 0, over - 1)
  for _, block in ipairs(gone) do
    redis.call('HDEL', KEYS[1], block)
    redis.call('ZREM', KEYS[2], block)
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
""".strip(),
)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisAffinity:
    """``PrefixAffinity`` on the keys of one link's prefix."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link

    async def prefix_holders(self, model: str, hashes: Sequence[str]) -> list[list[str]]:
        if not hashes:
            return []
        link = self._link
        keys = [link.redis_key(affinity_keys(model)[0])]
        reply = await link.run_script(PREFIX_HOLDERS, keys, list(hashes))
        return [_text(found).split() for found in reply]

    async def record_prefix(
        self, model: str, node_id: str, hashes: Sequence[str], *, ttl_s: float, max_blocks: int
    ) -> None:
        check_record(ttl_s, max_blocks)
        if not hashes:
            return
        link = self._link
        keys = [link.redis_key(k) for k in affinity_keys(model)]
        ttl_ms = max(1, round(ttl_s * 1000))
        args = [node_id, ttl_ms, max_blocks, PREFIX_HOLDERS_KEPT, EXPIRED_PER_RECORD, *hashes]
        await link.run_script(RECORD_PREFIX, keys, args)
