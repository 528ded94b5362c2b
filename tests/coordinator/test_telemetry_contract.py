"""The telemetry history contract, on both backends (memory on a fake clock, real Redis):
a bounded list per node, oldest first, shared by every client of the store, that expires as a
whole after its last append."""

from __future__ import annotations

import pytest

from tests.fixtures.coordination_backend import SLACK, Backend


async def test_history_keeps_the_last_samples_oldest_first(backend: Backend) -> None:
    c = backend.coord.telemetry
    assert await c.telemetry_history("n1") == []
    for i in range(7):
        await c.append_telemetry("n1", b"s%d" % i, keep=5, ttl_s=30)
    assert await c.telemetry_history("n1") == [b"s2", b"s3", b"s4", b"s5", b"s6"]
    await c.append_telemetry("n2", b"only", keep=5, ttl_s=30)
    assert await c.latest_telemetry(["n1", "n2", "absent"]) == {"n1": b"s6", "n2": b"only"}
    assert await c.latest_telemetry([]) == {}


async def test_another_client_of_the_store_reads_the_same_history(backend: Backend) -> None:
    await backend.coord.telemetry.append_telemetry("shared", b"x", keep=3, ttl_s=30)
    async with backend.open_peer() as peer:
        await peer.telemetry.append_telemetry("shared", b"y", keep=3, ttl_s=30)
        assert await peer.telemetry.telemetry_history("shared") == [b"x", b"y"]
    assert await backend.coord.telemetry.latest_telemetry(["shared"]) == {"shared": b"y"}


async def test_history_expires_after_its_last_append(backend: Backend) -> None:
    c = backend.coord.telemetry
    await c.append_telemetry("n", b"a", keep=5, ttl_s=0.3)
    await backend.advance(0.2)
    # An append restarts the TTL of the whole history.
    await c.append_telemetry("n", b"b", keep=5, ttl_s=0.3)
    await backend.advance(0.2)
    assert await c.telemetry_history("n") == [b"a", b"b"]
    await backend.advance(0.1 + SLACK)
    assert await c.telemetry_history("n") == []
    assert await c.latest_telemetry(["n"]) == {}


@pytest.mark.parametrize(("keep", "ttl_s"), [(0, 10.0), (3, 0.0)])
async def test_nonsense_bounds_are_refused(backend: Backend, keep: int, ttl_s: float) -> None:
    with pytest.raises(ValueError):
        await backend.coord.telemetry.append_telemetry("n", b"s", keep=keep, ttl_s=ttl_s)
