"""The owner's side of cross-instance tasks: which requester waits for which task.

When a request on instance B is placed on a node connected to instance A, A keeps a
forwarding entry task -> (connection, reply_to). A still enforces that only the assigned
connection may answer; answers then travel to B over the bus.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        self.dropped_wrong_source = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._entries

    def add(self, forward: Forward) -> bool:
        """Record a forwarded task; False for a duplicate (a replayed assign is ignored)."""
        if forward.task_id in self._entries:
            return False
        self._entries[forward.task_id] = forward
        return True

    def answerable(self, task_id: str, conn_id: str) -> Forward | None:
        """The entry when ``conn_id`` may answer ``task_id``; None (and counted) otherwise."""
        forward = self._entries.get(task_id)
        if forward is None:
            return None
        if forward.conn_id != conn_id:
            self.dropped_wrong_source += 1
            return None
        return forward

    def remove(self, task_id: str) -> Forward | None:
        return self._entries.pop(task_id, None)

    def of_connection(self, conn_id: str) -> list[Forward]:
        """Remove and return every entry of a connection that went away."""
        return self._remove_where(lambda f: f.conn_id == conn_id)

    def requesters(self) -> set[str]:
        """The instances waiting for forwarded answers."""
        return {f.reply_to for f in self._entries.values()}

    def of_requesters(self, instance_ids: set[str]) -> list[Forward]:
        """Remove and return the entries requested by these (dead) instances."""
        return self._remove_where(lambda f: f.reply_to in instance_ids)

    def expired(self, now: float) -> list[Forward]:
        return self._remove_where(lambda f: now >= f.expires_at)

    def clear(self) -> list[Forward]:
        return self._remove_where(lambda f: True)

    def _remove_where(self, predicate) -> list[Forward]:  # type: ignore[no-untyped-def]
        doomed = [f for f in self._entries.values() if predicate(f)]
        for forward in doomed:
            del self._entries[forward.task_id]
        return doomed
