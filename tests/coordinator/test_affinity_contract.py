"""The prefix affinity contract (``PrefixAffinity``), on both backends (memory on a fake clock,
real Redis, a Redis Cluster): who holds which block, shared by every client of the store, most
recent first and at most ``PREFIX_HOLDERS_KEPT`` per block, expiring with the record's TTL,
and at most ``max_blocks`` blocks per model (the least recently recorded go first)."""

from __future__ import annotations

import pytest

from coordinator.coordination.roles import PREFIX_HOLDERS_KEPT
from tests.fixtures.coordination_backend import SLACK, Backend


async def test_holders_per_block_most_recent_first_shared_by_every_client(
    backend: Backend,
) -> None:
    c = backend.coord.affinity
    assert await c.prefix_holders("m", ["a", "b"]) == [[], []]
    assert await c.prefix_holders("m", []) == []
    await c.record_prefix("m", "n1", ["a", "b"], ttl_s=30, max_blocks=100)
    async with backend.open_peer() as peer:
        await peer.affinity.record_prefix("m", "n2", ["a", "c"], ttl_s=30, max_blocks=100)
        assert await peer.affinity.prefix_holders("m", ["a", "b", "c", "d"]) == [
            ["n2", "n1"],
            ["n1"],
            ["n2"],
            [],
        ]
    # Per model: another model's blocks of the same text are another cache.
    assert await c.prefix_holders("other", ["a"]) == [[]]
    # Recording again moves the node to the front, without a second entry.
    await c.record_prefix("m", "n1", ["a"], ttl_s=30, max_blocks=100)
    assert await c.prefix_holders("m", ["a"]) == [["n1", "n2"]]


async def test_a_block_keeps_its_most_recent_holders(backend: Backend) -> None:
    c = backend.coord.affinity
    nodes = [f"n{i}" for i in range(PREFIX_HOLDERS_KEPT + 2)]
    for node in nodes:
        await c.record_prefix("m", node, ["a"], ttl_s=30, max_blocks=100)
    assert await c.prefix_holders("m", ["a"]) == [nodes[::-1][:PREFIX_HOLDERS_KEPT]]


async def test_a_record_expires_with_its_ttl(backend: Backend) -> None:
    c = backend.coord.affinity
    await c.record_prefix("m", "old", ["a", "b"], ttl_s=0.3, max_blocks=100)
    await backend.advance(0.2)
    await c.record_prefix("m", "new", ["a"], ttl_s=0.3, max_blocks=100)
    await backend.advance(0.1 + SLACK)
    # old's record lapsed; new's, made later, holds on.
    assert await c.prefix_holders("m", ["a", "b"]) == [["new"], []]
    await backend.advance(0.2)
    assert await c.prefix_holders("m", ["a", "b"]) == [[], []]


async def test_a_model_keeps_at_most_max_blocks_least_recent_go_first(backend: Backend) -> None:
    c = backend.coord.affinity
    await c.record_prefix("m", "n1", ["a", "b", "c"], ttl_s=30, max_blocks=4)
    await backend.advance(0.01)
    await c.record_prefix("m", "n2", ["d", "e"], ttl_s=30, max_blocks=4)
    found = await c.prefix_holders("m", ["a", "b", "c", "d", "e"])
    assert sum(1 for held in found if held) == 4
    assert found[0] == [] and found[3:] == [["n2"], ["n2"]]


@pytest.mark.parametrize(("ttl_s", "max_blocks"), [(0.0, 10), (10.0, 0)])
async def test_nonsense_bounds_are_refused(backend: Backend, ttl_s: float, max_blocks: int) -> None:
    with pytest.raises(ValueError):
        await backend.coord.affinity.record_prefix(
            "m", "n", ["a"], ttl_s=ttl_s, max_blocks=max_blocks
        )
