"""Plain records the store hands out and takes in."""

from __future__ import annotations

from dataclasses import dataclass

TASK_STATUSES = frozenset({"ok", "error"})
#: an API key's priority: its weight in the fair admission queue (grants per turn)
MIN_PRIORITY, MAX_PRIORITY = 1, 100


def check_priority(priority: object) -> None:
    """Raise ValueError unless ``priority`` is a whole number of MIN_PRIORITY-MAX_PRIORITY."""
    whole = isinstance(priority, int) and not isinstance(priority, bool)
    if not whole or not MIN_PRIORITY <= priority <= MAX_PRIORITY:  # type: ignore[operator]
        raise ValueError(f"priority must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority}")


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A client API key, without its secret."""

    key_id: str
    name: str
    #: an operator key: may see node details (``gemmanet keys create --admin``)
    admin: bool = False
    #: its weight in the fair admission queue (``MIN_PRIORITY``-``MAX_PRIORITY``)
    priority: int = 1


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One finished task. Times are wall-clock unix seconds (``time.time()``) set by the caller."""

    task_id: str
    key_id: str
    node_id: str | None
    model: str
    status: str  # "ok" | "error"
    error_code: str | None
    created_at: float
    finished_at: float
    stream: bool
    instance_id: str
    #: tokens as the model server counted them (None: its node or host did not say)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def latency_ms(self) -> float:
        return max(0.0, (self.finished_at - self.created_at) * 1000.0)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Token usage of one key on one model over a time window (``Store.usage``)."""

    key_id: str
    model: str
    #: every recorded task, ok or failed
    tasks: int
    #: of those, the ones whose node reported no usage (failed tasks, older nodes)
    tasks_without_usage: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
