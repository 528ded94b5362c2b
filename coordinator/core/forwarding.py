"""The owner's table of the tasks its node connections run, and for whom.

Every task an instance's nodes run has an entry task -> (connection, reply_to), whether the
request came from another instance or from this one (``reply_to`` is then this instance). Only
the assigned connection may answer; answers then travel to ``reply_to``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.core.tracker import Verdict

# Remember this many ended task ids, so a late answer is told apart from a stranger's.
RECENTLY_ENDED = 10_000


@dataclass(frozen=True, slots=True)
class Forward:
    task_id: str
    node_id: str
    conn_id: str
    reply_to: str
    # Past this (the task's own timeout plus a grace) the entry is dropped even if nobody
    # said so: a requester that died never sends a cancel.
    expires_at: float


class ForwardingTable:
    def __init__(self) -> None:
        self._entries: dict[str, Forward] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # task id -> its connection

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._entries

    def get(self, task_id: str) -> Forward | None:
        return self._entries.get(task_id)

    def known(self, task_id: str, conn_id: str) -> bool:
        """Running now, or ended recently on this connection: a replayed assign must not run
        it again (a task placed again after a node turned it down goes to another one)."""
        return task_id in self._entries or self._ended.get(task_id) == conn_id

    def ended_recently(self, task_id: str) -> bool:
        return task_id in self._ended

    def check(self, task_id: str, conn_id: str) -> tuple[Verdict, Forward | None]:
        """May ``conn_id`` answer ``task_id``? The entry comes back only when it may."""
        forward = self._entries.get(task_id)
        if forward is None:
            ended = task_id in self._ended
            return (Verdict.DUPLICATE if ended else Verdict.UNKNOWN_TASK), None
        if forward.conn_id != conn_id:
            return Verdict.WRONG_SOURCE, None
        return Verdict.ACCEPTED, forward

    def add(self, forward: Forward) -> bool:
        """Record a task; False for a duplicate (a replayed assign is ignored)."""
        if self.known(forward.task_id, forward.conn_id):
            return False
        self._entries[forward.task_id] = forward
        return True

    def remove(self, task_id: str) -> Forward | None:
        forward = self._entries.pop(task_id, None)
        if forward is not None:
            self._ended[task_id] = forward.conn_id
            if len(self._ended) > RECENTLY_ENDED:
                self._ended.popitem(last=False)
        return forward

    def of_connection(self, conn_id: str) -> list[Forward]:
        """Remove and return every entry of a connection that went away."""
        return self._remove_where(lambda f: f.conn_id == conn_id)

    def requesters(self) -> set[str]:
        """The instances waiting for answers."""
        return {f.reply_to for f in self._entries.values()}

    def of_requesters(self, instance_ids: set[str]) -> list[Forward]:
        """Remove and return the entries requested by these instances."""
        return self._remove_where(lambda f: f.reply_to in instance_ids)

    def not_of(self, instance_id: str) -> list[Forward]:
        """Remove and return every entry requested by another instance than ``instance_id``."""
        return self._remove_where(lambda f: f.reply_to != instance_id)

    def expired(self, now: float) -> list[Forward]:
        return self._remove_where(lambda f: now >= f.expires_at)

    def remote_count(self, instance_id: str) -> int:
        return sum(1 for f in self._entries.values() if f.reply_to != instance_id)

    def _remove_where(self, predicate: Callable[[Forward], bool]) -> list[Forward]:
        doomed = [f for f in self._entries.values() if predicate(f)]
        for forward in doomed:
            self.remove(forward.task_id)
        return doomed
