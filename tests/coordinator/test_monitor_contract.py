"""The monitor election and fenced fact writes, on both backends (memory on a fake clock, a
real redis-server): one holder at a time; a takeover after the TTL bumps the epoch, which never
goes backwards (not even when the lease key is deleted); a deposed writer's write is rejected,
counted, and never visible through ``host_facts``. The placement switch of direct hosts
(``gemmanet audit --enable``): never set reads as none, every client reads what was last set,
and a value that is no switch reads as none (off)."""

from __future__ import annotations

import json

from coordinator.coordination.keys import HOST_PLACEMENT
from coordinator.coordination.monitor_types import PlacementSwitch
from tests.fixtures.coordination_backend import SLACK, Backend

TTL = 0.3


def record(host: str, epoch: int, model: str) -> bytes:
    body = {"host_id": host, "kind": "ollama", "reachable": True, "epoch": epoch}
    body |= {"resident": {model: 4.5}, "models": [model]}
    return json.dumps(body).encode()


async def test_one_holder_at_a_time(backend: Backend) -> None:
    c = backend.coord.monitor
    first = await c.monitor_acquire("a", TTL)
    assert first.held and first.holder == "a" and first.epoch == 1
    async with backend.open_peer() as peer:
        second = await peer.monitor.monitor_acquire("b", TTL)
        assert not second.held and second.holder == "a" and second.epoch == 1
        # Only the holder, naming its epoch, renews.
        assert not await peer.monitor.monitor_renew("b", 1, TTL)
        assert not await c.monitor_renew("a", 2, TTL)
        assert await c.monitor_renew("a", 1, TTL)
    status = await c.monitor_status()
    assert (status.holder, status.lease_epoch, status.epoch) == ("a", 1, 1)


async def test_takeover_after_the_ttl_bumps_the_epoch(backend: Backend) -> None:
    c = backend.coord.monitor
    assert (await c.monitor_acquire("a", TTL)).epoch == 1
    await backend.advance(TTL / 2)
    assert await c.monitor_renew("a", 1, TTL)  # a renewed lease outlives the first TTL
    await backend.advance(TTL / 2 + SLACK)
    assert not (await c.monitor_acquire("b", TTL)).held
    await backend.advance(TTL + SLACK)
    taken = await c.monitor_acquire("b", TTL)
    assert taken.held and taken.epoch == 2
    assert not await c.monitor_renew("a", 1, TTL)


async def test_the_epoch_never_goes_backwards(backend: Backend) -> None:
    c = backend.coord
    assert (await c.monitor.monitor_acquire("a", TTL)).epoch == 1
    await c.key_value.delete("monitor:lease")
    assert (await c.monitor.monitor_acquire("b", TTL)).epoch == 2
    assert await c.monitor.monitor_resign("b", 2)
    assert (await c.monitor.monitor_acquire("a", TTL)).epoch == 3
    # The counter has no TTL: long after every lease expired it still holds 3.
    await backend.advance(TTL * 3)
    assert (await c.monitor.monitor_status()).epoch == 3
    assert (await c.monitor.monitor_acquire("c", TTL)).epoch == 4


async def test_a_deposed_writer_is_rejected_counted_and_never_visible(backend: Backend) -> None:
    c = backend.coord
    assert (await c.monitor.monitor_acquire("old", TTL)).epoch == 1
    assert await c.monitor.write_host_facts("old", 1, "h1", record("h1", 1, "m-old"))
    await backend.advance(TTL + SLACK)  # "old" paused past its lease
    assert (await c.monitor.monitor_acquire("new", TTL)).epoch == 2
    assert await c.monitor.write_host_facts("new", 2, "h1", record("h1", 2, "m-new"))
    # The deposed owner resumes and writes with its old token: rejected, counted.
    assert not await c.monitor.write_host_facts("old", 1, "h1", record("h1", 1, "m-stale"))
    assert not await c.monitor.write_host_facts("old", 1, "h2", record("h2", 1, "m-stale"))
    # The right epoch is not enough: the lease must be the writer's too.
    assert not await c.monitor.write_host_facts("other", 2, "h1", record("h1", 2, "m-x"))
    facts = await c.monitor.host_facts()
    assert set(facts) == {"h1"}
    assert facts["h1"].epoch == 2 and facts["h1"].resident == {"m-new": 4.5}
    assert (await c.monitor.monitor_status()).fenced_rejects == 3
    assert await c.key_value.get("monitor:fenced_rejects") == b"3"
    assert await c.monitor.accepted_fact_writes(1) == 1
    assert await c.monitor.accepted_fact_writes(2) == 1


async def test_the_unfenced_switch_lets_a_deposed_write_through(backend: Backend) -> None:
    # What the test-only switch does, so that prove-takeover's failing gate is meaningful.
    c = backend.coord.monitor
    await c.monitor_acquire("old", TTL)
    await backend.advance(TTL + SLACK)
    await c.monitor_acquire("new", TTL)
    assert await c.write_host_facts("old", 1, "h1", record("h1", 1, "m"), fenced=False)
    assert (await c.host_facts(["h1"]))["h1"].epoch == 1
    assert await c.accepted_fact_writes(1) == 1


async def test_facts_carry_their_age_on_the_store_clock(backend: Backend) -> None:
    c = backend.coord.monitor
    await c.monitor_acquire("a", 5.0)
    assert await c.host_facts() == {}
    await c.write_host_facts("a", 1, "h1", record("h1", 1, "m"))
    await backend.advance(0.2)
    async with backend.open_peer() as peer:
        facts = await peer.monitor.host_facts(["h1", "absent"])
    assert list(facts) == ["h1"]
    seen = facts["h1"]
    assert 0.2 - SLACK <= seen.age_s <= 0.2 + 0.5
    assert seen.record["polled_at"] == seen.polled_at
    assert seen.fresh(1.0) and not seen.fresh(0.1)
    assert seen.reachable and seen.record["models"] == ["m"]


async def test_the_placement_switch_holds_what_was_set_until_set_again(backend: Backend) -> None:
    c = backend.coord.monitor
    assert await c.host_placement() is None  # never set: off (core/hosts/gate.py)
    on = PlacementSwitch(enabled=True, by="alice@ops", at=1_764_000_000.5, epoch=3)
    await c.set_host_placement(on)
    async with backend.open_peer() as peer:  # every instance reads the same switch
        assert await peer.monitor.host_placement() == on
    off = PlacementSwitch(enabled=False, by="bob", at=1_764_000_100.0)
    await c.set_host_placement(off)
    assert await c.host_placement() == off


async def test_a_value_that_is_no_switch_reads_as_none(backend: Backend) -> None:
    for raw in (b"1", b"on", b'{"enabled": "yes", "by": "x", "at": 1, "epoch": null}', b"{}"):
        await backend.coord.key_value.set(HOST_PLACEMENT, raw)
        assert await backend.coord.monitor.host_placement() is None, raw
