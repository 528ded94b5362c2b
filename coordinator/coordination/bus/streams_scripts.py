"""The Lua scripts of ``StreamsBus`` (bus/streams.py) and the parsing of its replies.

Each script takes the same three keys of one inbox, in this order: the presence key
``inst:listening:{instance}``, the stream ``inst:stream:{instance}`` and the refusal record
``inst:refused:{instance}`` (``keys.py``), so each is one atomic step on one slot.
"""

from __future__ import annotations

from typing import Any

from coordinator.coordination.redis.scripts import LuaScript

__all__ = [
    "FIELD",
    "REFRESH",
    "SEND",
    "STREAM_STATE",
    "ZERO",
    "EntryId",
    "entries",
    "format_id",
    "parse_id",
    "payload",
]

FIELD = b"p"

EntryId = tuple[int, int]
ZERO: EntryId = (0, 0)

# ARGV[1] payload, ARGV[2] MAXLEN, ARGV[3] stream TTL ms, ARGV[4] the mode: 'append' (the
# sender cannot believe an absent presence, a stall may have expired it: append all the same),
# 'ask' (append to a present listener, else nothing) or 'refuse' (append to a present listener,
# else refuse). A refusal is recorded (server time, in the refusal record): a listener alive
# after all learns from it that something meant for it was not kept. The record lives as long
# as the stream (every append and refresh pushes both back).
SEND = LuaScript(
    "streams_bus_send",
    b"""
if redis.call('EXISTS', KEYS[1]) == 0 and ARGV[4] ~= 'append' then
  if ARGV[4] == 'refuse' then
    local now = redis.call('TIME')
    redis.call('SET', KEYS[3], now[1] .. '.' .. now[2], 'PX', ARGV[3])
  end
  return 0
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'p', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
""".strip(),
)

# ARGV[1] token, ARGV[2] presence TTL ms, ARGV[3] stream TTL ms. Sets the presence and returns
# the refusal record (nil: no refusal on record). The listener compares it with the one its
# listen started from: the same, and no sender was told that nobody listens, whether or not
# the presence lapsed meanwhile (a Redis pause lets it lapse with every sender unsure).
REFRESH = LuaScript(
    "streams_bus_refresh",
    b"""
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return redis.call('GET', KEYS[3])
""".strip(),
)

# KEYS[1] stream. Returns {} when it does not exist, else {newest id, oldest id, length,
# entries ever added (-1 before Redis 7)}: one atomic look, so a trim cannot fall in between.
STREAM_STATE = LuaScript(
    "streams_bus_state",
    b"""
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local state = {'0-0', '0-0', 0, -1}
for i = 1, #info, 2 do
  local name, value = info[i], info[i + 1]
  if name == 'last-entry' and value then state[1] = value[1]
  elseif name == 'first-entry' and value then state[2] = value[1]
  elseif name == 'length' then state[3] = value
  elseif name == 'entries-added' then state[4] = value end
end
return state
""".strip(),
)


def parse_id(raw: bytes | str) -> EntryId:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(entry_id: EntryId) -> bytes:
    return b"%d-%d" % entry_id


def entries(reply: Any) -> list[Any]:
    """The entries of a one-stream XREAD reply (RESP3 map or RESP2 array; None: timed out)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [entry for found in reply.values() for entry in found]
    return [entry for _, found in reply for entry in found]


def payload(fields: Any) -> bytes | None:
    if isinstance(fields, dict):
        value = fields.get(FIELD)
        return value if isinstance(value, bytes) else None
    values = list(fields)
    for i in range(0, len(values) - 1, 2):
        if values[i] == FIELD and isinstance(values[i + 1], bytes):
            return values[i + 1]  # type: ignore[no-any-return]
    return None
