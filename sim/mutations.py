"""Deliberately broken variants of the real code, applied only inside a simulation run.

They show that the simulator can fail: with a mutation on, a sweep must report failing seeds,
and replaying one must fail the same way. The production code has no switches for this."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from unittest import mock

from coordinator.core.tracker import TaskTracker, Verdict
from coordinator.runtime.membership import Membership


@contextmanager
def _owner_sweeper_off() -> Iterator[None]:
    async def nobody_dead(self: Membership, instance_ids: list[str]) -> set[str]:
        return set()

    with mock.patch.object(Membership, "dead_among", nobody_dead):
        yield


@contextmanager
def _connection_check_off() -> Iterator[None]:
    original = TaskTracker._check

    def any_source(self: TaskTracker, task_id: str, source_conn: str):  # type: ignore[no-untyped-def]
        task = self._pending.get(task_id)
        if task is not None:
            return Verdict.ACCEPTED, task
        return original(self, task_id, source_conn)

    with mock.patch.object(TaskTracker, "_check", any_source):
        yield


MUTATIONS: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "owner-sweeper-off": _owner_sweeper_off,
    "connection-check-off": _connection_check_off,
}


def applied(name: str | None) -> AbstractContextManager[None]:
    if name is None:
        return nullcontext()
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}; known: {', '.join(sorted(MUTATIONS))}")
    return MUTATIONS[name]()
