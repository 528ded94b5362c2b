"""Waiting for the coordinator's next message, and deciding it has gone silent, on the time this
process was actually running.

A heartbeat deadline measured on the wall clock turns any stall of the node's own process
(a busy or paused machine, swapping, SIGSTOP) into a verdict against a live coordinator: when
the process runs again the deadline has passed while the coordinator's heartbeats sit unread
in the socket. So the wait wakes every half interval; a wake-up that comes far later than asked
means this process did not run meanwhile, and the deadline moves to one interval after it, for
what waits in the socket to be read first. The coordinator judges nodes the same way
(``coordinator/runtime/cluster/supervision.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import trio

#: a wake-up this much later than asked means this process itself was not running
STALL_SLACK_S: Final = 1.0

T = TypeVar("T")


async def receive_unless_silent(
    receive: Callable[[], Awaitable[T]], *, interval_s: float, misses: int
) -> T | None:
    """``receive()``'s result, or None when nothing came for ``misses`` intervals of time
    this process was running. ``receive`` must be safe to cancel (nothing is lost)."""
    check = interval_s / 2
    last = trio.current_time()
    deadline = last + misses * interval_s
    while True:
        with trio.move_on_after(min(check, max(deadline - last, 0.0))):
            return await receive()
        now = trio.current_time()
        if now - last > check + STALL_SLACK_S:
            deadline = max(deadline, now + interval_s)
        last = now
        if now >= deadline:
            return None
