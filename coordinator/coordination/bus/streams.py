"""The instance bus on Redis Streams (``GEMMANET_BUS=streams``), Redis-only.

Keys (under the backend's prefix, like every other key):

* ``inst:stream:{instance}`` — the inbox: a stream whose entries carry the envelope in field
  ``p``. ``send`` appends with ``XADD MAXLEN ~ maxlen`` (approximate trimming: the stream holds
  at most about ``maxlen`` + 100 entries) and gives the stream a ``retention_s`` TTL, which the
  listener keeps pushing back, so the inbox of an instance that never comes back disappears.
* ``inst:listening:{instance}`` — presence: set with a ``presence_ttl_s`` TTL when ``listen``
  opens, refreshed every ``refresh_s`` while the block is open, deleted when it closes.

``send`` appends only while the target's presence key exists (one Lua script, atomic) and
returns 1, else it appends nothing and returns 0 — the same "nobody there" signal as PUBLISH's
receiver count, which the cluster uses to re-place a task at once. ``is_listening`` reads the
presence key, so a killed instance (whose key is no longer refreshed) reads as gone at most
``presence_ttl_s`` after its last refresh.

A missing presence key is believed only after Redis was seen responsive for a whole
``presence_ttl_s`` (the rule of ``core/liveness.py``: silence counts over responsive time
only). A Redis paused for longer than the TTL lets every live listener's key expire at once, and
the first reads after it may come before their refreshes. So this bus watches its own refreshes
(its listen's, every ``refresh_s``): one that failed, took longer than ``stall_s`` or came more
than ``refresh_s + stall_s`` after the previous one, or a listen lost to a read that timed out,
is a stall, and the count starts again at the next refresh that succeeds. Until it reaches
``presence_ttl_s``, ``is_listening`` reads a missing key as "still listening" and ``send``
appends all the same (the listener resumes the stream when it listens again; the stream of one
that never does expires after ``retention_s``): a peer that is really gone is then found by
the membership's beats. A bus that has seen no stall (it never listened, or every refresh was
prompt) believes what it reads.

``listen`` reads with ``XREAD BLOCK`` on a connection of its own, starting at the stream's end
when first opened. A lost connection makes the iterator raise ``CoordinationUnavailable`` and
leaves the presence key to expire by itself, so senders keep appending for ``presence_ttl_s``:
a re-``listen`` (same ``StreamsBus`` object) continues after the last entry it delivered and
loses nothing that was sent meanwhile. That is the difference from pub/sub, where a subscriber
that reconnects has missed whatever was published in between.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio

from coordinator.coordination.base import CoordinationUnavailable, Subscription
from coordinator.coordination.bus.base import Bus
from coordinator.coordination.keys import listening_key, stream_key
from coordinator.coordination.redis.connect.dedicated import (
    DedicatedConnection,
    dedicated_connection,
)
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.key_value import RedisKeyValue
from coordinator.coordination.redis.scripts import LuaScript
from coordinator.errors import CoordinationTimeout

__all__ = ["StreamInbox", "StreamsBus", "listening_key", "stream_key"]

log = logging.getLogger(__name__)

FIELD = b"p"

EntryId = tuple[int, int]
ZERO: EntryId = (0, 0)

# KEYS[1] presence key, KEYS[2] stream; ARGV[1] payload, ARGV[2] MAXLEN, ARGV[3] stream TTL ms,
# ARGV[4] '1' when the sender cannot believe an absent presence (a stall may have expired it):
# then it appends all the same.
SEND = LuaScript(
    "streams_bus_send",
    b"""
if redis.call('EXISTS', KEYS[1]) == 0 and ARGV[4] ~= '1' then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'p', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
""".strip(),
)

# KEYS[1] presence key, KEYS[2] stream; ARGV[1] token, ARGV[2] presence TTL ms,
# ARGV[3] stream TTL ms. Returns 1 when the presence already held this token (it never lapsed,
# so no sender was told that nobody listens), else 0.
REFRESH = LuaScript(
    "streams_bus_refresh",
    b"""
local held = redis.call('GET', KEYS[1]) == ARGV[1]
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if held then return 1 end
return 0
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


def _parse_id(raw: bytes | str) -> EntryId:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _format_id(entry_id: EntryId) -> bytes:
    return b"%d-%d" % entry_id


def _entries(reply: Any) -> list[Any]:
    """The entries of a one-stream XREAD reply (RESP3 map or RESP2 array; None: timed out)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [entry for entries in reply.values() for entry in entries]
    return [entry for _, entries in reply for entry in entries]


def _payload(fields: Any) -> bytes | None:
    if isinstance(fields, dict):
        value = fields.get(FIELD)
        return value if isinstance(value, bytes) else None
    values = list(fields)
    for i in range(0, len(values) - 1, 2):
        if values[i] == FIELD and isinstance(values[i + 1], bytes):
            return values[i + 1]  # type: ignore[no-any-return]
    return None


class StreamsBus(Bus):
    """``Bus`` on Redis Streams; see the module docstring. One object per process: it keeps,
    per instance id, the id of the last entry its ``listen`` delivered. One ``listen`` per
    instance id at a time."""

    def __init__(
        self,
        link: RedisLink,
        *,
        maxlen: int = 10_000,
        presence_ttl_s: float = 2.0,
        refresh_s: float = 0.5,
        block_ms: int = 1000,
        read_count: int = 100,
        retention_s: float = 60.0,
    ) -> None:
        if not 0 < refresh_s < presence_ttl_s:
            raise ValueError("refresh_s must be positive and shorter than presence_ttl_s")
        if maxlen < 1 or read_count < 1 or block_ms < 1:
            raise ValueError("maxlen, read_count and block_ms must be positive")
        if not retention_s > presence_ttl_s:
            raise ValueError("retention_s must be longer than presence_ttl_s")
        self._redis = link
        self._keys = RedisKeyValue(link)
        self.maxlen = maxlen
        self.presence_ttl_s = presence_ttl_s
        self.refresh_s = refresh_s
        self.block_ms = block_ms
        self.read_count = read_count
        self.retention_s = retention_s
        self._last_ids: dict[str, EntryId] = {}
        #: the presence token of a listen that was lost, per instance id, for its re-listen
        self._lost_tokens: dict[str, bytes] = {}
        # Presence evidence (module docstring): a refresh slower than this, or this much later
        # than due, is a stall (half the slack a live key has before it expires)
        self.stall_s = (presence_ttl_s - refresh_s) / 2
        # since when Redis was seen responsive without a stall (None: trouble right now; -inf:
        # no stall seen yet)
        self._responsive_since: float | None = -math.inf
        self._last_refresh_at: float | None = None

    def __repr__(self) -> str:
        return f"StreamsBus({self._redis!r})"

    @property
    def resume_window_s(self) -> float:  # type: ignore[override]
        """A lost listen's presence lapses ``presence_ttl_s`` after its last refresh at the
        latest; a re-listen before that, on a stream that kept every entry after the last one
        delivered, resumes with nothing lost."""
        return self.presence_ttl_s

    def last_delivered(self, instance_id: str) -> str | None:
        """Id of the last entry ``listen(instance_id)`` delivered (or started after)."""
        entry_id = self._last_ids.get(instance_id)
        return None if entry_id is None else _format_id(entry_id).decode()

    # -- Bus --------------------------------------------------------------------------------

    async def send(self, instance_id: str, payload: bytes) -> int:
        unsure = "0" if self.absence_believed() else "1"
        reply = await self._redis.run_script(
            SEND,
            [self._redis.redis_key(listening_key(instance_id)), self._stream(instance_id)],
            [payload, self.maxlen, self._ms(self.retention_s), unsure],
        )
        return int(reply)

    async def is_listening(self, instance_id: str) -> bool:
        present = await self._keys.get(listening_key(instance_id)) is not None
        return present or not self.absence_believed()

    def absence_believed(self) -> bool:
        """Whether a missing presence key means its listener is gone: this bus saw no stall,
        or its refreshes found Redis responsive for ``presence_ttl_s`` since the last one
        (module docstring)."""
        since = self._responsive_since
        return since is not None and trio.current_time() - since >= self.presence_ttl_s

    def listen(self, instance_id: str) -> AbstractAsyncContextManager[Subscription]:
        return self._listen(instance_id)

    async def held_by_live_process(self, instance_id: str) -> bool:
        """The presence key outlives a killed listener by up to ``presence_ttl_s``, so its
        existence alone cannot tell a live process from a killed one. A live one refreshes it
        every ``refresh_s``: watch its TTL for two refresh periods; refreshed means alive,
        counting down (or gone) means the holder is dead and its id is free."""
        key = self._redis.redis_key(listening_key(instance_id))
        first = await self._pttl(key)
        if first < 0:
            return False
        waited = 2 * self.refresh_s
        await trio.sleep(waited)
        second = await self._pttl(key)
        # Not refreshed: second ~ first - waited. Refreshed: second >= ttl - refresh_s.
        return second >= 0 and second > first - self._ms(waited) + self._ms(self.refresh_s) / 2

    async def _pttl(self, key: str) -> int:
        return int(await self._redis.execute("PTTL", b"PTTL", key))

    # -- internals --------------------------------------------------------------------------

    @staticmethod
    def _ms(seconds: float) -> int:
        return max(1, round(seconds * 1000))

    def _stream(self, instance_id: str) -> str:
        return self._redis.redis_key(stream_key(instance_id))

    @asynccontextmanager
    async def _listen(self, instance_id: str) -> AsyncIterator[StreamInbox]:
        presence = listening_key(instance_id)
        # A re-listen after a lost one takes over its presence token: finding the presence
        # still holding it proves no sender was told "nobody listens" in between.
        lost_token = self._lost_tokens.pop(instance_id, None)
        token = lost_token or secrets.token_hex(8).encode()
        async with dedicated_connection(self._redis, self._redis.redis_key(presence)) as connection:
            start, gapless = await self._start_after(instance_id)
            self._last_ids[instance_id] = start
            # Present only once the start id is fixed: whatever is appended from now on
            # comes after it.
            presence_held = await self._probe(instance_id, token)
            inbox = StreamInbox(self, instance_id, connection)
            inbox.resumed = lost_token is not None and presence_held and gapless
            keep_present = trio.CancelScope()
            self._redis.start_soon(self._keep_present, instance_id, token, keep_present)
            try:
                yield inbox
            finally:
                keep_present.cancel()
                if inbox.lost:
                    self._lost_tokens[instance_id] = token
                    if inbox.timed_out:  # Redis stalled: count again from the next refresh
                        self._responsive_since = None
                else:
                    # Closed on purpose: senders learn at once that nobody listens. (After a
                    # lost connection the key expires by itself, so that what is sent until
                    # then waits for a re-listen.)
                    with trio.move_on_after(self._redis.op_timeout_s, shield=True):
                        try:
                            await self._keys.compare_and_set(presence, token, None)
                        except CoordinationUnavailable:
                            pass

    async def _start_after(self, instance_id: str) -> tuple[EntryId, bool]:
        """Where a listen starts: after the last delivered entry, or at the stream's current
        end when this object never listened there (older entries were not meant for us).
        And whether nothing after the last delivered entry can be missing."""
        state = await self._redis.run_script(STREAM_STATE, [self._stream(instance_id)], [])
        top = _parse_id(state[0]) if state and int(state[2]) > 0 else None
        last = self._last_ids.get(instance_id)
        if last is None:
            return top or ZERO, False
        if top is None or top < last:
            # The stream was recreated since (it expired, or Redis restarted without its
            # data): every entry in it is new to us, and what it held before is gone.
            return ZERO, False
        # MAXLEN trimming may have dropped entries never read: nothing is missing when the
        # stream was never trimmed, or when its oldest entry is not newer than the last read.
        never_trimmed = int(state[3]) == int(state[2])
        return last, never_trimmed or _parse_id(state[1]) <= last

    async def _refresh(self, instance_id: str, token: bytes) -> bool:
        """Set the presence (and push back the stream's TTL); whether it already held
        ``token``."""
        held = await self._redis.run_script(
            REFRESH,
            [self._redis.redis_key(listening_key(instance_id)), self._stream(instance_id)],
            [token, self._ms(self.presence_ttl_s), self._ms(self.retention_s)],
        )
        return bool(int(held))

    async def _probe(self, instance_id: str, token: bytes) -> bool:
        """``_refresh``, timed: the evidence ``absence_believed`` goes by."""
        sent = trio.current_time()
        try:
            held = await self._refresh(instance_id, token)
        except CoordinationUnavailable:
            self._responsive_since = self._last_refresh_at = None
            raise
        except BaseException:
            # Cancelled (the listen ended): a stall only if it had been waiting that long.
            if trio.current_time() - sent > self.stall_s:
                self._responsive_since = self._last_refresh_at = None
            raise
        done = trio.current_time()
        previous, self._last_refresh_at = self._last_refresh_at, done
        prompt = done - sent <= self.stall_s and (
            previous is None or done - previous <= self.refresh_s + self.stall_s
        )
        if not prompt or self._responsive_since is None:
            self._responsive_since = done
        return held

    async def _keep_present(self, instance_id: str, token: bytes, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                await trio.sleep(self.refresh_s)
                try:
                    await self._probe(instance_id, token)
                except CoordinationUnavailable as exc:
                    log.debug("could not refresh the presence of inbox %s: %s", instance_id, exc)

    async def _read(self, instance_id: str, connection: DedicatedConnection) -> list[Any]:
        reply = await connection.execute(
            "XREAD",
            b"XREAD",
            b"COUNT",
            self.read_count,
            b"BLOCK",
            self.block_ms,
            b"STREAMS",
            self._stream(instance_id),
            _format_id(self._last_ids[instance_id]),
            timeout_s=self.block_ms / 1000 + self._redis.op_timeout_s,
        )
        return _entries(reply)


class StreamInbox(Subscription):
    """Payloads of one instance's stream, in order, read in batches on a dedicated connection."""

    def __init__(self, bus: StreamsBus, instance_id: str, connection: DedicatedConnection) -> None:
        self._bus = bus
        self._instance_id = instance_id
        self._connection = connection
        self._buffer: deque[tuple[EntryId, bytes | None]] = deque()
        #: the connection was lost; the iterator raised CoordinationUnavailable
        self.lost = False
        #: ... because a read timed out (Redis stalled), not because the connection closed
        self.timed_out = False

    def __aiter__(self) -> StreamInbox:
        return self

    async def __anext__(self) -> bytes:
        last_ids = self._bus._last_ids
        while True:
            while self._buffer:
                entry_id, payload = self._buffer.popleft()
                last_ids[self._instance_id] = entry_id
                if payload is not None:
                    return payload
                log.warning(
                    "skipped entry %s of inbox %s: no %r field", entry_id, self._instance_id, FIELD
                )
            if self.lost:
                raise self._lost_error()
            try:
                entries = await self._bus._read(self._instance_id, self._connection)
            except CoordinationUnavailable as exc:
                self.lost = True
                self.timed_out = isinstance(exc, CoordinationTimeout)
                raise self._lost_error() from exc
            for raw_id, fields in entries:
                self._buffer.append((_parse_id(raw_id), _payload(fields)))

    def _lost_error(self) -> CoordinationUnavailable:
        return CoordinationUnavailable(
            f"lost the Redis stream inbox of {self._instance_id!r}; listening again resumes "
            f"after entry {self._bus.last_delivered(self._instance_id)}"
        )
