"""The facts of this instance's nodes in the shared store: what capacity leases are checked
against (``coordination/leases.py``).

A node's facts are written before its connection is usable (``write_now``), again when its
resident models change, and dropped when the connection ends. Changes are written in order per
node by one task (the latest state of a node wins), retried while the store is unreachable,
and every node's facts are rewritten every ``REFRESH_S`` so that a store that lost its data
(a Redis restart without persistence) is whole again within that time.
"""

from __future__ import annotations

import logging

import trio

from coordinator.capacity import Capacity
from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.coordination.leases import NodeFacts
from coordinator.core.effects import NodeFactsChanged
from coordinator.core.node_table import NodeConnection, NodeTable

log = logging.getLogger("gemmanet.node_facts")

REFRESH_S = 10.0
REFRESH_BATCH = 500
RETRY_S = 0.5


class NodeFactsWriter:
    def __init__(
        self, instance_id: str, capacity: Capacity, coordination: Coordination, nodes: NodeTable
    ) -> None:
        self.me = instance_id
        self._capacity = capacity
        self._coordination = coordination
        self._nodes = nodes
        # node id -> connection whose state to write (None: drop the facts of that connection)
        self._dirty: dict[str, tuple[str, bool]] = {}
        self._changed = trio.Event()

    def facts_of(self, conn: NodeConnection) -> NodeFacts:
        capacity = self._capacity
        return NodeFacts(
            node_id=conn.node_id,
            conn_id=conn.conn_id,
            instance_id=self.me,
            max_parallel=conn.max_parallel,
            memory_gb=conn.vram_gb,
            resident={m: capacity.cost(m).resident_gb for m in sorted(conn.resident)},
        )

    async def write_now(self, conn: NodeConnection) -> None:
        """Before a connection takes tasks. Raises CoordinationUnavailable."""
        await self._coordination.put_node_facts(self.facts_of(conn))

    def changed(self, effect: NodeFactsChanged) -> None:
        current = self._nodes.by_node(effect.node_id)
        if effect.gone and current is not None and current.conn_id != effect.conn_id:
            return  # an older connection of a node reconnected here: the facts are the new one's
        self._dirty[effect.node_id] = (effect.conn_id, effect.gone)
        self._changed.set()

    def rewrite_all(self) -> None:
        """The store lost its data: write every local node's facts again, now."""
        for conn in self._nodes.connections():
            self._dirty.setdefault(conn.node_id, (conn.conn_id, False))
        self._changed.set()

    async def run(self) -> None:
        while True:
            with trio.move_on_after(REFRESH_S) as waiting:
                await self._changed.wait()
            self._changed = trio.Event()
            if waiting.cancelled_caught:
                await self._refresh_all()
            await self._flush()

    async def _refresh_all(self) -> None:
        """Every node's facts again, ``REFRESH_BATCH`` per write (not a round trip per node:
        this is the idle cost that grows with the node count). Each batch is read from the
        table right before it is sent, like a single write; a failed batch falls back to the
        per-node queue and its retries."""
        ids = [c.node_id for c in self._nodes.connections() if c.node_id not in self._dirty]
        for at in range(0, len(ids), REFRESH_BATCH):
            batch = [self._nodes.by_node(i) for i in ids[at : at + REFRESH_BATCH]]
            conns = [c for c in batch if c is not None]
            try:
                await self._coordination.put_many_node_facts([self.facts_of(c) for c in conns])
            except CoordinationUnavailable as exc:
                log.warning("could not refresh the facts of %d node(s): %s", len(conns), exc)
                for conn in conns:
                    self._dirty.setdefault(conn.node_id, (conn.conn_id, False))

    async def _flush(self) -> None:
        coordination = self._coordination
        while self._dirty:
            node_id, (conn_id, gone) = next(iter(self._dirty.items()))
            del self._dirty[node_id]
            conn = self._nodes.by_conn(conn_id)
            try:
                if gone or conn is None:
                    await coordination.drop_node_facts(node_id, conn_id)
                else:
                    await coordination.put_node_facts(self.facts_of(conn))
            except CoordinationUnavailable as exc:
                log.warning("could not update the facts of node %s: %s", node_id, exc)
                self._dirty.setdefault(node_id, (conn_id, gone))
                await trio.sleep(RETRY_S)
