"""GEMMANET_HEARTBEAT_RATE: past that many node heartbeats a second, an instance tells new
nodes a longer interval, and the nodes already connected in their next heartbeat; it sends its
own heartbeat at that interval and judges a node silent after three of its intervals (issue 11:
idle CPU that stops growing with the node count; coordinator/runtime/nodes/heartbeats.py).

Here the base interval is 0.5 s and the rate 4/s: the first two nodes get 0.5 s, the third
0.75 s and the fourth 1.0 s, and the instance raises everybody to 1.0 s."""

from __future__ import annotations

import itertools
import time
from contextlib import AsyncExitStack
from pathlib import Path

import msgspec
import pytest
import trio

from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.runtime.nodes.heartbeats import heartbeat_interval
from protocol import CloseCode, Heartbeat
from tests.fixtures.processes import Processes, wait_until
from tests.fixtures.raw_node import RawNode, raw_node


def test_the_interval_stretches_past_the_rate_in_whole_ticks_up_to_a_minute() -> None:
    assert heartbeat_interval(2.0, 0, 100_000) == 2.0  # 0: no limit
    assert heartbeat_interval(2.0, 200, 400) == 2.0  # 400 nodes / 2 s = 200 a second
    assert heartbeat_interval(2.0, 200, 401) == pytest.approx(2.2)  # 2.005 -> whole 0.2 s ticks
    assert heartbeat_interval(2.0, 200, 3334) == pytest.approx(16.8)
    assert heartbeat_interval(2.0, 200, 10**7) == 60.0


def test_a_connection_told_a_longer_interval_is_judged_on_it() -> None:
    table = NodeTable()
    for conn_id, silent_after in (("base", 0.0), ("slow", 3.0)):
        conn = NodeConnection(conn_id=conn_id, node_id=conn_id, models=frozenset({"m"}),
                              max_parallel=1, vram_gb=None, agent_version="", connected_at=0.0,
                              last_seen=0.0, silent_after_s=silent_after)  # fmt: skip
        table.register(conn)
    assert [c.conn_id for c in table.silent(now=2.0, deadline_s=1.5)] == ["base"]
    assert [c.conn_id for c in table.silent(now=3.1, deadline_s=1.5)] == ["base", "slow"]


@pytest.mark.e2e
async def test_nodes_past_the_rate_are_told_and_sent_a_longer_interval(procs: Processes) -> None:
    coord = procs.coordinator(GEMMANET_HEARTBEAT_RATE="4")
    async with AsyncExitStack() as stack:
        nodes: list[RawNode] = []
        for i in range(4):
            node_id = f"n{i}"
            nodes.append(await stack.enter_async_context(
                raw_node(coord.url, node_id, procs.enroll(node_id), heartbeats=False)
            ))  # fmt: skip
        told = [n.welcome.heartbeat_interval_s for n in nodes if n.welcome is not None]
        assert told == pytest.approx([0.5, 0.5, 0.75, 1.0])
        heard: dict[int, list[tuple[float, object]]] = {0: [], 3: []}

        async def listen(i: int) -> None:
            while True:
                envelope = await nodes[i].receive(skip_heartbeats=False)
                assert isinstance(envelope, Heartbeat), envelope
                heard[i].append((trio.current_time(), envelope.interval_s))

        async with trio.open_nursery() as nursery:
            for node in nodes:
                nursery.start_soon(node.beat, 0.2)  # all alive: no silence verdict here
            for i in heard:
                nursery.start_soon(listen, i)
            await trio.sleep(5.0)
            nursery.cancel_scope.cancel()
    # The first node, told 0.5 s at its welcome, is told 1.0 s in a heartbeat (0.75 s first,
    # if that heartbeat went out before the fourth node came) and then hears one a second.
    told_later = [interval for _, interval in heard[0] if interval is not msgspec.UNSET]
    assert told_later and told_later[-1] == 1.0, heard[0]
    for i, times in heard.items():
        since = [t for t, _ in times[len(told_later) :]] if i == 0 else [t for t, _ in times]
        gaps = [b - a for a, b in itertools.pairwise(since)]
        assert len(gaps) >= 2, (i, times)
        assert min(gaps) > 0.7 and max(gaps) < 1.6, (i, gaps)


def test_real_agents_follow_the_longer_interval_and_stay_connected(procs: Processes) -> None:
    """The node agent keeps the coordinator's pace: an agent still expecting a heartbeat every
    0.5 s would declare the coordinator dead (1.5 s) once it sends one a second."""
    coord = procs.coordinator(GEMMANET_HEARTBEAT_RATE="4")
    agents = [procs.node(coord, f"agent{i}") for i in range(4)]
    first = {n["node_id"]: n["connected_at"] for n in coord.nodes()}
    time.sleep(5.0)
    assert {n["node_id"]: n["connected_at"] for n in coord.nodes()} == first  # no reconnects
    logs = [Path(a.log_path).read_text() for a in agents]  # type: ignore[attr-defined]
    assert "coordinator asks for a heartbeat every 1.0 s" in logs[0]
    for log in logs:
        assert "nothing from the coordinator" not in log and "heartbeat timeout" not in log


@pytest.mark.e2e
async def test_a_node_told_a_longer_interval_is_dropped_after_three_of_its_own(
    procs: Processes,
) -> None:
    coord = procs.coordinator(GEMMANET_HEARTBEAT_RATE="2")  # one node at 0.5 s, then 1.0 s
    async with (
        raw_node(coord.url, "first", procs.enroll("first")),
        raw_node(coord.url, "second", procs.enroll("second")) as second,
    ):
        assert second.welcome is not None and second.welcome.heartbeat_interval_s == 1.0
        await trio.sleep(1.0)
        second.silence()
        silent_since = time.monotonic()
        code = await second.close_code(timeout=10)
        waited = time.monotonic() - silent_since
        wait_until(lambda: coord.status()["online_nodes"] == 1, "only the silent node dropped")
    assert code == CloseCode.HEARTBEAT_TIMEOUT
    # three of its 1.0 s intervals (its last heartbeat was up to 0.5 s before the silence),
    # not three of the base 0.5 s; the sweep adds up to 0.5 s more
    assert 2.3 < waited < 5.0, waited
