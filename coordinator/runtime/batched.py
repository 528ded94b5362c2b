"""Group commit for the store writes of a connection storm.

When thousands of nodes connect at once (an instance restart, a network blip healing), each
connection's own round trips to Redis (its facts, its identity) queue up behind one another and
behind the handshakes competing for the same CPU; past the operation limit they fail and the
node is told to come back later (1013). ``Batched`` sends the items of every caller that
arrived while the previous batch was in flight as one bulk call instead: one node alone waits
one round trip as before, a storm of N costs about N / ``max_batch`` round trips.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, NoReturn, TypeVar

import trio

from coordinator.coordination import CoordinationUnavailable

T = TypeVar("T")
R = TypeVar("R")


class _Call(Generic[T, R]):
    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = trio.Event()
        self.result: R | None = None
        self.error = ""


class Batched(Generic[T, R]):
    """``await batched.call(item)`` runs ``bulk([..., item, ...])`` and returns that item's
    result; :meth:`run` (a task of the owner's nursery) sends the batches. A failed bulk call
    raises ``CoordinationUnavailable`` in every caller of that batch."""

    def __init__(
        self, bulk: Callable[[list[T]], Awaitable[list[R]]], *, max_batch: int = 500
    ) -> None:
        self._bulk = bulk
        self._max_batch = max_batch
        self._pending: list[_Call[T, R]] = []
        self._arrived = trio.Event()

    async def call(self, item: T) -> R:
        call: _Call[T, R] = _Call(item)
        self._pending.append(call)
        self._arrived.set()
        # A caller that leaves (its node hung up) leaves its item in the batch: the bulk call
        # is one step for all of them, and what it wrote is undone the way a single write
        # cancelled mid-flight would be (the connection's detach).
        await call.done.wait()
        if call.error:
            raise CoordinationUnavailable(call.error)
        return call.result  # type: ignore[return-value]  # set with done, unless error

    async def run(self) -> NoReturn:
        while True:
            await self._arrived.wait()
            self._arrived = trio.Event()
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                await self._send(batch)

    async def _send(self, batch: list[_Call[T, R]]) -> None:
        # Whatever ends the bulk call (a failure, a bug, the instance stopping), every caller
        # of the batch gets an answer: a result or an error, never a silent None.
        error = "the batch was not sent (the instance is stopping)"
        try:
            results = await self._bulk([call.item for call in batch])
            for call, result in zip(batch, results, strict=True):
                call.result = result
            error = ""
        except CoordinationUnavailable as exc:
            error = str(exc)
        finally:
            for call in batch:
                if error:
                    call.error = error
                call.done.set()
