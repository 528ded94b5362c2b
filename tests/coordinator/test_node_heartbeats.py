"""The heartbeat interval of an instance's connections (coordinator/runtime/nodes/heartbeats.py);
end to end, over real sockets, in tests/e2e/test_heartbeat_rate.py."""

from __future__ import annotations

import msgspec
import pytest
import trio

from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.runtime.nodes.heartbeats import RAISE_STEP, NodeHeartbeats
from coordinator.runtime.nodes.link import NodeLink
from coordinator.settings import Settings


def connection(conn_id: str) -> NodeConnection:
    return NodeConnection(conn_id=conn_id, node_id=conn_id, models=frozenset({"m"}),
                          max_parallel=1, vram_gb=None, agent_version="", connected_at=0.0,
                          last_seen=0.0)  # fmt: skip


def attach(plan: NodeHeartbeats, links: dict[str, NodeLink], nodes: NodeTable, name: str) -> None:
    link, conn = NodeLink(), connection(name)
    plan.attach(link, conn, links, nodes)
    nodes.register(conn)
    links[name] = link


def test_the_interval_grows_for_everybody_in_steps_and_shrinks_for_newcomers() -> None:
    plan = NodeHeartbeats(Settings(heartbeat_interval_s=1.0, heartbeat_rate=10.0))
    links: dict[str, NodeLink] = {}
    nodes = NodeTable()
    for i in range(40):
        attach(plan, links, nodes, f"c{i}")
    # 40 nodes at 10 a second call for 4 s; raised in steps of a quarter, it is within one
    current = plan.interval_s
    assert 4.0 / RAISE_STEP <= current <= 4.0
    # A few steps for 40 connections, not one per connection past the tenth.
    told = {link.heartbeat_s for link in links.values()}
    assert len(told) <= 8, told
    # Everybody connected before is told the current interval in their next heartbeat, and
    # is judged on it at once (3 intervals).
    for conn_id, link in links.items():
        assert (link.pending_s or link.heartbeat_s) == pytest.approx(current)
        conn = nodes.by_conn(conn_id)
        assert conn is not None and conn.silent_after_s == pytest.approx(3 * current)
    # Most of them leave: a newcomer gets the short interval, the others keep theirs.
    for i in range(35):
        nodes.unregister(f"c{i}")
        del links[f"c{i}"]
    attach(plan, links, nodes, "late")
    assert links["late"].heartbeat_s == 1.0
    assert (links["c39"].pending_s or links["c39"].heartbeat_s) == pytest.approx(current)


def test_no_rate_means_the_base_interval_whatever_the_count() -> None:
    plan = NodeHeartbeats(Settings(heartbeat_interval_s=2.0, heartbeat_rate=0.0))
    links: dict[str, NodeLink] = {}
    nodes = NodeTable()
    for i in range(500):
        attach(plan, links, nodes, f"c{i}")
    assert {link.heartbeat_s for link in links.values()} == {2.0}
    assert all(link.pending_s is None for link in links.values())


class CountingLinks(dict[str, NodeLink]):
    """The instance's links, counting how many the timer looked up."""

    looked_up = 0

    def get(self, key: str, default: NodeLink | None = None) -> NodeLink | None:  # type: ignore[override]
        self.looked_up += 1
        return super().get(key, default)


def sent(link: NodeLink) -> list[dict[str, object]]:
    """The envelopes queued for ``link`` so far (all heartbeats here), as JSON objects."""
    out = []
    while True:
        try:
            out.append(msgspec.json.decode(link.outbox.receive_nowait()))
        except trio.WouldBlock:
            return out


async def test_the_timer_sends_each_link_its_pace_and_touches_only_the_due(
    autojump_clock: object,
) -> None:
    # 200 nodes at 20 a second: 10 s intervals; the base is 1 s, in ticks of 0.1 s
    plan = NodeHeartbeats(Settings(heartbeat_interval_s=1.0, heartbeat_rate=20.0))
    links = CountingLinks()
    nodes = NodeTable()
    for i in range(200):
        attach(plan, links, nodes, f"c{i}")
    # links told their interval in the welcome (nothing pending) keep one pace: a heartbeat on
    # every tick whose remainder is their share
    steady = {
        name: sum(1 for tick in range(1, 301) if tick % link.every == link.share)
        for name, link in links.items()
        if link.pending_s is None
    }
    assert len(steady) > 20
    async with trio.open_nursery() as nursery:
        nursery.start_soon(plan.run, links)
        await trio.sleep(30.05)  # 300 ticks
        nursery.cancel_scope.cancel()
    per_link = {name: sent(link) for name, link in links.items()}
    assert {name: len(per_link[name]) for name in steady} == steady
    # the others were told the longer interval in their first heartbeat, then went at it
    for name, beats in per_link.items():
        if name not in steady:
            assert beats[0].get("interval_s") == links[name].heartbeat_s
            assert all("interval_s" not in b for b in beats[1:])
            assert len(beats) >= 30 / links[name].heartbeat_s - 1
    # Lookups follow the heartbeats sent, not ticks x links (300 x 200 = 60,000).
    total = sum(len(b) for b in per_link.values())
    assert links.looked_up == total


async def test_a_link_that_left_gets_no_more_heartbeats(autojump_clock: object) -> None:
    plan = NodeHeartbeats(Settings(heartbeat_interval_s=1.0, heartbeat_rate=0.0))
    links: dict[str, NodeLink] = {}
    nodes = NodeTable()
    for name in ("a", "b"):
        attach(plan, links, nodes, name)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(plan.run, links)
        await trio.sleep(2.05)
        gone = links.pop("a")
        before = len(sent(gone))
        await trio.sleep(3.0)
        nursery.cancel_scope.cancel()
    assert before == 2
    assert sent(gone) == []
    assert len(sent(links["b"])) == 5
