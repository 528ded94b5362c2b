"""Our heartbeats to the nodes, and the heartbeat interval each node is told.

Every heartbeat costs about 150 us of CPU on each side of the socket (more for a send on
loopback), so an instance holding thousands of nodes at the base interval (GEMMANET_HEARTBEAT_S)
would spend its idle time on them. Past GEMMANET_HEARTBEAT_RATE heartbeats a second, the interval
grows with the node count (nodes / rate): new nodes are told it in their welcome, nodes already
connected in their next heartbeat (``Heartbeat.interval_s``), so that the whole instance stays
near the rate however many nodes it holds. The interval only grows while a connection lives (a
node that reconnects gets the current one); it is raised in steps of a quarter at least, so a
connection storm changes it a few times, not once per node. When most nodes have left, new
connections get the shorter interval their count calls for.

Changing a node's interval is safe in both directions of the silence verdict:

* our deadline for the node (``NodeTable.lengthen_silence``) is lengthened at once, before the
  node has heard of it (being lenient first is never wrong);
* our heartbeats to it keep their old pace until the one that carries the new interval has gone
  out; only then do they slow down, so the node never waits longer than its old deadline for a
  heartbeat that would tell it to wait longer.

One timer sends them all, spread over ``HEARTBEAT_TICKS`` ticks of the base interval (a timer per
connection was a tenth of the idle CPU with thousands of nodes: every expiry is a cancel-scope
wake-up; and one burst of thousands of sends would make requests queue behind it). Each tick
takes the links due on it from a wheel (tick -> links): it touches only those, not every link."""

from __future__ import annotations

import math
from collections.abc import Mapping

import trio

from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.runtime.nodes.link import HEARTBEAT_TICKS, NodeLink
from coordinator.settings import MAX_HEARTBEAT_S, Settings
from protocol import Heartbeat, encode

__all__ = ["RAISE_STEP", "NodeHeartbeats", "heartbeat_interval"]

#: the interval of an instance is raised only when it must grow by at least this factor
RAISE_STEP = 1.25


def heartbeat_interval(base_s: float, rate: float, nodes: int) -> float:
    """The interval that keeps ``nodes`` within ``rate`` heartbeats a second (0: no limit):
    ``base_s`` while they fit, else nodes / rate in whole ticks of the base, at most a minute."""
    if rate <= 0 or nodes <= base_s * rate:
        return base_s
    tick = base_s / HEARTBEAT_TICKS
    return min(max(base_s, math.ceil(nodes / rate / tick) * tick), MAX_HEARTBEAT_S)


class NodeHeartbeats:
    """The interval of this instance's node connections, and the timer that sends ours."""

    def __init__(self, settings: Settings) -> None:
        self.base_s = settings.heartbeat_interval_s
        self.rate = settings.heartbeat_rate
        self.misses = settings.heartbeat_misses
        #: what a node connecting now is told
        self.interval_s = self.base_s
        self._attached = 0
        # The tick the timer is at, and the links due on each coming tick (with the id they
        # were attached under: a link no longer in the instance's links is dropped when due).
        self._tick = 0
        self._due: dict[int, list[tuple[str, NodeLink]]] = {}

    def attach(
        self,
        link: NodeLink,
        conn: NodeConnection,
        links: Mapping[str, NodeLink],
        nodes: NodeTable,
    ) -> None:
        """Give a new connection (not yet in ``links``) its interval, before its welcome; when
        the node count calls for a longer one, raise it for every connection in ``links``."""
        wanted = heartbeat_interval(self.base_s, self.rate, len(links) + 1)
        if wanted >= self.interval_s * RAISE_STEP or (
            wanted > self.interval_s and wanted >= MAX_HEARTBEAT_S
        ):
            self.interval_s = wanted
            for conn_id, other in links.items():
                if max(other.heartbeat_s, other.pending_s or 0.0) < wanted:
                    other.pending_s = wanted  # told in its next heartbeat
                    known = nodes.by_conn(conn_id)
                    if known is not None:
                        nodes.lengthen_silence(known, wanted * self.misses)  # lenient at once
        elif wanted * RAISE_STEP <= self.interval_s:
            # Most nodes left: new ones get the shorter interval (those still connected keep
            # theirs; together they stay within the rate).
            self.interval_s = wanted
        # Spread over the ticks in connection order (deterministic in the simulator, unlike a
        # hash of the connection id).
        self._attached += 1
        link.seq = self._attached
        self._pace(link, self.interval_s)
        self._schedule(conn.conn_id, link)
        nodes.lengthen_silence(conn, self.interval_s * self.misses)

    def _pace(self, link: NodeLink, interval_s: float) -> None:
        link.heartbeat_s = interval_s
        link.every = max(1, round(interval_s / self.base_s * HEARTBEAT_TICKS))
        link.share = link.seq % link.every

    def _schedule(self, conn_id: str, link: NodeLink) -> None:
        """Put ``link`` on its next tick: the first after this one whose remainder is its
        share."""
        after = self._tick + 1
        due = after + (link.share - after) % link.every
        self._due.setdefault(due, []).append((conn_id, link))

    async def run(self, links: Mapping[str, NodeLink]) -> None:
        """Our heartbeat to every link in ``links`` (conn id -> link, the instance's own map),
        each at its own interval (a task of the instance)."""
        plain = encode(Heartbeat())
        while True:
            await trio.sleep(self.base_s / HEARTBEAT_TICKS)
            self._tick += 1
            due = self._due.pop(self._tick, [])
            due.sort(key=lambda item: item[1].seq)  # in connection order, as before the wheel
            for conn_id, link in due:
                if links.get(conn_id) is not link:
                    continue  # gone (or replaced): it leaves the wheel here
                if link.pending_s is None:
                    link.send_encoded_nowait(plain)
                else:
                    link.send_nowait(Heartbeat(interval_s=link.pending_s))
                    self._pace(link, link.pending_s)  # slower only once it has been told
                    link.pending_s = None
                self._schedule(conn_id, link)
