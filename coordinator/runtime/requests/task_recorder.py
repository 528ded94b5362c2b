"""Task records are written in batches, off the request path.

Writing each finished task in its own transaction, in a worker thread, before answering cost a
request about 1.5 ms of coordinator CPU and a third of the throughput (tools/bench/throughput).
The recorder instead collects records and writes them every ``interval_s`` in one transaction.
A rating that arrives before its task's batch is written waits for it (``Instance.rate_task``).

Why 0.5 s between batches, not less: each batch costs a thread hop, a connection checkout and a
transaction, a few ms of CPU whatever its size. At 50 ms that was 20 batches a second, about
0.3-0.5 ms of CPU per request at 150 requests/s (docs/benchmarks.md, "Request cost"); at 0.5 s it is
two. The price: a task shows in ``GET /api/v1/usage`` up to half a second later, and a killed
instance loses at most that half second of records (a graceful stop writes them all)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from coordinator.store import TaskNotFound, TaskRecord

if TYPE_CHECKING:
    # Only the type (the instance's store is passed in): importing the runtime need not load
    # SQLAlchemy, which a simulator process never uses.
    from coordinator.store import Store

log = logging.getLogger("gemmanet.recorder")

# Beyond this many unwritten records (the database is down), new ones are dropped and counted.
MAX_PENDING = 100_000
MAX_BATCH = 1000
#: seconds between batches (see above)
RECORD_INTERVAL_S = 0.5


class TaskRecorder:
    def __init__(self, store: Store, *, interval_s: float = RECORD_INTERVAL_S) -> None:
        self._store = store
        self._interval_s = interval_s
        self._pending: dict[str, TaskRecord] = {}
        self._wake = trio.Event()
        self._flush_lock = trio.Lock()
        self.dropped = 0
        self.written = 0

    def add(self, record: TaskRecord) -> None:
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending[record.task_id] = record
        self._wake.set()

    def is_pending(self, task_id: str) -> bool:
        return task_id in self._pending

    async def flush(self) -> None:
        """Write everything recorded so far (also what a concurrent flush is writing)."""
        async with self._flush_lock:
            while self._pending:
                batch = dict(list(self._pending.items())[:MAX_BATCH])
                try:
                    self.written += await self._store.record_tasks(list(batch.values()))
                except Exception:
                    log.exception("could not write %d task record(s); will retry", len(batch))
                    return
                for task_id in batch:
                    self._pending.pop(task_id, None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                await trio.sleep(self._interval_s)  # gather a batch
                await self.flush()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.flush()

    async def rate_task(self, task_id: str, key_id: str, score: int) -> None:
        """Rate a task. Its record may still be on its way to the database (written in
        batches every ``interval_s``, here or on the instance that served it): wait for it
        briefly before answering that the task does not exist."""
        # up to 1.5 s: a loaded instance's batch (or this one's database) may be slow
        for delay in (0.0, 0.1, 0.2, 0.4, 0.8):
            await trio.sleep(delay)
            if self.is_pending(task_id):
                await self.flush()
            try:
                await self._store.rate_task(task_id, key_id, score)
                return
            except TaskNotFound:
                continue
        raise TaskNotFound(f"no task with id {task_id}")
