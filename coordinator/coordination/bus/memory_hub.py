"""The state behind ``MemoryBus`` (bus/memory.py): every inbox of one process, on one clock.

Plain synchronous methods, each atomic; ``MemoryBus`` checkpoints once per call, then runs one
of them. It reads only the injected clock and iterates only insertion-ordered dicts, so the
simulator gets the same trace for the same seed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

__all__ = ["ZERO", "Clock", "MemoryBusHub", "Sink"]

Clock = Callable[[], float]
#: a pub/sub listener as the hub sees it: offered each payload, False when it had to drop it
Sink = Callable[[bytes], bool]
#: "before every entry": entry ids start at 1
ZERO = 0


@dataclass(slots=True)
class _Stream:
    entries: deque[tuple[int, bytes]] = field(default_factory=deque)
    deadline: float = 0.0
    #: MAXLEN ever dropped an entry (Redis: fewer entries than ever added)
    trimmed: bool = False


@dataclass(slots=True)
class _Presence:
    token: int
    deadline: float


class MemoryBusHub:
    """Inboxes of every instance in this process, on one clock."""

    def __init__(self, clock: Clock = trio.current_time) -> None:
        self._clock = clock
        # Insertion-ordered dicts throughout: delivery and expiry order are deterministic.
        self._listeners: dict[str, dict[int, Sink]] = {}
        self._streams: dict[str, _Stream] = {}
        self._presence: dict[str, _Presence] = {}
        self._appended: dict[str, trio.Event] = {}
        #: envelopes ``append`` refused for want of a presence, per inbox (StreamsBus's
        #: refusal record: a listen compares it with the count it started from)
        self._refused: dict[str, int] = {}
        self._next_token = 1
        self._next_entry_id = 1
        #: pub/sub payloads lost because a listener's buffer was full
        self.dropped = 0

    def _tick(self) -> float:
        """Read the clock once for this call and forget presences and inboxes past their TTL.
        (A scan, not a heap: there are as many of them as instances.)"""
        now = self._clock()
        for instance_id in [i for i, p in self._presence.items() if p.deadline <= now]:
            del self._presence[instance_id]
        for instance_id in [i for i, s in self._streams.items() if s.deadline <= now]:
            del self._streams[instance_id]
        return now

    def new_token(self) -> int:
        token, self._next_token = self._next_token, self._next_token + 1
        return token

    # -- pub/sub ------------------------------------------------------------------------------

    def add_listener(self, instance_id: str, sink: Sink) -> int:
        token = self.new_token()
        self._listeners.setdefault(instance_id, {})[token] = sink
        return token

    def remove_listener(self, instance_id: str, token: int) -> None:
        sinks = self._listeners.get(instance_id)
        if sinks is None:
            return
        sinks.pop(token, None)
        if not sinks:
            del self._listeners[instance_id]

    def publish(self, instance_id: str, payload: bytes) -> int:
        """Offer ``payload`` to every open listener; how many there were (a full one counts,
        as with Redis PUBLISH: it is alive, just slow)."""
        sinks = list(self._listeners.get(instance_id, {}).values())
        for sink in sinks:
            if not sink(payload):
                self.dropped += 1
        return len(sinks)

    def listener_count(self, instance_id: str) -> int:
        return len(self._listeners.get(instance_id, {}))

    # -- durable inboxes ----------------------------------------------------------------------

    def present(self, instance_id: str) -> bool:
        self._tick()
        return instance_id in self._presence

    def refresh(self, instance_id: str, token: int, ttl_s: float, retention_s: float) -> int:
        """Set the presence (whoever held it) and push back the inbox's expiry. How many
        envelopes for the inbox were refused so far (as StreamsBus's refusal record)."""
        now = self._tick()
        self._presence[instance_id] = _Presence(token, now + ttl_s)
        stream = self._streams.get(instance_id)
        if stream is not None:
            stream.deadline = now + retention_s
        return self._refused.get(instance_id, 0)

    def lapse(self, instance_id: str) -> None:
        """The presence expires now, as if its refreshes had stopped for a TTL (a fault the
        tests inflict on a listen that goes on)."""
        self._presence.pop(instance_id, None)

    def withdraw(self, instance_id: str, token: int) -> None:
        """Delete the presence if it is still ``token``'s (a newer listen's stays)."""
        self._tick()
        presence = self._presence.get(instance_id)
        if presence is not None and presence.token == token:
            del self._presence[instance_id]

    def append(self, instance_id: str, payload: bytes, *, maxlen: int, retention_s: float) -> int:
        """Append while the presence exists (1), else nothing (0: refused, and counted)."""
        now = self._tick()
        if instance_id not in self._presence:
            self._refused[instance_id] = self._refused.get(instance_id, 0) + 1
            return 0
        stream = self._streams.get(instance_id)
        if stream is None:
            stream = self._streams[instance_id] = _Stream()
        stream.entries.append((self._next_entry_id, bytes(payload)))
        self._next_entry_id += 1
        while len(stream.entries) > maxlen:
            stream.entries.popleft()
            stream.trimmed = True
        stream.deadline = now + retention_s
        self.wake(instance_id)
        return 1

    def last_id(self, instance_id: str) -> int | None:
        self._tick()
        stream = self._streams.get(instance_id)
        return stream.entries[-1][0] if stream is not None and stream.entries else None

    def kept_everything_after(self, instance_id: str, after: int) -> bool:
        """Whether trimming left every entry after id ``after`` in the inbox (as StreamsBus
        tells from Redis: never trimmed, or its oldest entry is not newer than ``after``)."""
        self._tick()
        stream = self._streams.get(instance_id)
        if stream is None:
            return False
        return not stream.trimmed or bool(stream.entries) and stream.entries[0][0] <= after

    def next_entry(self, instance_id: str, after: int) -> tuple[int, bytes] | None:
        """The first entry after id ``after``, if any (trimmed entries are gone, as in Redis)."""
        self._tick()
        stream = self._streams.get(instance_id)
        if stream is None:
            return None
        found = None
        # Readers are near the end: walk back from it.
        for entry in reversed(stream.entries):
            if entry[0] <= after:
                break
            found = entry
        return found

    def appended(self, instance_id: str) -> trio.Event:
        """An event set at the next append to (or ``wake`` of) ``instance_id``'s inbox."""
        event = self._appended.get(instance_id)
        if event is None:
            event = self._appended[instance_id] = trio.Event()
        return event

    def wake(self, instance_id: str) -> None:
        event = self._appended.pop(instance_id, None)
        if event is not None:
            event.set()

    def size(self) -> dict[str, int]:
        """Entry counts, to check that memory stays flat."""
        self._tick()
        return {
            "listeners": len(self._listeners),
            "streams": len(self._streams),
            "entries": sum(len(s.entries) for s in self._streams.values()),
            "presences": len(self._presence),
            "waiters": len(self._appended),
        }
