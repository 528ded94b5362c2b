"""Token usage summed from the ``tasks`` table: per key and model, over a window of
``created_at``. ``Store.usage`` runs it; kept here so the query reads on its own."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from .records import UsageRow
from .schema import tasks


def check_usage_window(since: float, until: float) -> None:
    """Raise ValueError unless [since, until) is a window of finite Unix seconds."""
    if not all(isinstance(t, int | float) and math.isfinite(t) for t in (since, until)):
        raise ValueError("since and until must be finite Unix seconds")
    if since > until:
        raise ValueError("since must not be after until")


def usage_query(since: float, until: float, key_id: str | None) -> sa.Select[Any]:
    """One row per (key, model) with a task created in [since, until); ``key_id`` None: every
    key. Served by ``ix_tasks_key_id_created_at`` for one key, ``ix_tasks_created_at`` else."""
    without_usage = sa.or_(tasks.c.prompt_tokens.is_(None), tasks.c.completion_tokens.is_(None))
    query = (
        sa.select(
            tasks.c.key_id,
            tasks.c.model,
            sa.func.count().label("tasks"),
            # SUM(CASE ...) rather than COUNT(*) FILTER: the same SQL on every supported SQLite.
            sa.func.coalesce(sa.func.sum(sa.case((without_usage, 1), else_=0)), 0).label(
                "tasks_without_usage"
            ),
            # SUM skips NULLs: a task without usage adds nothing; no row at all sums to NULL.
            sa.func.coalesce(sa.func.sum(tasks.c.prompt_tokens), 0).label("prompt_tokens"),
            sa.func.coalesce(sa.func.sum(tasks.c.completion_tokens), 0).label("completion_tokens"),
        )
        .where(tasks.c.created_at >= since, tasks.c.created_at < until)
        .group_by(tasks.c.key_id, tasks.c.model)
        .order_by(tasks.c.key_id, tasks.c.model)
    )
    if key_id is not None:
        query = query.where(tasks.c.key_id == key_id)
    return query


def usage_rows(rows: Iterable[sa.Row[Any]]) -> list[UsageRow]:
    # int(): PostgreSQL sums BIGINT into NUMERIC, which the driver hands out as Decimal.
    return [
        UsageRow(
            key_id=row.key_id,
            model=row.model,
            tasks=int(row.tasks),
            tasks_without_usage=int(row.tasks_without_usage),
            prompt_tokens=int(row.prompt_tokens),
            completion_tokens=int(row.completion_tokens),
        )
        for row in rows
    ]
