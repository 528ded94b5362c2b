"""What a request handler holds while its task runs: the events of one task, in order."""

from __future__ import annotations

import trio

from coordinator.core.effects import ChunkEvent, DoneEvent, FailedEvent, MovedEvent, TaskEvent
from coordinator.errors import GemmaNetError, TaskTimedOut
from coordinator.runtime.requests.affinity import Lookup
from coordinator.store import TaskRecord

__all__ = ["ChunkEvent", "DoneEvent", "FailedEvent", "TaskEvent", "TaskHandle", "queued_failure"]


def queued_failure(events: trio.MemoryReceiveChannel[TaskEvent]) -> GemmaNetError | None:
    """The failure already waiting in ``events``, if any (without waiting for more)."""
    while True:
        try:
            event = events.receive_nowait()
        except trio.WouldBlock:
            return None
        if isinstance(event, FailedEvent):
            return event.error


class TaskHandle:
    """One running task as its request sees it. Created by ``TaskRequests.start`` (runtime/requests.py)."""

    def __init__(
        self,
        *,
        task_id: str,
        node_id: str,
        conn_id: str,
        owner_instance: str,
        events: trio.MemoryReceiveChannel[TaskEvent],
        deadline: float,
        timeout_s: float,
        key_id: str,
        model: str,
        stream: bool,
        created_at: float,
    ) -> None:
        self.task_id = task_id
        self.node_id = node_id
        self.conn_id = conn_id
        self.owner_instance = owner_instance
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.key_id = key_id
        self.model = model
        self.stream = stream
        self.created_at = created_at
        # When the request asked (Instance.clock), queue wait included: the latency metric.
        self.began_at = 0.0
        self._events = events
        # Set by TaskRequests.end: "ok", or the error code the request ended with.
        self.outcome: str | None = None
        #: the final event, once it arrived (its usage is recorded with the task)
        self.done: DoneEvent | None = None
        #: its prefix and what was predicted of it (None: affinity off)
        self.affinity: Lookup | None = None

    async def next_event(self) -> ChunkEvent | DoneEvent:
        """The next chunk or the final result; raises the task's error (502/503/504)."""
        while True:
            event: TaskEvent | None = None
            if trio.current_time() < self.deadline:
                try:
                    # An event already here (a stream's chunks often come several at a time)
                    # needs no deadline scope: a cancel scope costs several µs per call.
                    event = self._events.receive_nowait()
                except trio.WouldBlock:
                    with trio.move_on_at(self.deadline):
                        event = await self._events.receive()
            if event is None:
                raise TaskTimedOut(f"task {self.task_id} got no result within {self.timeout_s:g} s")
            if isinstance(event, MovedEvent):
                # Refused where first placed (never ran there); runs on this node now.
                self.node_id, self.conn_id = event.node_id, event.conn_id
                self.owner_instance = event.owner_instance
                continue
            if isinstance(event, FailedEvent):
                raise event.error
            if isinstance(event, DoneEvent):
                self.done = event
            return event

    def record(self, instance_id: str, *, finished_at: float) -> TaskRecord:
        """What the store keeps of this task once it ended (``outcome`` is set)."""
        outcome = self.outcome or "ok"
        usage = self.done.usage if self.done is not None else None
        return TaskRecord(
            task_id=self.task_id,
            key_id=self.key_id,
            node_id=self.node_id,
            model=self.model,
            status="ok" if outcome == "ok" else "error",
            error_code=None if outcome == "ok" else outcome,
            created_at=self.created_at,
            finished_at=finished_at,
            stream=self.stream,
            instance_id=instance_id,
            prompt_tokens=usage.prompt_tokens if usage is not None else None,
            completion_tokens=usage.completion_tokens if usage is not None else None,
        )

    async def result(self) -> DoneEvent:
        """Wait for the final event: the whole output (also of a streamed task) and what the
        model server reported of it."""
        while True:
            event = await self.next_event()
            if isinstance(event, DoneEvent):
                return event
