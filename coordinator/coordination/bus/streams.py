"""The instance bus on Redis Streams (``GEMMANET_BUS=streams``), Redis-only.

Keys (under the backend's prefix, like every other key; the scripts are in streams_scripts.py):

* ``inst:stream:{instance}`` — the inbox: a stream whose entries carry the envelope in field
  ``p``. ``send`` appends with ``XADD MAXLEN ~ maxlen`` (approximate trimming: the stream holds
  at most about ``maxlen`` + 100 entries) and gives the stream a ``retention_s`` TTL, which the
  listener keeps pushing back, so the inbox of an instance that never comes back disappears.
* ``inst:listening:{instance}`` — presence: set with a ``presence_ttl_s`` TTL when ``listen``
  opens, refreshed every ``refresh_s`` while the block is open, deleted when it closes.
* ``inst:refused:{instance}`` — the server time ``send`` last refused an envelope for it.

``send`` appends only while the target's presence key exists (atomically) and returns 1, else
it appends nothing, records the refusal and returns 0 — the same "nobody there" signal as
PUBLISH's receiver count, which the cluster uses to re-place a task at once. ``is_listening``
reads the presence key. It and the listener's refreshes run on the link's "presence" lane,
never queued behind request traffic (``send`` stays on the main one: it carries the payload).

Timing, with the defaults of ``core/liveness.py`` (TTL T = 1 s, refresh r = 0.25 s) and the
stall allowance s = (T - 2r) / 2 = 0.25 s (the arithmetic is in stall_watch.py):

* A killed listener refreshed last before it died: its key is gone at most T = 1 s after the
  kill, and from then on ``send`` answers 0 and ``is_listening`` False (to a sender that
  believes absences, below). The liveness judge adds its sweep: 1.9 s (``failover_bound_s``).
* A live listener sends each refresh r after the previous one answered, so two of them run at
  most r + late + rtt apart (late: how far behind its timer the loop ran it). Its key lives on
  while late + rtt < T - r = 0.75 s: a late refresh costs nothing up to there.
* A stall long enough to lapse a live key (Redis paused, or the box descheduling everyone,
  for T - r - late) is seen by this bus when it lasts more than r + s = 0.5 s, so it goes unseen
  only for a listener that was itself more than s late. For T after a stall seen,
  ``is_listening`` reads a missing key as "still listening" and ``send`` appends all the same
  (the listener resumes the stream when it listens again; the stream of one that never does
  expires after ``retention_s``). The price is latency: a peer really killed in or just before
  the stall is seen gone up to one T later, and is found by the membership's beats meanwhile;
  never a live peer called gone. A listener alone frozen for 0.75 s while Redis and its
  senders run is judged gone, like an instance whose beats stop for ``alive_ttl_s``.

Stall evidence (the rule of ``core/liveness.py``: silence counts over responsive time only):
a refresh of this bus's listen that failed, took longer than s or came more than r + s after
the previous one; a listen lost to a read that timed out; an ``is_listening`` or ``send`` whose
answer took longer than s; and, looked at as an absence is read, a refresh of its own that is
outstanding for more than s, or no refresh answered for r + s (a stall under way shows in a
refresh's timing only once it ends). Absence is believed again once refreshes have been prompt
for a whole T. A bus that has seen no stall (it never listened, or every refresh was prompt)
believes what it reads.

``send`` first only asks: its script appends to a present listener and refuses nothing; only
when the absence is still believed after the answer came back is the refusal made (and
recorded), else the envelope is appended after all. So a send that went out just before a
stall and came back after it refuses nothing, though its target's key lapsed in the stall.

The refusal record makes the lapse of a *live* listener explicit: a listen remembers the record
it started from, and every refresh reads it. If it changed while the listen was open (a refresh
came 0.75 s late and a sender that saw no stall was told nobody listens), the inbox raises
``CoordinationUnavailable`` like a lost connection and the re-listen is not ``resumed``, so the
cluster fails the tasks whose answers may have been refused instead of waiting for them.

``listen`` reads with ``XREAD BLOCK`` on a connection of its own, starting at the stream's end
when first opened. A lost connection makes the iterator raise ``CoordinationUnavailable``
(``CoordinationTimeout`` when the read timed out) and leaves the presence key to expire by
itself, so senders keep appending for T: a re-``listen`` (same ``StreamsBus`` object) continues
after the last entry it delivered and is ``resumed`` — nothing lost — when the refusal record is
the one its lost listen started from and the stream kept every entry after the last one read.
A Redis pause longer than T lapses the key, but every sender saw the pause and refused nothing,
so the listen resumes after it all the same (the cluster's reader listens again for as long as
Redis does not answer, ``runtime/cluster/bus_reader.py``). That is the difference from pub/sub, where a
subscriber that reconnects has missed whatever was published in between.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio

from coordinator.coordination.base import CoordinationUnavailable, Subscription
from coordinator.coordination.bus.base import Bus
from coordinator.coordination.bus.stall_watch import StallWatch
from coordinator.coordination.bus.streams_scripts import (
    FIELD,
    REFRESH,
    SEND,
    STREAM_STATE,
    ZERO,
    EntryId,
    format_id,
    parse_id,
)
from coordinator.coordination.bus.streams_scripts import entries as read_entries
from coordinator.coordination.bus.streams_scripts import payload as entry_payload
from coordinator.coordination.keys import listening_key, refused_key, stream_key
from coordinator.coordination.redis.connect.dedicated import (
    DedicatedConnection,
    dedicated_connection,
)
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.key_value import RedisKeyValue
from coordinator.core.liveness import STREAMS_PRESENCE_TTL_S, STREAMS_REFRESH_S
from coordinator.errors import CoordinationTimeout

__all__ = ["StreamInbox", "StreamsBus", "listening_key", "stream_key"]

log = logging.getLogger(__name__)

#: ``SEND``'s modes: append whatever the presence says (a stall may have expired it), append
#: to a present listener only and refuse nothing, or append to a present one and else refuse
APPEND, ASK, REFUSE = b"append", b"ask", b"refuse"


class StreamsBus(Bus):
    """``Bus`` on Redis Streams; see the module docstring. One object per process: it keeps,
    per instance id, the id of the last entry its ``listen`` delivered. One ``listen`` per
    instance id at a time."""

    def __init__(
        self,
        link: RedisLink,
        *,
        maxlen: int = 10_000,
        presence_ttl_s: float = STREAMS_PRESENCE_TTL_S,
        refresh_s: float = STREAMS_REFRESH_S,
        block_ms: int = 1000,
        read_count: int = 100,
        retention_s: float = 60.0,
    ) -> None:
        if not 0 < 2 * refresh_s < presence_ttl_s:
            raise ValueError("refresh_s must be positive and shorter than presence_ttl_s / 2")
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
        #: the refusal record the current (or lost) listen of each instance id started from
        self._refusals: dict[str, bytes | None] = {}
        #: presence evidence: whether a missing key may be believed (module docstring)
        self.watch = StallWatch(presence_ttl_s=presence_ttl_s, refresh_s=refresh_s)

    def __repr__(self) -> str:
        return f"StreamsBus({self._redis!r})"

    @property
    def resume_window_s(self) -> float:  # type: ignore[override]
        """A lost listen's presence lapses ``presence_ttl_s`` after its last refresh at the
        latest, after which a prompt sender may refuse (and record) envelopes for it; a
        re-listen that finds no refusal recorded, on a stream that kept every entry after the
        last one delivered, resumes with nothing lost."""
        return self.presence_ttl_s

    def last_delivered(self, instance_id: str) -> str | None:
        """Id of the last entry ``listen(instance_id)`` delivered (or started after)."""
        entry_id = self._last_ids.get(instance_id)
        return None if entry_id is None else format_id(entry_id).decode()

    # -- Bus --------------------------------------------------------------------------------

    async def send(self, instance_id: str, payload: bytes) -> int:
        sent = trio.current_time()
        if not self.absence_believed():
            return await self._send(instance_id, payload, APPEND)
        if await self._send(instance_id, payload, ASK):
            return 1
        # Nobody there, as the answer says. Still believed now that it is in (it came back
        # promptly, and no stall of ours showed up meanwhile)? Then refuse; else append.
        believed = self.watch.answered(sent, trio.current_time()) and self.absence_believed()
        return await self._send(instance_id, payload, REFUSE if believed else APPEND)

    async def is_listening(self, instance_id: str) -> bool:
        link, sent = self._redis, trio.current_time()
        key = link.redis_key(listening_key(instance_id))
        present = await link.guarded(
            "GET", lambda op: link.request(op, b"GET", key, lane="presence")
        )
        # Looked at after the answer came back: a slow answer, or a refresh of ours that is
        # late meanwhile, means the key may have lapsed in a stall.
        prompt = self.watch.answered(sent, trio.current_time())
        return present is not None or not (prompt and self.absence_believed())

    def absence_believed(self) -> bool:
        """Whether a missing presence key means its listener is gone: this bus saw no stall,
        or its refreshes found Redis responsive for ``presence_ttl_s`` since the last one,
        and no refresh of its own is late right now (module docstring)."""
        return self.watch.believed(trio.current_time())

    def listen(self, instance_id: str) -> AbstractAsyncContextManager[Subscription]:
        return self._listen(instance_id)

    async def held_by_live_process(self, instance_id: str) -> bool:
        """The presence key outlives a killed listener by up to ``presence_ttl_s``, so its
        existence alone cannot tell a live process from a killed one. A live one refreshes it:
        watch its TTL until it goes up (refreshed: alive) or the key is gone (its holder is
        dead and its id is free). Not refreshed, it counts down and is gone within its TTL,
        so the wait is at most one TTL, however late a live listener's refreshes come."""
        key = self._redis.redis_key(listening_key(instance_id))
        previous = await self._pttl(key)
        deadline = trio.current_time() + self.presence_ttl_s + self.refresh_s
        while previous >= 0:
            if trio.current_time() > deadline:
                return True  # never counted down to nothing: somebody keeps it
            await trio.sleep(self.refresh_s / 2)
            current = await self._pttl(key)
            if current > previous:
                return True
            previous = current
        return False

    async def _pttl(self, key: str) -> int:
        return int(await self._redis.execute("PTTL", b"PTTL", key))

    # -- internals --------------------------------------------------------------------------

    @staticmethod
    def _ms(seconds: float) -> int:
        return max(1, round(seconds * 1000))

    def _inbox_keys(self, instance_id: str) -> list[str]:
        """The keys every script of an inbox takes (streams_scripts.py), in their order."""
        key = self._redis.redis_key
        return [
            key(listening_key(instance_id)),
            self._stream(instance_id),
            key(refused_key(instance_id)),
        ]

    def _stream(self, instance_id: str) -> str:
        return self._redis.redis_key(stream_key(instance_id))

    async def _send(self, instance_id: str, payload: bytes, mode: bytes) -> int:
        reply = await self._redis.run_script(
            SEND,
            self._inbox_keys(instance_id),
            [payload, self.maxlen, self._ms(self.retention_s), mode],
        )
        return int(reply)

    @asynccontextmanager
    async def _listen(self, instance_id: str) -> AsyncIterator[StreamInbox]:
        presence = listening_key(instance_id)
        # A re-listen after a lost one takes over its presence token (the close deletes the
        # presence only while it holds that token) and compares the refusal record with the
        # one the lost listen started from. Nothing of that changes until the listen is open:
        # an attempt that fails (Redis silent) leaves the next one the same to go by.
        lost_token = self._lost_tokens.get(instance_id)
        token = lost_token or secrets.token_hex(8).encode()
        async with dedicated_connection(self._redis, self._redis.redis_key(presence)) as connection:
            start, gapless = await self._start_after(instance_id)
            # Present only once the start id is fixed: whatever is appended from now on
            # comes after it.
            record = await self._probe(instance_id, token)
            self._lost_tokens.pop(instance_id, None)
            self._last_ids[instance_id] = start
            unrefused = instance_id in self._refusals and self._refusals[instance_id] == record
            self._refusals[instance_id] = record
            inbox = StreamInbox(self, instance_id, connection)
            inbox.resumed = lost_token is not None and unrefused and gapless
            keep_present = trio.CancelScope()
            self._redis.start_soon(self._keep_present, instance_id, token, inbox, keep_present)
            try:
                yield inbox
            finally:
                keep_present.cancel()
                if inbox.lost:
                    self._lost_tokens[instance_id] = token
                    if inbox.timed_out:  # Redis stalled: count again from the next refresh
                        self.watch.read_timed_out()
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
        top = parse_id(state[0]) if state and int(state[2]) > 0 else None
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
        return last, never_trimmed or parse_id(state[1]) <= last

    async def _probe(self, instance_id: str, token: bytes) -> bytes | None:
        """Set the presence (and push back the stream's TTL), timed: the evidence
        ``absence_believed`` goes by. Returns the refusal record."""
        self.watch.refresh_sent(trio.current_time())
        try:
            record = await self._redis.run_script(
                REFRESH,
                self._inbox_keys(instance_id),
                [token, self._ms(self.presence_ttl_s), self._ms(self.retention_s)],
                lane="presence",
            )
        except CoordinationUnavailable:
            self.watch.refresh_failed()
            raise
        except BaseException:
            self.watch.refresh_cancelled(trio.current_time())
            raise
        self.watch.refresh_done(trio.current_time())
        return record if isinstance(record, bytes) else None

    async def _keep_present(
        self, instance_id: str, token: bytes, inbox: StreamInbox, scope: trio.CancelScope
    ) -> None:
        with scope:
            self.watch.keeping_present = True
            try:
                while True:
                    await trio.sleep(self.refresh_s)
                    try:
                        record = await self._probe(instance_id, token)
                    except CoordinationUnavailable as exc:
                        log.debug(
                            "could not refresh the presence of inbox %s: %s", instance_id, exc
                        )
                        continue
                    if record != self._refusals.get(instance_id):
                        log.warning(
                            "inbox %s: its presence lapsed and an envelope for it was refused",
                            instance_id,
                        )
                        inbox.cut()
                        return
            finally:
                self.watch.keeping_present = False

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
            format_id(self._last_ids[instance_id]),
            timeout_s=self.block_ms / 1000 + self._redis.op_timeout_s,
        )
        return read_entries(reply)


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
        #: an envelope was refused while the listen was open: raise like a lost connection
        self.refused = False
        self._reading: trio.CancelScope | None = None

    def cut(self) -> None:
        """An envelope for this inbox was refused: end the listen as lost (see the module
        docstring), after delivering what was already read."""
        self.refused = True
        if self._reading is not None:
            self._reading.cancel()

    def __aiter__(self) -> StreamInbox:
        return self

    async def __anext__(self) -> bytes:
        last_ids = self._bus._last_ids
        while True:
            while self._buffer:
                entry_id, found = self._buffer.popleft()
                last_ids[self._instance_id] = entry_id
                if found is not None:
                    return found
                log.warning(
                    "skipped entry %s of inbox %s: no %r field", entry_id, self._instance_id, FIELD
                )
            if self.refused:
                self.lost = True
            if self.lost:
                raise self._lost_error()
            scope = self._reading = trio.CancelScope()
            try:
                with scope:
                    batch = await self._bus._read(self._instance_id, self._connection)
            except CoordinationUnavailable as exc:
                self.lost = True
                self.timed_out = isinstance(exc, CoordinationTimeout)
                raise self._lost_error() from exc
            finally:
                self._reading = None
            if scope.cancelled_caught:
                continue  # cut: raised above
            for raw_id, fields in batch:
                self._buffer.append((parse_id(raw_id), entry_payload(fields)))

    def _lost_error(self) -> CoordinationUnavailable:
        message = (
            f"lost the Redis stream inbox of {self._instance_id!r}"
            + (" (an envelope for it was refused)" if self.refused else "")
            + f"; listening again resumes after entry {self._bus.last_delivered(self._instance_id)}"
        )
        # A read that timed out: Redis is silent, not gone (the cluster's reader waits it out).
        return CoordinationTimeout(message) if self.timed_out else CoordinationUnavailable(message)
