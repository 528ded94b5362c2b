"""Lua scripts that make the Redis backend's compound operations atomic.

Each runs as one EVALSHA (EVAL when the server lost its script cache, e.g. after a restart).
TTL arguments are milliseconds as decimal strings; an empty string means "no expiry".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = [
    "COMPARE_AND_SET",
    "INCR_WITH_TTL",
    "PRESENCE",
    "RATE_LIMIT",
    "RATE_LIMIT_LUA",
    "REFRESH_IF",
    "REFRESH_MANY",
    "SWAP_MANY",
    "LuaScript",
]


@dataclass(frozen=True, slots=True)
class LuaScript:
    name: str
    source: bytes
    #: the EVALSHA digest, computed once (it was hashed again on every call, several KiB for
    #: the lease scripts)
    sha: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source).hexdigest().encode())


def _script(name: str, source: str) -> LuaScript:
    return LuaScript(name, source.strip().encode())


# KEYS[1] key; ARGV[1] "1" if a current value is expected, "0" if the key must be absent;
# ARGV[2] expected value; ARGV[3] "1" to write ARGV[4], "0" to delete; ARGV[5] TTL ms or "".
COMPARE_AND_SET = _script(
    "compare_and_set",
    """
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if current ~= ARGV[2] then return 0 end
elseif current then
  return 0
end
if ARGV[3] == '1' then
  if ARGV[5] ~= '' then
    redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
  else
    redis.call('SET', KEYS[1], ARGV[4])
  end
else
  redis.call('DEL', KEYS[1])
end
return 1
""",
)

# KEYS[1] key; ARGV[1] expected value; ARGV[2] TTL ms.
REFRESH_IF = _script(
    "refresh_if",
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
""",
)

# KEYS: the keys; ARGV[1] TTL ms, then each key's expected value. Returns 1/0 per key.
REFRESH_MANY = _script(
    "refresh_many",
    """
local done = {}
for k = 1, #KEYS do
  if redis.call('GET', KEYS[k]) == ARGV[k + 1] then
    done[k] = redis.call('PEXPIRE', KEYS[k], ARGV[1])
  else
    done[k] = 0
  end
end
return done
""",
)

# SET ... GET for several keys in one step (a burst of node connections claims its identities
# together): ARGV[1] is the TTL, ARGV[k + 2] the new value of KEYS[k]; the previous values come
# back in order (nil for an absent key). ARGV[2] = '1': the last key is a counter, INCR'd in the
# same step (instances watch it to know when owner records moved).
SWAP_MANY = _script(
    "swap_many",
    """
local swaps = #KEYS
if ARGV[2] == '1' then
  swaps = swaps - 1
end
local previous = {}
for k = 1, swaps do
  local old
  if ARGV[1] == '' then
    old = redis.call('SET', KEYS[k], ARGV[k + 2], 'GET')
  else
    old = redis.call('SET', KEYS[k], ARGV[k + 2], 'GET', 'PX', ARGV[1])
  end
  previous[k] = old
end
if ARGV[2] == '1' and swaps > 0 then
  redis.call('INCR', KEYS[#KEYS])
end
return previous
""",
)

# KEYS[1] key; ARGV[1] amount; ARGV[2] TTL ms or "" (applied only when this call creates the key).
INCR_WITH_TTL = _script(
    "incr_with_ttl",
    """
local created = redis.call('EXISTS', KEYS[1]) == 0
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
if created and ARGV[2] ~= '' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return value
""",
)

# Sliding-window log in a sorted set, scored in microseconds of the server's clock (TIME), so
# every instance is judged against one clock. Only allowed calls are recorded. A member already
# in the window (the same request asking again) is allowed without being counted twice.
# rate_limit(key, limit, period in microseconds, member) -> {allowed 0/1, retry_after
# microseconds, remaining}; ``now`` is the caller's TIME. Shared with the lease admission
# script (``lease_scripts.py`` ADMIT), which counts a request and admits it in one step.
# Scores are formatted with %.0f: Lua's default number formatting (%.14g) would round them.
RATE_LIMIT_LUA = """
local function rate_limit(key, limit, period, member)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - period))
  local count = redis.call('ZCARD', key)
  if redis.call('ZSCORE', key, member) then
    return {1, 0, math.max(limit - count, 0)}
  end
  if count < limit then
    redis.call('ZADD', key, string.format('%.0f', now), member)
    redis.call('PEXPIRE', key, math.ceil(period / 1000))
    return {1, 0, limit - count - 1}
  end
  local releasing = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')
  local retry = tonumber(releasing[2]) + period - now
  if retry < 0 then retry = 0 end
  return {0, retry, 0}
end
"""

# KEYS[1] key; ARGV[1] limit; ARGV[2] period in microseconds; ARGV[3] member.
RATE_LIMIT = _script(
    "rate_limit",
    """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
"""
    + RATE_LIMIT_LUA
    + """
return rate_limit(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3])
""",
)

# A presence registry: KEYS[1] a sorted set member -> last beat (server TIME, microseconds),
# KEYS[2] a hash member -> data, KEYS[3] the pulse (time of the last presence call), KEYS[4] a
# sorted set of stall windows "start:end" scored by end. Every call compares the pulse with now
# and records a stall when no presence call ran for longer than ARGV[3] microseconds.
# ARGV[1] member, ARGV[2] data, ARGV[3] stall_after_us, ARGV[4] forget_after_us,
# ARGV[5] "beat" | "read" | "leave".
# Returns {now, previous beat or "", {member, score, ...}, {data, ...}, {stall, ...}}.
PRESENCE = _script(
    "presence",
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nows = string.format('%.0f', now)
local mode = ARGV[5]
if mode == 'leave' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return {nows, '', {}, {}, {}}
end
local pulse = tonumber(redis.call('GET', KEYS[3]))
if pulse and now - pulse > tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[4], nows, string.format('%.0f', pulse) .. ':' .. nows)
end
redis.call('SET', KEYS[3], nows)
local previous = ''
local stalls = {}
if mode == 'beat' then
  local horizon = '(' .. string.format('%.0f', now - tonumber(ARGV[4]))
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', horizon)
  local forgotten = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', horizon)
  if #forgotten > 0 then
    redis.call('ZREM', KEYS[1], unpack(forgotten))
    redis.call('HDEL', KEYS[2], unpack(forgotten))
  end
  previous = redis.call('ZSCORE', KEYS[1], ARGV[1]) or ''
  redis.call('ZADD', KEYS[1], nows, ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  if previous ~= '' then
    stalls = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. previous, '+inf')
  end
end
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local data = {}
if #members > 0 then
  local names = {}
  for i = 1, #members, 2 do names[#names + 1] = members[i] end
  data = redis.call('HMGET', KEYS[2], unpack(names))
end
return {nows, previous, members, data, stalls}
""",
)
