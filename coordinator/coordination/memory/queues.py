"""A model's admission queue on the memory backend, in the two orders of
``AdmissionRules.queue_policy`` (``coordination/leases.py`` states both; the Redis lease
scripts keep the same order in Lua, ``redis/queue_lua.py``).

Both queues answer the same few questions: which entry is the head (the one a grant may go
to), how many grants come before an entry, and what happens when an entry joins, is granted,
or leaves otherwise. Dropping dead or expired heads is the caller's (``LeaseTables``): it asks
for the head, judges it, and removes it with ``leave``, which costs a key no deficit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.coordination.leases import QueuePolicy

__all__ = ["FairQueue", "FifoQueue", "ModelQueue", "QueueEntry", "new_queue"]


@dataclass(slots=True)
class QueueEntry:
    instance_id: str
    expires_at: float
    key_id: str = ""


class FifoQueue:
    """First come, first served: the head is the oldest entry."""

    def __init__(self) -> None:
        # Insertion-ordered: the first entry is the head.
        self._entries: dict[str, QueueEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def head(self) -> tuple[str, QueueEntry] | None:
        return next(iter(self._entries.items()), None)

    def position(self, request_id: str) -> int:
        """Grants before ``request_id`` (in the queue) if nothing else arrives."""
        return list(self._entries).index(request_id)

    def join(self, request_id: str, entry: QueueEntry, weight: int) -> None:
        self._entries[request_id] = entry

    def granted(self, request_id: str) -> None:
        self._entries.pop(request_id, None)

    def leave(self, request_id: str) -> None:
        self._entries.pop(request_id, None)


@dataclass(slots=True)
class _KeyQueue:
    weight: int
    #: grants left in the key's current (or, away from the ring's front, next) turn
    deficit: int
    entries: dict[str, QueueEntry] = field(default_factory=dict)


class FairQueue:
    """API keys in weighted round robin by deficit counters, each key first come first served
    (the algorithm: ``coordination/leases.py``, *The queue's order*)."""

    def __init__(self) -> None:
        # Insertion-ordered: the ring, its front first.
        self._ring: dict[str, _KeyQueue] = {}
        self._key_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._key_of

    def head(self) -> tuple[str, QueueEntry] | None:
        front = next(iter(self._ring.values()), None)
        return None if front is None else next(iter(front.entries.items()))

    def position(self, request_id: str) -> int:
        """Grants before ``request_id`` (in the queue) if nothing else arrives: its key is
        served in turns of its weight (the first turn: its deficit now); in the round of the
        turn that reaches it, the keys before it in the ring have had that round's turn too."""
        mine = self._key_of[request_id]
        keys = list(self._ring)
        me = keys.index(mine)
        own = self._ring[mine]
        index = list(own.entries).index(request_id)
        turn = 0 if index < own.deficit else 1 + (index - own.deficit) // own.weight
        ahead = index
        for place, key in enumerate(keys):
            if key == mine:
                continue
            other = self._ring[key]
            turns = turn + (1 if place < me else 0)
            quota = 0 if turns == 0 else other.deficit + (turns - 1) * other.weight
            ahead += min(len(other.entries), quota)
        return ahead

    def join(self, request_id: str, entry: QueueEntry, weight: int) -> None:
        key = self._ring.get(entry.key_id)
        if key is None:
            key = self._ring[entry.key_id] = _KeyQueue(weight, weight)
        key.weight = weight
        key.entries[request_id] = entry
        self._key_of[request_id] = entry.key_id

    def granted(self, request_id: str) -> None:
        """``request_id`` was granted: at the head, it costs its key one of its turn."""
        head = self.head()
        if head is None or head[0] != request_id:
            self.leave(request_id)
            return
        key_id = self._key_of.pop(request_id)
        key = self._ring[key_id]
        del key.entries[request_id]
        key.deficit -= 1
        if not key.entries:
            del self._ring[key_id]
        elif key.deficit <= 0:
            del self._ring[key_id]
            key.deficit = key.weight
            self._ring[key_id] = key

    def leave(self, request_id: str) -> None:
        key_id = self._key_of.pop(request_id, None)
        if key_id is None:
            return
        key = self._ring[key_id]
        del key.entries[request_id]
        if not key.entries:
            del self._ring[key_id]


ModelQueue = FifoQueue | FairQueue


def new_queue(policy: QueuePolicy) -> ModelQueue:
    return FairQueue() if policy == "fair" else FifoQueue()
