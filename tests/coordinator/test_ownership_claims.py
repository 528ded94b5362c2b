"""``runtime.ownership`` with batched claims: a connection whose claim is still in flight is
never judged "owned elsewhere" (found with 2,000 nodes connecting at once: the refresh of the
beat ran between the claim being queued and written, and closed the node with 4000)."""

from __future__ import annotations

from collections.abc import Sequence

import trio
import trio.testing

from coordinator.coordination import keys
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.coordination.memory.roles import MemoryKeyValue
from coordinator.core import registry
from coordinator.core.node_table import NodeConnection
from coordinator.runtime.cluster.ownership import Ownership, refresh_turns


def conn(node_id: str, conn_id: str) -> NodeConnection:
    return NodeConnection(
        conn_id=conn_id,
        node_id=node_id,
        models=frozenset({"m"}),
        max_parallel=1,
        vram_gb=None,
        agent_version="test",
        connected_at=0.0,
        last_seen=0.0,
    )


class GatedClaims(MemoryKeyValue):
    """Claims wait at a gate; a compare-and-set may first let a pending claim land."""

    def __init__(self) -> None:
        super().__init__(MemoryCoordination().link)
        self.gate = trio.Event()
        self.land_before_cas: tuple[str, bytes] | None = None

    async def swap_many(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        ttl_s: float | None = None,
        bump: str | None = None,
    ) -> list[bytes | None]:
        await self.gate.wait()
        return await super().swap_many(items, ttl_s=ttl_s, bump=bump)

    async def compare_and_set(
        self,
        key: str,
        expected: bytes | None,
        value: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        if self.land_before_cas is not None:
            await super().set(*self.land_before_cas)
            self.land_before_cas = None
        return await super().compare_and_set(key, expected, value, ttl_s=ttl_s)


async def test_a_claim_in_flight_is_not_checked_and_is_ours_once_written() -> None:
    coord = GatedClaims()
    ownership = Ownership(coord, "I0", ttl_s=30.0)
    c = conn("n1", "c1")
    claimed: list[object] = []

    async def claim() -> None:
        claimed.append(await ownership.claim(c))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ownership.run)
        nursery.start_soon(claim)
        await trio.testing.wait_all_tasks_blocked()
        # The beat's checks while the claim waits at the gate: nothing lost.
        assert await ownership.confirm_all([c]) == []
        assert await ownership.owned_elsewhere([c]) == []
        coord.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert claimed == [None]  # nobody owned n1 before
        assert await coord.get(keys.owner_key("n1")) == registry.owner_value("I0", "c1")
        assert await ownership.confirm_all([c]) == []
        nursery.cancel_scope.cancel()


async def test_a_claim_landing_between_the_refresh_and_the_take_back_is_ours() -> None:
    coord = GatedClaims()
    ownership = Ownership(coord, "I0", ttl_s=30.0)
    c = conn("n1", "c1")
    key, mine = keys.owner_key("n1"), registry.owner_value("I0", "c1")
    # The record is absent when refreshed, and our own claim writes it just before the
    # take-back's compare-and-set (expects absent) runs.
    coord.land_before_cas = (key, mine)
    assert await ownership.confirm(c) is True
    # Someone else's record landing there is a loss, as before.
    coord.land_before_cas = (key, registry.owner_value("I1", "c9"))
    await coord.delete(key)
    assert await ownership.confirm(c) is False


class CountingReads(MemoryKeyValue):
    def __init__(self) -> None:
        super().__init__(MemoryCoordination().link)
        self.record_reads = 0

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self.record_reads += 1
        return await super().get_many(keys)


async def test_records_are_re_read_only_when_a_claim_moved_the_counter() -> None:
    """An idle cluster reads one counter a beat; a claim anywhere (here another instance's,
    whose replace envelope never arrived) makes the next beat read the records and find it."""
    coord = CountingReads()
    mine = Ownership(coord, "I0", ttl_s=30.0)
    theirs = Ownership(coord, "I1", ttl_s=30.0)
    a, b = conn("n1", "c1"), conn("n2", "c2")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mine.run)
        nursery.start_soon(theirs.run)
        await mine.claim(a)
        await mine.claim(b)
        assert await mine.owned_elsewhere([a, b]) == []  # first beat: reads the records
        assert coord.record_reads == 1
        for _ in range(5):  # idle beats: the counter stands still
            assert await mine.owned_elsewhere([a, b]) == []
        assert coord.record_reads == 1
        # n2 reconnects to I1, which claims it; its replace to us is lost.
        assert await theirs.claim(conn("n2", "c9")) == ("I0", "c2")
        assert await mine.owned_elsewhere([a, b]) == [b]
        assert coord.record_reads == 2
        nursery.cancel_scope.cancel()


async def test_a_lost_store_resets_the_counter_and_the_records_are_read_again() -> None:
    coord = CountingReads()
    mine = Ownership(coord, "I0", ttl_s=30.0)
    a = conn("n1", "c1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mine.run)
        await mine.claim(a)
        assert await mine.owned_elsewhere([a]) == []
        await coord.delete(keys.OWNERS_CHANGED)  # a Redis restart without persistence
        await coord.delete(keys.owner_key("n1"))
        assert await mine.owned_elsewhere([a]) == []  # read again, and claimed back
        assert coord.record_reads == 2
        assert await coord.get(keys.owner_key("n1")) == registry.owner_value("I0", "c1")
        nursery.cancel_scope.cancel()


class CountedRefreshes(MemoryKeyValue):
    """Counts the records each batched refresh touches."""

    def __init__(self) -> None:
        super().__init__(MemoryCoordination().link)
        self.refreshed: list[list[str]] = []

    async def refresh_many(self, items: Sequence[tuple[str, bytes]], ttl_s: float) -> list[bool]:
        self.refreshed.append([key for key, _ in items])
        return await super().refresh_many(items, ttl_s)


async def test_each_beat_refreshes_its_share_and_every_record_once_per_period() -> None:
    """The refresh of a third of the owner TTL is dealt over its beats (a script over every
    record at once stopped the loop for tens of ms at thousands of nodes)."""
    coord = CountedRefreshes()
    ownership = Ownership(coord, "I0", ttl_s=15.0, turns=refresh_turns(15.0, 0.5))
    assert refresh_turns(15.0, 0.5) == 10 and refresh_turns(1.0, 0.5) == 1
    conns = {f"c{i}": conn(f"n{i}", f"c{i}") for i in range(100)}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ownership.run)
        for c in conns.values():
            nursery.start_soon(ownership.claim, c)
        await trio.testing.wait_all_tasks_blocked()
        await ownership.release("n7", "c7")  # a connection gone is no longer refreshed
        for _ in range(20):  # two refresh periods
            assert await ownership.confirm_turn(conns.get) == []
        nursery.cancel_scope.cancel()
    assert max(len(keys) for keys in coord.refreshed) <= 10
    assert len(coord.refreshed) == 20
    first, second = coord.refreshed[:10], coord.refreshed[10:]
    expected = sorted(keys.owner_key(f"n{i}") for i in range(100) if i != 7)
    assert sorted(k for keys in first for k in keys) == expected
    assert second == first
