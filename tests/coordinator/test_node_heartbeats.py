"""The heartbeat interval of an instance's connections (coordinator/runtime/node_heartbeats.py);
end to end, over real sockets, in tests/e2e/test_heartbeat_rate.py."""

from __future__ import annotations

import pytest

from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.runtime.node_heartbeats import RAISE_STEP, NodeHeartbeats
from coordinator.runtime.node_link import NodeLink
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
