"""``runtime.batched``: callers that arrive together share one bulk call, each gets its own
result, and a failed bulk call fails every caller of that batch (and only those)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from coordinator.coordination import CoordinationUnavailable
from coordinator.runtime.batched import Batched


class Bulk:
    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.fail_next = False
        self.gate: trio.Event | None = None

    async def __call__(self, items: list[int]) -> list[int]:
        self.calls.append(items)
        if self.gate is not None:
            await self.gate.wait()
        await trio.sleep(0.01)  # one round trip
        if self.fail_next:
            self.fail_next = False
            raise CoordinationUnavailable("Redis did not answer")
        return [i * 10 for i in items]


async def test_a_storm_of_callers_shares_a_few_bulk_calls() -> None:
    bulk = Bulk()
    batched: Batched[int, int] = Batched(bulk, max_batch=40)
    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await batched.call(i)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batched.run)
        async with trio.open_nursery() as callers:
            for i in range(100):
                callers.start_soon(one, i)
        nursery.cancel_scope.cancel()
    assert results == {i: i * 10 for i in range(100)}
    # Everyone arrived before the first batch left: 100 items in batches of at most 40.
    assert [len(c) for c in bulk.calls] == [40, 40, 20]
    assert sorted(i for c in bulk.calls for i in c) == list(range(100))


async def test_one_caller_alone_waits_one_bulk_call() -> None:
    bulk = Bulk()
    batched: Batched[int, int] = Batched(bulk)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batched.run)
        assert await batched.call(7) == 70
        assert await batched.call(8) == 80
        nursery.cancel_scope.cancel()
    assert bulk.calls == [[7], [8]]


async def test_callers_arriving_during_a_batch_go_in_the_next_one() -> None:
    bulk = Bulk()
    bulk.gate = trio.Event()
    batched: Batched[int, int] = Batched(bulk)
    results: list[int] = []

    async def one(i: int) -> None:
        results.append(await batched.call(i))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batched.run)
        nursery.start_soon(one, 1)
        await trio.testing.wait_all_tasks_blocked()
        assert bulk.calls == [[1]]  # in flight, held at the gate
        for i in (2, 3, 4):
            nursery.start_soon(one, i)
        await trio.testing.wait_all_tasks_blocked()
        bulk.gate.set()
        with trio.fail_after(5):
            while len(results) < 4:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert bulk.calls[0] == [1] and sorted(bulk.calls[1]) == [2, 3, 4] and len(bulk.calls) == 2
    assert sorted(results) == [10, 20, 30, 40]


async def test_a_failed_bulk_call_fails_its_callers_and_the_next_batch_goes_on() -> None:
    bulk = Bulk()
    batched: Batched[int, int] = Batched(bulk, max_batch=2)
    outcomes: dict[int, object] = {}

    async def one(i: int) -> None:
        try:
            outcomes[i] = await batched.call(i)
        except CoordinationUnavailable as exc:
            outcomes[i] = str(exc)

    bulk.fail_next = True
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batched.run)
        async with trio.open_nursery() as callers:
            for i in range(4):
                callers.start_soon(one, i)
        nursery.cancel_scope.cancel()
    # Trio starts the callers in no fixed order: the first batch is whichever two came first.
    first, second = bulk.calls
    assert len(first) == len(second) == 2
    assert {i: outcomes[i] for i in first} == {i: "Redis did not answer" for i in first}
    assert {i: outcomes[i] for i in second} == {i: i * 10 for i in second}


async def test_a_stopped_runner_answers_its_batch_with_an_error_not_none() -> None:
    bulk = Bulk()
    bulk.gate = trio.Event()  # never set: the batch is in flight when the runner stops
    batched: Batched[int, int] = Batched(bulk)
    caught: list[BaseException] = []

    async def one() -> None:
        try:
            await batched.call(1)
        except CoordinationUnavailable as exc:
            caught.append(exc)

    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as runner:
            nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
            async with trio.open_nursery() as inner:
                inner.start_soon(batched.run)
                await trio.testing.wait_all_tasks_blocked()
                runner.cancel()
    assert len(caught) == 1
    assert "not sent" in str(caught[0])


@pytest.mark.parametrize("size", [1, 500, 501])
async def test_batches_never_exceed_the_limit(size: int) -> None:
    bulk = Bulk()
    batched: Batched[int, int] = Batched(bulk, max_batch=500)

    async def one(i: int) -> None:
        await batched.call(i)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batched.run)
        async with trio.open_nursery() as callers:
            for i in range(size):
                callers.start_soon(one, i)
        nursery.cancel_scope.cancel()
    assert max(len(c) for c in bulk.calls) <= 500
    assert sum(len(c) for c in bulk.calls) == size
