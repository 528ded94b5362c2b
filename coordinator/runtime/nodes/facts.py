"""The facts of this instance's nodes in the shared store: what capacity leases are checked
against (``coordination/leases.py``).

A node's facts are written before its connection is usable (``write_now``), again when its
resident models change, and dropped when the connection ends. Changes are written in order per
node by one task (the latest state of a node wins), retried while the store is unreachable,
and every node's facts are rewritten every ``REFRESH_S``. A store that restarted empty is
rewritten at once (a presence beat finds our entry gone: ``Membership.on_forgotten``); the
periodic rewrite is the backstop for data lost otherwise (a failover to a replica that missed
the last writes), so it can be rare: it costs a write of every node.
"""

from __future__ import annotations

import logging

import trio

from coordinator.capacity import Capacity
from coordinator.coordination import CoordinationUnavailable, Leases
from coordinator.coordination.leases import NodeFacts
from coordinator.core.effects import NodeFactsChanged
from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.runtime.batched import Batched

log = logging.getLogger("gemmanet.node_facts")

REFRESH_S = 60.0
REFRESH_BATCH = 500
RETRY_S = 0.5


class NodeFactsWriter:
    def __init__(
        self, instance_id: str, capacity: Capacity, coordination: Leases, nodes: NodeTable
    ) -> None:
        self.me = instance_id
        self._capacity = capacity
        self._coordination = coordination
        self._nodes = nodes
        # node id -> connection whose state to write (None: drop the facts of that connection)
        self._dirty: dict[str, tuple[str, bool]] = {}
        self._changed = trio.Event()
        # The first writes of connections arriving together go out as one (runtime/batched.py).
        self._first_writes: Batched[NodeFacts, None] = Batched(self._put_many)

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
        await self._first_writes.call(self.facts_of(conn))

    async def _put_many(self, facts: list[NodeFacts]) -> list[None]:
        await self._coordination.put_many_node_facts(facts)
        return [None] * len(facts)

    def changed(self, effect: NodeFactsChanged) -> None:
        current = self._nodes.by_node(effect.node_id)
        if effect.gone and current is not None and current.conn_id != effect.conn_id:
            return  # an older connection of a node reconnected here: the facts are the new one's
        self._dirty[effect.node_id] = (effect.conn_id, effect.gone)
        self._changed.set()

    def rewrite_all(self) -> None:
        """The store lost its data: write every local node's facts again, now."""
        for conn in self._nodes.connections():
            if not conn.moving:  # a moving node's facts stay dropped (runtime/drain.py)
                self._dirty.setdefault(conn.node_id, (conn.conn_id, False))
        self._changed.set()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._first_writes.run)
            await self._write_changes()

    async def _write_changes(self) -> None:
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
        ids = [
            c.node_id
            for c in self._nodes.connections()
            if c.node_id not in self._dirty and not c.moving
        ]
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
        """Every pending change: the new facts in batches of ``REFRESH_BATCH`` (a burst of
        connections is a few writes, not one round trip each), the dropped ones one by one
        (each compares the connection). A failed write stays pending and is retried after
        ``RETRY_S``, unless a newer change of that node came in meanwhile."""
        while self._dirty:
            dirty, self._dirty = self._dirty, {}
            puts = [i for i, (c, gone) in dirty.items() if not gone and self._serves(c)]
            failed = await self._put_in_batches(puts, dirty)
            written = set(puts)
            for node_id, (conn_id, _) in dirty.items():
                if node_id in written:
                    continue
                try:
                    await self._coordination.drop_node_facts(node_id, conn_id)
                except CoordinationUnavailable as exc:
                    log.warning("could not drop the facts of node %s: %s", node_id, exc)
                    failed.append(node_id)
            for node_id in failed:
                self._dirty.setdefault(node_id, dirty[node_id])
            if failed:
                await trio.sleep(RETRY_S)

    def _serves(self, conn_id: str) -> bool:
        """Whether the connection is here and may take leases (not moving off a drain)."""
        conn = self._nodes.by_conn(conn_id)
        return conn is not None and not conn.moving

    async def _put_in_batches(
        self, node_ids: list[str], dirty: dict[str, tuple[str, bool]]
    ) -> list[str]:
        """The node ids whose write failed."""
        failed: list[str] = []
        for at in range(0, len(node_ids), REFRESH_BATCH):
            batch = node_ids[at : at + REFRESH_BATCH]
            # Read right before sending: the state of each node as of this write.
            conns = [self._nodes.by_conn(dirty[i][0]) for i in batch]
            facts = [self.facts_of(c) for c in conns if c is not None]
            try:
                await self._coordination.put_many_node_facts(facts)
            except CoordinationUnavailable as exc:
                log.warning("could not update the facts of %d node(s): %s", len(facts), exc)
                failed.extend(batch)
        return failed
