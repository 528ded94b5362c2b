"""The admission queue's part of the lease scripts' Lua prelude (``lease_scripts.py`` puts it
after ``now``, ``fmt`` and ``alive``): a model's queue in both orders of
``AdmissionRules.queue_policy`` (``coordination/leases.py``, *The queue's order*), the same
semantics as ``memory/queues.py``.

A queue is five keys (``keys.lease_queue_keys``), a Lua table ``Q`` made by ``queue_at``:
``q`` request id -> sequence number, ``qi`` request id -> its record, and for ``fair`` ``qk``
(each entry as ``"key\\tseq\\trid"`` at score 0, so a key's entries are a lex range, oldest
first), ``qr`` the ring of keys (a list, its front first) and ``qd`` key -> ``"deficit\\tweight"``.
The functions: ``queue_head`` (the usable head, dropping dead or expired heads), ``queue_peek``
(the head as it stands),
``queue_leave``, ``queue_granted`` (the head was granted: its key spends one of its turn),
``queue_join`` and ``queue_position`` (grants before a request if nothing else arrives).
"""

from __future__ import annotations

__all__ = ["QUEUE_LUA"]

QUEUE_LUA = """
-- A model's queue: KEYS from ``at`` on are its order (request id -> sequence number, first
-- come first served), its entries' records, and for the fair order the per-key order (lex:
-- "key\\tseq\\trid" at score 0), the ring of keys (a list, its front first) and each ring key's
-- "deficit\\tweight".
local function queue_at(at, fair)
  return {q = KEYS[at], qi = KEYS[at + 1], qk = KEYS[at + 2], qr = KEYS[at + 3],
    qd = KEYS[at + 4], fair = fair}
end
local function info_of(info)
  return string.match(info, '^([^\\t]*)\\t([^\\t]*)\\t?(.*)$')
end
local function member_of(key, seq, rid)
  return key .. '\\t' .. string.format('%015.0f', seq) .. '\\t' .. rid
end
local function key_range(key) return '[' .. key .. '\\t', '(' .. key .. '\\t\\255' end
local function key_count(Q, key)
  local from, to = key_range(key)
  return redis.call('ZLEXCOUNT', Q.qk, from, to)
end
-- fair: drop one entry (its per-key member given); a key left without entries leaves the ring
local function fair_drop(Q, key, member, rid)
  redis.call('ZREM', Q.qk, member)
  redis.call('ZREM', Q.q, rid)
  redis.call('HDEL', Q.qi, rid)
  if key_count(Q, key) == 0 then
    redis.call('LREM', Q.qr, 1, key)
    redis.call('HDEL', Q.qd, key)
  end
end
-- An entry leaves the queue (released, refused, dropped): no deficit spent.
local function queue_leave(Q, rid)
  if Q.fair then
    local seq = redis.call('ZSCORE', Q.q, rid)
    local info = redis.call('HGET', Q.qi, rid)
    if seq and info then
      local _, _, key = info_of(info)
      fair_drop(Q, key, member_of(key, tonumber(seq), rid), rid)
      return
    end
  end
  redis.call('ZREM', Q.q, rid)
  redis.call('HDEL', Q.qi, rid)
end
-- fair: the front key and its oldest entry's member and request id, or nil
local function fair_front(Q)
  while true do
    local key = redis.call('LINDEX', Q.qr, 0)
    if not key then return nil end
    local from, to = key_range(key)
    local first = redis.call('ZRANGEBYLEX', Q.qk, from, to, 'LIMIT', 0, 1)
    if #first > 0 then
      return key, first[1], string.match(first[1], '^[^\\t]*\\t[^\\t]*\\t(.*)$')
    end
    redis.call('LPOP', Q.qr)
    redis.call('HDEL', Q.qd, key)
  end
end
-- The request id first in the queue as it stands (not judged: nothing is dropped), or nil.
local function queue_peek(Q)
  if Q.fair then
    local _, _, rid = fair_front(Q)
    return rid
  end
  return redis.call('ZRANGE', Q.q, 0, 0)[1]
end
-- The queue's head request id and instance after dropping expired or dead heads (entries
-- further back go when they reach the head), or nil when the queue is empty.
local function queue_head(Q, presence, window)
  while true do
    local head, key, member
    if Q.fair then
      key, member, head = fair_front(Q)
      if not key then return nil end
    else
      local first = redis.call('ZRANGE', Q.q, 0, 0)
      if #first == 0 then return nil end
      head = first[1]
    end
    local info = redis.call('HGET', Q.qi, head)
    if info then
      local expires, instance = info_of(info)
      if tonumber(expires) > now and alive(presence, instance, window) then
        return head, instance
      end
    end
    if Q.fair then fair_drop(Q, key, member, head) else queue_leave(Q, head) end
  end
end
-- The head was granted: under fair its key spends one of its turn (at 0 it goes to the back
-- of the ring with its weight again).
local function queue_granted(Q, rid)
  if not Q.fair then return queue_leave(Q, rid) end
  local key, member, head = fair_front(Q)
  if head ~= rid then return queue_leave(Q, rid) end
  fair_drop(Q, key, member, rid)
  if key_count(Q, key) == 0 then return end
  -- (a ring key always has its deficit; '1\\t1' only keeps a damaged queue serving)
  local d, w = string.match(redis.call('HGET', Q.qd, key) or '1\\t1', '^(%d+)\\t(%d+)$')
  d = tonumber(d) - 1
  if d <= 0 then
    redis.call('LPOP', Q.qr)
    redis.call('RPUSH', Q.qr, key)
    d = w
  end
  redis.call('HSET', Q.qd, key, d .. '\\t' .. w)
end
local function queue_join(Q, rid, seq, expires, instance, key, weight)
  redis.call('ZADD', Q.q, fmt(seq), rid)
  if not Q.fair then
    redis.call('HSET', Q.qi, rid, fmt(expires) .. '\\t' .. instance)
    return
  end
  redis.call('HSET', Q.qi, rid, fmt(expires) .. '\\t' .. instance .. '\\t' .. key)
  redis.call('ZADD', Q.qk, 0, member_of(key, seq, rid))
  local dw = redis.call('HGET', Q.qd, key)
  if dw then
    local d = string.match(dw, '^(%d+)\\t')
    redis.call('HSET', Q.qd, key, d .. '\\t' .. weight)
  else
    redis.call('RPUSH', Q.qr, key)
    redis.call('HSET', Q.qd, key, weight .. '\\t' .. weight)
  end
end
-- Grants before rid (queued) if nothing else arrives (memory/queues.py says how).
local function queue_position(Q, rid)
  local info = redis.call('HGET', Q.qi, rid)
  if not Q.fair or not info then return redis.call('ZRANK', Q.q, rid) end
  local _, _, mine = info_of(info)
  local from = key_range(mine)
  local index = redis.call('ZLEXCOUNT', Q.qk, from,
    '(' .. member_of(mine, tonumber(redis.call('ZSCORE', Q.q, rid)), rid))
  local ring = redis.call('LRANGE', Q.qr, 0, -1)
  if #ring == 0 then return redis.call('ZRANK', Q.q, rid) end
  local dws = redis.call('HMGET', Q.qd, unpack(ring))
  local deficit, weight, me = {}, {}, 0
  for k, key in ipairs(ring) do
    local d, w = string.match(dws[k] or '1\\t1', '^(%d+)\\t(%d+)$')
    deficit[k], weight[k] = tonumber(d), tonumber(w)
    if key == mine then me = k end
  end
  if me == 0 then return redis.call('ZRANK', Q.q, rid) end
  local turn = 0
  if index >= deficit[me] then turn = 1 + math.floor((index - deficit[me]) / weight[me]) end
  local ahead = index
  for k, key in ipairs(ring) do
    if k ~= me then
      local turns = turn
      if k < me then turns = turns + 1 end
      if turns > 0 then
        ahead = ahead + math.min(key_count(Q, key), deficit[k] + (turns - 1) * weight[k])
      end
    end
  end
  return ahead
end
"""
