"""Stand-ins for what the simulator does not run for real.

The durable store runs SQL in worker threads, whose timing the virtual clock cannot control;
the simulator keeps the few facts the instances ask for in memory instead."""

from __future__ import annotations

from coordinator.store import TaskRecord


class SimStore:
    """The subset of ``coordinator.store.Store`` an Instance uses, kept in memory."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        self.tasks: dict[str, TaskRecord] = {}

    def enroll(self, node_id: str) -> str:
        token = f"gnn_sim_{node_id}"
        self.tokens[node_id] = token
        return token

    async def verify_node_token(self, node_id: str, token: str) -> bool:
        return self.tokens.get(node_id) == token

    async def record_task(self, record: TaskRecord) -> None:
        self.tasks[record.task_id] = record

    async def record_tasks(self, records: list[TaskRecord]) -> int:
        for record in records:
            self.tasks[record.task_id] = record
        return len(records)

    async def node_ratings(self) -> dict[str, tuple[float, int]]:
        return {}

    def close(self) -> None:
        pass
