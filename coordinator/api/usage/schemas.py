"""The query and the body of ``GET /api/v1/usage`` (``routes.py``), as msgspec Structs that
also document the route in /openapi.json (``schemas`` explains why response Structs forbid
unknown fields)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from coordinator.api.schemas import _Response
from coordinator.store import UsageRow

#: ``key_id=*``: every key (operator keys only)
ALL_KEYS = "*"
# The ``api_keys.key_id`` column's width: a longer id can name no key.
KeyId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class UsageQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The query string. Unset fields take their defaults in the route."""

    since: (
        Annotated[
            float,
            msgspec.Meta(description="start of the window, Unix seconds (default: until - 24 h)"),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    until: (
        Annotated[
            float, msgspec.Meta(description="end of the window, excluded, Unix seconds (now)")
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    key_id: (
        Annotated[
            KeyId,
            msgspec.Meta(
                description="the key to report (default: the caller's); another key, or `*` for"
                " every key, needs an operator key"
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET


Tasks = Annotated[int, msgspec.Meta(description="tasks created in the window, ok or failed")]
TasksWithoutUsage = Annotated[
    int,
    msgspec.Meta(
        description="of those, the ones whose node reported no usage (failed tasks, older"
        " nodes): their tokens are unknown, not zero"
    ),
]


class ModelUsage(_Response, kw_only=True):
    """One key's tasks on one model."""

    model: str
    tasks: Tasks
    tasks_without_usage: TasksWithoutUsage
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, row: UsageRow) -> ModelUsage:
        return cls(
            model=row.model,
            tasks=row.tasks,
            tasks_without_usage=row.tasks_without_usage,
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
            total_tokens=row.total_tokens,
        )


class KeyUsage(_Response, kw_only=True):
    """One key's tasks: the totals over its models, then each model (by name)."""

    key_id: str
    tasks: Tasks
    tasks_without_usage: TasksWithoutUsage
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    models: list[ModelUsage]

    @classmethod
    def of(cls, key_id: str, models: Sequence[ModelUsage]) -> KeyUsage:
        return cls(
            key_id=key_id,
            tasks=sum(m.tasks for m in models),
            tasks_without_usage=sum(m.tasks_without_usage for m in models),
            prompt_tokens=sum(m.prompt_tokens for m in models),
            completion_tokens=sum(m.completion_tokens for m in models),
            total_tokens=sum(m.total_tokens for m in models),
            models=list(models),
        )


class UsageResponse(_Response, kw_only=True):
    """Token usage over [since, until), per key (by id) and model. One key asked for: exactly
    that key, zeros when it had no task; ``*``: every key with a task in the window."""

    since: float
    until: float
    keys: list[KeyUsage]

    @classmethod
    def of(
        cls, since: float, until: float, rows: Sequence[UsageRow], *, key_id: str | None
    ) -> UsageResponse:
        """``rows`` as ``Store.usage`` returns them (ordered by key); ``key_id`` None: all."""
        by_key: dict[str, list[ModelUsage]] = {}
        if key_id is not None:
            by_key[key_id] = []
        for row in rows:
            by_key.setdefault(row.key_id, []).append(ModelUsage.of(row))
        keys = [KeyUsage.of(k, models) for k, models in by_key.items()]
        return cls(since=since, until=until, keys=keys)
