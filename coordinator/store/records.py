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
    #: wall-clock unix seconds after which the key is refused (None: never); checked on every
    #: use, cached or not
    expires_at: float | None = None
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


def task_row(record: TaskRecord) -> dict[str, object]:
    """The ``tasks`` row of a record (both writers use it, so neither misses a column)."""
    return {
        "task_id": record.task_id,
        "key_id": record.key_id,
        "node_id": record.node_id,
        "model": record.model,
        "status": record.status,
        "error_code": record.error_code,
        "created_at": record.created_at,
        "finished_at": record.finished_at,
        "latency_ms": record.latency_ms,
        "stream": record.stream,
        "instance_id": record.instance_id,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
    }


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


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """An API key as ``gemmanet keys list`` shows it (never its secret). Unix seconds."""

    key_id: str
    name: str
    admin: bool
    created_at: float
    #: the newest use any instance wrote down (batched: up to about a minute behind)
    last_used_at: float | None
    expires_at: float | None
    revoked_at: float | None

    def state(self, now: float) -> str:
        """``revoked``, ``expired`` or ``active`` at wall-clock time ``now``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """An enrolled node identity as ``gemmanet nodes list`` shows it. Unix seconds."""

    node_id: str
    enrolled_at: float
    #: when an instance last wrote that it holds the node's socket (about once a minute)
    last_seen_at: float | None
    #: the instance that holds its socket as the store last heard (None: not connected)
    online_instance_id: str | None
    revoked_at: float | None
