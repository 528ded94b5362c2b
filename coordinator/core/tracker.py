"""Pending tasks of one requesting instance: who may answer them and which must fail.

The tracker only decides; the shell delivers. Every node envelope about a task is checked
here first, so a chunk or result from a connection the task was not assigned to, a replayed
chunk, or an answer to a finished task never reaches a client.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol import MAX_OUTPUT_BYTES

# Chunks that arrive ahead of a missing predecessor wait here (the bus may reorder).
MAX_EARLY_CHUNKS = 256
# The most a task may stream, in characters, waiting chunks included. A task's whole output
# must fit in its final result (MAX_OUTPUT_BYTES of UTF-8, JSON-escaped, so at least as many
# characters), so an honest node never reaches it; a node that streams more would otherwise grow
# this instance's memory without bound behind a client that stops reading.
MAX_STREAMED_CHARS = MAX_OUTPUT_BYTES
# Remember this many finished task ids so late duplicates are told apart from strangers.
RECENTLY_FINISHED = 10_000


class Verdict(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # already seen: a replay, or an answer after the end
    WRONG_SOURCE = "wrong_source"  # not the connection the task was assigned to
    UNKNOWN_TASK = "unknown_task"  # never pending here
    OVERFLOW = "overflow"  # too far ahead of the stream; the task fails
    TOO_LARGE = "too_large"  # more output than a result can carry; the task fails


@dataclass
class PendingTask:
    task_id: str
    node_id: str
    conn_id: str
    owner_instance: str
    deadline: float
    #: the owner's life the task was placed on ("" unknown): a restart of the owner is its death
    owner_incarnation: str = ""
    next_seq: int = 0
    early: dict[int, str] = field(default_factory=dict)
    #: characters streamed so far, delivered or waiting in ``early``
    streamed_chars: int = 0


class TaskTracker:
    def __init__(self) -> None:
        self._pending: dict[str, PendingTask] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self.dropped: dict[Verdict, int] = {v: 0 for v in Verdict if v is not Verdict.ACCEPTED}

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._pending

    def get(self, task_id: str) -> PendingTask | None:
        return self._pending.get(task_id)

    def pending(self) -> Iterable[PendingTask]:
        return self._pending.values()

    def open(
        self,
        task_id: str,
        *,
        node_id: str,
        conn_id: str,
        owner_instance: str,
        deadline: float,
        owner_incarnation: str = "",
    ) -> PendingTask:
        if task_id in self._pending or task_id in self._finished:
            raise ValueError(f"task id {task_id!r} reused")
        task = PendingTask(task_id, node_id, conn_id, owner_instance, deadline, owner_incarnation)
        self._pending[task_id] = task
        return task

    def _check(self, task_id: str, source_conn: str) -> tuple[Verdict, PendingTask | None]:
        task = self._pending.get(task_id)
        if task is None:
            verdict = Verdict.DUPLICATE if task_id in self._finished else Verdict.UNKNOWN_TASK
        elif task.conn_id != source_conn:
            verdict = Verdict.WRONG_SOURCE
        else:
            return Verdict.ACCEPTED, task
        self.dropped[verdict] += 1
        return verdict, None

    def on_chunk(
        self, task_id: str, source_conn: str, seq: int, delta: str
    ) -> tuple[Verdict, list[str]]:
        """A chunk arrived. Returns the verdict and the deltas now deliverable, in order."""
        verdict, task = self._check(task_id, source_conn)
        if task is None:
            return verdict, []
        if seq < task.next_seq or seq in task.early:
            self.dropped[Verdict.DUPLICATE] += 1
            return Verdict.DUPLICATE, []
        task.streamed_chars += len(delta)
        if task.streamed_chars > MAX_STREAMED_CHARS:
            self.dropped[Verdict.TOO_LARGE] += 1
            return Verdict.TOO_LARGE, []
        if seq > task.next_seq:
            if len(task.early) >= MAX_EARLY_CHUNKS:
                self.dropped[Verdict.OVERFLOW] += 1
                return Verdict.OVERFLOW, []
            task.early[seq] = delta
            return Verdict.ACCEPTED, []
        ready = [delta]
        task.next_seq += 1
        while task.next_seq in task.early:
            ready.append(task.early.pop(task.next_seq))
            task.next_seq += 1
        return Verdict.ACCEPTED, ready

    def on_finish(self, task_id: str, source_conn: str) -> Verdict:
        """A result or a task error arrived; when accepted the task is no longer pending."""
        verdict, task = self._check(task_id, source_conn)
        if task is not None:
            self.close(task_id)
        return verdict

    def forget(self, task_id: str) -> None:
        """Undo ``open`` for a task that never reached any node (its placement failed), even
        if it was closed meanwhile, so the same id can be placed again."""
        self._pending.pop(task_id, None)
        self._finished.pop(task_id, None)

    def close(self, task_id: str) -> PendingTask | None:
        """The task ended (answered, failed, timed out or abandoned by its client)."""
        task = self._pending.pop(task_id, None)
        if task is not None:
            self._finished[task_id] = None
            if len(self._finished) > RECENTLY_FINISHED:
                self._finished.popitem(last=False)
        return task

    def fail_connection(self, conn_id: str) -> list[PendingTask]:
        """A node connection is gone: its pending tasks end now (502), not at their timeout."""
        return self._close_where(lambda t: t.conn_id == conn_id)

    def fail_tasks_of_dead_owners(self, alive_instances: set[str]) -> list[PendingTask]:
        """Pending tasks whose node's owner instance is no longer alive end now (502)."""
        return self._close_where(lambda t: t.owner_instance not in alive_instances)

    def expired(self, now: float) -> list[PendingTask]:
        """Pending tasks past their deadline (504)."""
        return self._close_where(lambda t: now >= t.deadline)

    def _close_where(self, predicate: object) -> list[PendingTask]:
        doomed = [t for t in self._pending.values() if predicate(t)]  # type: ignore[operator]
        for task in doomed:
            self.close(task.task_id)
        return doomed
