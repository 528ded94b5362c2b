"""A connection of its own, for blocking commands (``XREAD BLOCK``, ``bus/streams.py``): opened
through a ``RedisLink`` (its routing, its guard), used by one task at a time, never reopened."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from coredis import BaseConnection

from coordinator.coordination.base import CoordinationUnavailable
from coordinator.coordination.redis.connect.link import Operation, RedisLink

__all__ = ["DedicatedConnection", "dedicated_connection"]


@asynccontextmanager
async def dedicated_connection(
    link: RedisLink, client_name: str | None = None
) -> AsyncIterator[DedicatedConnection]:
    """A connection of its own for the block, for blocking commands (``XREAD BLOCK``).
    Opening it is bounded by ``op_timeout_s``; ``client_name`` is set with CLIENT SETNAME
    (spaces and control characters become ``_``) so operators can find it in CLIENT LIST."""
    holder: list[BaseConnection] = []

    async def open_it(op: Operation) -> None:
        connection = await link.open_connection()
        holder.append(connection)
        if client_name:
            name = "".join(ch if 32 < ord(ch) < 127 else "_" for ch in client_name)
            op.waiting_on = connection
            await connection.create_request(b"CLIENT", b"SETNAME", name, decode=False)
            op.waiting_on = None

    try:
        await link.guarded("open a dedicated connection", open_it)
    except BaseException:
        for connection in holder:
            connection.invalidate("opening failed")
        raise
    dedicated = DedicatedConnection(link, holder[0])
    try:
        yield dedicated
    finally:
        dedicated.retire("dedicated connection closed")


class DedicatedConnection:
    """One connection used by one task at a time (see ``dedicated_connection``).
    It is never reopened: after any failure, timeout or cancellation of a command it is retired
    and every further command raises ``CoordinationUnavailable`` (open a new one)."""

    def __init__(self, owner: RedisLink, connection: BaseConnection) -> None:
        self._owner = owner
        self._connection = connection
        self.lost_reason: str | None = None

    def retire(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        self._connection.invalidate(reason)

    async def execute(
        self, what: str, command: bytes, *args: Any, timeout_s: float | None = None
    ) -> Any:
        """Run one command, bounded by ``timeout_s`` (default ``op_timeout_s``): give a blocking
        command its BLOCK time plus a margin."""
        if self.lost_reason is not None:
            raise CoordinationUnavailable(
                f"the dedicated Redis connection is gone ({self.lost_reason})"
            )
        connection = self._connection

        async def operation(op: Operation) -> Any:
            op.waiting_on = connection
            reply = await connection.create_request(command, *args, decode=False)
            op.waiting_on = None
            return reply

        try:
            return await self._owner.guarded(what, operation, timeout_s=timeout_s)
        except BaseException as exc:
            # A reply still owed (cancelled or timed-out command) would be read as the answer
            # to the next command: this connection is done.
            self.retire(f"{what} ended with {type(exc).__name__}")
            raise
