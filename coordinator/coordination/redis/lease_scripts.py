"""Lua scripts of the Redis backend's capacity leases and admission queues: the semantics of
``leases.py`` (reference: ``memory/leases.py``) as one atomic EVALSHA each, on the server's
clock (TIME, microseconds), so every instance is judged against one clock.

Every key a script touches arrives in KEYS (``leases.py`` computes the names, spelled in
``keys.py``), none is built in Lua. Layout, relative to the backend's key prefix:

* ``lease:facts`` hash node id -> facts JSON ``{"conn", "instance", "max_parallel",
  "memory_gb" (absent: no budget), "resident": [[model, gb], ...]}``;
* ``lease:n:{node}`` sorted set lease id -> expiry (µs); ``lease:i:{node}`` hash lease id ->
  ``"model_gb\\tkv_gb\\tmodel"``. Both expire a while after the last lease does;
* ``lease:q:{model}`` sorted set request id -> sequence number (first come first served:
  the last score plus one); ``lease:qi:{model}`` hash request id -> ``"expiry_us\\tinstance"``
  (``fair``: ``"expiry_us\\tinstance\\tkey id"``). Under ``fair`` also ``lease:qk:{model}``,
  each entry's ``"key id\\tsequence (15 digits)\\trequest id"`` at score 0 (a key's entries
  are a lex range, oldest first), ``lease:qr:{model}`` the ring of keys with entries (a
  list, its front first) and ``lease:qd:{model}`` hash key id -> ``"deficit\\tweight"`` per
  ring key. All expire a while after the newest entry does, and hold at most ``queue_max``
  entries (key ids hold no tab);
* ``lease:a:{key id}`` hash request id -> instance (the API key's active set; no TTL: a
  running request may last any time, its entry goes with ``release`` or its instance).

Instances are alive when their beat in the presence registry (the sorted set of the
``PRESENCE`` script, scored in µs of server TIME) is within the window: ``now - beat <=
window``, as in ``PresenceRegistries.alive``. GB values travel as the decimal strings Python
wrote (``repr``: exact) and are stored as such; sums are returned with ``%.17g`` (exact).
"""

from __future__ import annotations

from coordinator.coordination.redis.queue_lua import QUEUE_LUA
from coordinator.coordination.redis.scripts import RATE_LIMIT_LUA, LuaScript, _script

__all__ = ["ADMIT", "DROP_FACTS", "QUEUE_DEPTHS", "RELEASE", "RENEW", "USAGE"]

#: extra life of a lease or queue key past its last entry's expiry, in milliseconds
KEY_MARGIN_MS = 10_000

# Shared by every script: the server's time and the helpers the semantics are made of.
_PRELUDE = (
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function fmt(n) return string.format('%.0f', n) end
local function alive(presence, member, window)
  local beat = redis.call('ZSCORE', presence, member)
  return beat ~= false and now - tonumber(beat) <= window
end
local function expire_after(keys, at)
  local ms = math.ceil((at - now) / 1000) + """
    + str(KEY_MARGIN_MS)
    + """
  for _, key in ipairs(keys) do redis.call('PEXPIRE', key, ms) end
end
"""
    + QUEUE_LUA
    + """
local function drop_expired(n, i)
  local expired = redis.call('ZRANGEBYSCORE', n, '-inf', fmt(now))
  if #expired > 0 then
    redis.call('ZREM', n, unpack(expired))
    redis.call('HDEL', i, unpack(expired))
  end
end
-- {model, model_gb, kv_gb} of each lease of a node
local function leases_of(n, i)
  local ids = redis.call('ZRANGE', n, 0, -1)
  local held = {}
  if #ids == 0 then return held end
  local infos = redis.call('HMGET', i, unpack(ids))
  for k = 1, #ids do
    local gb, kv, model = string.match(infos[k] or '0\\t0\\t', '^([^\\t]*)\\t([^\\t]*)\\t(.*)$')
    held[#held + 1] = {model, tonumber(gb), tonumber(kv)}
  end
  return held
end
-- memory_leases.memory_in_use: resident models at their size, a model only leased at the
-- largest size its leases name, each counted once, plus every lease's KV budget
local function in_use(resident, held)
  local sizes, order, is_resident = {}, {}, {}
  for _, pair in ipairs(resident) do
    if sizes[pair[1]] == nil then order[#order + 1] = pair[1] end
    sizes[pair[1]] = pair[2]
    is_resident[pair[1]] = true
  end
  local kv = 0
  for _, lease in ipairs(held) do
    local model = lease[1]
    if sizes[model] == nil then
      order[#order + 1] = model
      sizes[model] = lease[2]
    elseif not is_resident[model] and lease[2] > sizes[model] then
      sizes[model] = lease[2]
    end
    kv = kv + lease[3]
  end
  local total = 0
  for _, model in ipairs(order) do total = total + sizes[model] end
  return total + kv
end
local function refresh_lease_keys(n, i)
  local last = redis.call('ZRANGE', n, -1, -1, 'WITHSCORES')
  if #last > 0 then expire_after({n, i}, tonumber(last[2])) end
end
"""
)


def _lease_script(name: str, body: str) -> LuaScript:
    return _script(name, _PRELUDE + body)


# KEYS: presence, facts, active set, the queue's five (``queue_at``), the key's rate-limit
# log, then (leases, lease info) per candidate. ARGV: request id, instance, model_gb, kv_gb,
# model, lease id, queue entry TTL us, facts_stale us, requester_stale us, lease TTL us,
# queue_max, max_active_per_key (0: no limit), '1'/'0' (asked again: look for the lease id
# first), 'fair'/'fifo', key id, weight, rate limit (0: not counted here), its period us, its
# member, then (node id, conn id) per candidate.
# Returns {outcome, node, conn, lease id, position (rate_limited: the retry after, us),
# {node, reason, ...}, next_in_queue, head request id}.
ADMIT = _lease_script(
    "lease_admit",
    RATE_LIMIT_LUA
    + """
local presence, facts_key, active = KEYS[1], KEYS[2], KEYS[3]
local Q = queue_at(4, ARGV[14] == 'fair')
local key_id, weight = ARGV[15], ARGV[16]
local rid, instance, model_gb, kv_gb, model, lease_id =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local queue_ttl, facts_window = tonumber(ARGV[7]), tonumber(ARGV[8])
local requester_window, lease_ttl = tonumber(ARGV[9]), tonumber(ARGV[10])
local queue_max, limit = tonumber(ARGV[11]), tonumber(ARGV[12])
local again = ARGV[13] == '1'
local candidates = (#ARGV - 19) / 2

-- The request's rate limit first (scripts.py RATE_LIMIT, the same log and member): over it,
-- nothing else happens.
local rate = tonumber(ARGV[17])
if rate > 0 then
  local decision = rate_limit(KEYS[9], rate, tonumber(ARGV[18]), ARGV[19])
  if decision[1] == 0 then return {'rate_limited', '', '', '', decision[2], {}, '', ''} end
end

-- Asked again after a copy of this ask got no answer: a lease that copy was granted is this
-- ask's, if its node is still usable as that candidate; else it can serve nobody.
if again then
  for k = 0, candidates - 1 do
    local node, conn = ARGV[20 + 2 * k], ARGV[21 + 2 * k]
    local n, i = KEYS[10 + 2 * k], KEYS[11 + 2 * k]
    local expires = redis.call('ZSCORE', n, lease_id)
    if expires and tonumber(expires) > now then
      local raw = redis.call('HGET', facts_key, node)
      local facts = raw and cjson.decode(raw)
      if facts and facts.conn == conn and alive(presence, facts.instance, facts_window) then
        queue_leave(Q, rid)
        local next_rid, next_instance = queue_head(Q, presence, requester_window)
        return {'granted', node, conn, lease_id, 0, {}, next_instance or '', next_rid or ''}
      end
      redis.call('ZREM', n, lease_id)
      redis.call('HDEL', i, lease_id)
    end
  end
end

local function try_reserve(node, conn, n, i)
  local raw = redis.call('HGET', facts_key, node)
  if not raw then return 'gone' end
  local facts = cjson.decode(raw)
  if facts.conn ~= conn then return 'gone' end
  if not alive(presence, facts.instance, facts_window) then return 'stale' end
  drop_expired(n, i)
  if redis.call('ZCARD', n) >= facts.max_parallel then return 'full' end
  if facts.memory_gb ~= nil then
    local held = leases_of(n, i)
    held[#held + 1] = {model, tonumber(model_gb), tonumber(kv_gb)}
    if in_use(facts.resident, held) > facts.memory_gb + 1e-9 then return 'memory' end
  end
  redis.call('ZADD', n, fmt(now + lease_ttl), lease_id)
  redis.call('HSET', i, lease_id, model_gb .. '\\t' .. kv_gb .. '\\t' .. model)
  refresh_lease_keys(n, i)
  return nil
end

local entered = false
if limit > 0 and redis.call('HEXISTS', active, rid) == 0 then
  local entries = redis.call('HGETALL', active)
  for k = 1, #entries, 2 do
    if not alive(presence, entries[k + 1], requester_window) then
      redis.call('HDEL', active, entries[k])
    end
  end
  if redis.call('HLEN', active) >= limit then return {'key_limit', '', '', '', 0, {}, '', ''} end
  redis.call('HSET', active, rid, instance)
  entered = true
end

queue_head(Q, presence, requester_window)
local queued = redis.call('ZSCORE', Q.q, rid) ~= false
local ahead = redis.call('ZCARD', Q.q)
if queued then ahead = queue_position(Q, rid) end
local order, reasons = {}, {}
local function refusals()
  local flat = {}
  for _, node in ipairs(order) do
    flat[#flat + 1] = node
    flat[#flat + 1] = reasons[node]
  end
  return flat
end

if ahead == 0 then
  for k = 0, candidates - 1 do
    local node, conn = ARGV[20 + 2 * k], ARGV[21 + 2 * k]
    local why = try_reserve(node, conn, KEYS[10 + 2 * k], KEYS[11 + 2 * k])
    if not why then
      queue_granted(Q, rid)
      local next_rid, next_instance = queue_head(Q, presence, requester_window)
      return {'granted', node, conn, lease_id, 0, refusals(), next_instance or '', next_rid or ''}
    end
    if reasons[node] == nil then order[#order + 1] = node end
    reasons[node] = why
  end
  if candidates > 0 then
    local usable = false
    for _, node in ipairs(order) do
      if reasons[node] ~= 'stale' and reasons[node] ~= 'gone' then usable = true end
    end
    if not usable then
      if entered then redis.call('HDEL', active, rid) end
      queue_leave(Q, rid)
      return {'refused', '', '', '', 0, refusals(), '', ''}
    end
  end
end

if not queued then
  if redis.call('ZCARD', Q.q) >= queue_max then
    if entered then redis.call('HDEL', active, rid) end
    return {'queue_full', '', '', '', 0, refusals(), '', ''}
  end
  local last = redis.call('ZRANGE', Q.q, -1, -1, 'WITHSCORES')
  local seq = 1
  if #last > 0 then seq = tonumber(last[2]) + 1 end
  queue_join(Q, rid, seq, now + queue_ttl, instance, key_id, weight)
  if Q.fair then ahead = queue_position(Q, rid) end
  local want = math.ceil(queue_ttl / 1000) + """
    + str(KEY_MARGIN_MS)
    + """
  for _, key in ipairs({Q.q, Q.qi, Q.qk, Q.qr, Q.qd}) do
    local ttl = redis.call('PTTL', key)
    if ttl ~= -2 and ttl < want then redis.call('PEXPIRE', key, want) end
  end
end
return {'queued', '', '', '', ahead, refusals(), '', queue_peek(Q) or ''}
""",
)

# KEYS: (leases, lease info) per lease. ARGV: TTL us, then one lease id per KEYS pair.
# Returns 1 (renewed) or 0 (no longer held) per lease.
RENEW = _lease_script(
    "lease_renew",
    """
local ttl = tonumber(ARGV[1])
local renewed = {}
for k = 2, #ARGV do
  local n, i = KEYS[2 * k - 3], KEYS[2 * k - 2]
  local expires = redis.call('ZSCORE', n, ARGV[k])
  if expires and tonumber(expires) > now then
    redis.call('ZADD', n, fmt(now + ttl), ARGV[k])
    refresh_lease_keys(n, i)
    renewed[#renewed + 1] = 1
  else
    renewed[#renewed + 1] = 0
  end
end
return renewed
""",
)

# KEYS: presence, the queue's five (``queue_at``), active set, [leases, lease info when
# ARGV[2] == '1'], (leases, lease info) per lease that may exist, then the queue's five per
# wake model. ARGV: request id, '1'/'0' (a lease to end), lease id, requester_stale us,
# 'fair'/'fifo', the number M of leases that may exist, their M lease ids, then the wake
# models. Returns {model, head instance, ...}.
RELEASE = _lease_script(
    "lease_release",
    """
local presence, active = KEYS[1], KEYS[7]
local rid, window, fair = ARGV[1], tonumber(ARGV[4]), ARGV[5] == 'fair'
local first = 8
if ARGV[2] == '1' then
  redis.call('ZREM', KEYS[8], ARGV[3])
  redis.call('HDEL', KEYS[9], ARGV[3])
  first = 10
end
local maybe = tonumber(ARGV[6])
for k = 1, maybe do
  redis.call('ZREM', KEYS[first], ARGV[6 + k])
  redis.call('HDEL', KEYS[first + 1], ARGV[6 + k])
  first = first + 2
end
queue_leave(queue_at(2, fair), rid)
redis.call('HDEL', active, rid)
local heads = {}
local wake_from = 7 + maybe
for k = wake_from, #ARGV do
  local _, instance = queue_head(queue_at(first + 5 * (k - wake_from), fair), presence, window)
  if instance then
    heads[#heads + 1] = ARGV[k]
    heads[#heads + 1] = instance
  end
end
return heads
""",
)

# KEYS: facts, then (leases, lease info) per node. ARGV: the node ids.
# Returns {leases, memory GB as %.17g, ...} per node.
USAGE = _lease_script(
    "lease_usage",
    """
local out = {}
for k = 1, #ARGV do
  local n, i = KEYS[2 * k], KEYS[2 * k + 1]
  drop_expired(n, i)
  local held = leases_of(n, i)
  local resident = {}
  local raw = redis.call('HGET', KEYS[1], ARGV[k])
  if raw then resident = cjson.decode(raw).resident end
  out[#out + 1] = #held
  out[#out + 1] = string.format('%.17g', in_use(resident, held))
end
return out
""",
)

# KEYS: presence, then the queue's five per model. ARGV: requester_stale us, 'fair'/'fifo'.
# Returns the length of each queue after its head is judged.
QUEUE_DEPTHS = _lease_script(
    "lease_queue_depths",
    """
local depths = {}
for k = 2, #KEYS, 5 do
  local Q = queue_at(k, ARGV[2] == 'fair')
  queue_head(Q, KEYS[1], tonumber(ARGV[1]))
  depths[#depths + 1] = redis.call('ZCARD', Q.q)
end
return depths
""",
)

# KEYS[1] facts. ARGV: node id, conn id. Drops the node's facts only if they are conn's.
DROP_FACTS = _script(
    "lease_drop_facts",
    """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw and cjson.decode(raw).conn == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
return 0
""",
)
