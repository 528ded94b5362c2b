"""Pipelined commands on the lean path: one connection, one writer, one reply reader. The link's
lean lane (``lane.py``) holds one: the bus's PUBLISH and the hot-path scripts go through it.

Every ``request`` call appends its encoded command to a buffer and parks; the writer sends
whatever accumulated since its last send in one ``send_all`` (a burst of a thousand commands
goes out in a few writes, not a thousand), and the reader hands each reply to the caller waiting
first in line (Redis answers in order). A caller is woken directly by the reader with its reply
(``trio.lowlevel.reschedule``): no event object, no channel, no extra task in between.

A cancelled or timed-out caller leaves its place in line (its reply, when it comes, is
discarded); the command may still run on the server (at-most-once). When the connection is
lost, every caller still waiting gets ``ConnectionError``; the lane opens a new pipeline on
the next call, at the link's master of that moment.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import hiredis
import outcome
import trio
from coredis.exceptions import RedisError

from coordinator.coordination.redis.lean.connection import LeanConnection, reply_error

__all__ = ["LeanPipeline", "publish_command"]

log = logging.getLogger("coordinator.coordination.redis.coordination")


def publish_command(channel: bytes, payload: bytes, *, sharded: bool = False) -> bytes:
    """``PUBLISH channel payload`` in RESP, built in one step (no per-argument parts);
    ``SPUBLISH`` when ``sharded`` (a cluster: only the master of the channel's slot gets it,
    where a PUBLISH would be copied to every node over the cluster bus)."""
    verb = b"$8\r\nSPUBLISH" if sharded else b"$7\r\nPUBLISH"
    return b"*3\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        verb,
        len(channel),
        channel,
        len(payload),
        payload,
    )


class _Waiter:
    __slots__ = ("task",)

    def __init__(self, task: trio.lowlevel.Task | None) -> None:
        self.task = task  # None once the caller gave up (cancelled)


class LeanPipeline:
    """Pipelined requests on one ``LeanConnection``; ``run`` it in the backend's nursery."""

    def __init__(self, connection: LeanConnection) -> None:
        self.connection = connection
        self._outgoing: list[bytes] = []
        self._waiting: deque[_Waiter] = deque()
        self._writer_idle = trio.lowlevel.ParkingLot()
        #: commands sent and socket writes they took (diagnostics: how much pipelining helped)
        self.commands_sent = 0
        self.writes = 0

    @property
    def usable(self) -> bool:
        return self.connection.usable

    @property
    def statistics(self) -> LeanConnection:
        """Where the guard reads ``last_byte_received_at`` (as of a coredis connection): a
        timed-out operation drops the pipeline only if no reply came within the timeout."""
        return self.connection

    def invalidate(self, reason: str) -> None:
        self.connection.invalidate(reason)
        self._writer_idle.unpark_all()

    async def request(self, command: bytes) -> Any:
        """Send ``command`` (encoded RESP) and return its reply; an error reply raises the
        coredis exception for it, a lost connection ``ConnectionError``."""
        if not self.connection.usable:
            await trio.lowlevel.checkpoint()
            raise self.connection.lost(None)
        waiter = _Waiter(trio.lowlevel.current_task())
        self._outgoing.append(command)
        self._waiting.append(waiter)
        self._writer_idle.unpark()

        def abort(_: Any) -> trio.lowlevel.Abort:
            waiter.task = None
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write and read until the connection is lost or closed; a lost connection is not
        raised (the callers waiting at that moment get it), a cancellation is."""
        error: list[BaseException] = []

        async def until_lost(part: Callable[[], Awaitable[None]], scope: trio.CancelScope) -> None:
            try:
                await part()
            except (RedisError, OSError) as exc:
                error.append(exc)
                log.debug("lean Redis pipeline ended: %r", exc)
                scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_lost, self._write, nursery.cancel_scope)
                task_status.started()
                await until_lost(self._read, nursery.cancel_scope)
        finally:
            self.invalidate("pipeline stopped")
            self._fail_waiting(error[0] if error else None)

    async def _write(self) -> None:
        connection, outgoing = self.connection, self._outgoing
        while True:
            if not outgoing:
                await self._writer_idle.park()
                if not connection.usable:
                    raise connection.lost(None)
                continue
            data = outgoing[0] if len(outgoing) == 1 else b"".join(outgoing)
            self.commands_sent += len(outgoing)
            self.writes += 1
            outgoing.clear()
            await connection.send(data)

    async def _read(self) -> None:
        connection, waiting = self.connection, self._waiting
        while True:
            reply = await connection.read_reply()
            # Drain every reply already parsed before the next socket read.
            while reply is not False:
                waiter = waiting.popleft()
                if waiter.task is not None:
                    if isinstance(reply, hiredis.ReplyError):
                        trio.lowlevel.reschedule(waiter.task, outcome.Error(reply_error(reply)))
                    else:
                        trio.lowlevel.reschedule(waiter.task, outcome.Value(reply))
                reply = connection.next_buffered()

    def _fail_waiting(self, error: BaseException | None) -> None:
        waiting, self._waiting = self._waiting, deque()
        self._outgoing.clear()
        for waiter in waiting:
            if waiter.task is not None:
                failure = self.connection.lost(error)
                trio.lowlevel.reschedule(waiter.task, outcome.Error(failure))
