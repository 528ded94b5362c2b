"""Which instance speaks for each node identity, recorded in the shared store.

``node:owner:{node}`` holds "{instance} {conn_id}" of the connection that owns the identity,
with the long ``owner_ttl_s``. A new connection swaps itself in and learns the previous owner
(told to close with 4000 over the bus). Every claim also bumps ``node:owners-changed``; each
beat an instance reads that counter and, when it moved, re-reads the records of its nodes, so a
replace envelope lost on the bus cannot leave an identity live on two instances (and an idle
cluster reads one key a beat, not one per node). Every third of the TTL each record is
refreshed, which also finds any loss the counter missed: a share of them each beat (the claims
are dealt round the beats of that third like cards), not all at once (a script over 3,334 keys
every 5 s stopped the loop for 25-55 ms at 10,000 nodes, and Redis with it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

from coordinator.coordination import CoordinationUnavailable, KeyValue, keys
from coordinator.core import registry
from coordinator.core.node_table import NodeConnection
from coordinator.runtime.batched import Batched

log = logging.getLogger("gemmanet.ownership")


def refresh_turns(owner_ttl_s: float, beat_s: float) -> int:
    """The beats in a refresh period (a third of the owner TTL), at least one: a record is
    refreshed once in that many beats, so a beat or two late still leaves it a third of its
    TTL."""
    return max(1, int(owner_ttl_s / 3 / beat_s))


class Ownership:
    def __init__(
        self, coordination: KeyValue, instance_id: str, *, ttl_s: float, turns: int = 1
    ) -> None:
        self._coordination = coordination
        self.me = instance_id
        self._ttl_s = ttl_s
        # Connections whose claim completed, each with its turn among ``turns`` (the beats of
        # a refresh period): only those are checked (a claim still in flight would otherwise
        # look like a connection owned elsewhere).
        self._turn_of: dict[str, int] = {}
        self._turns: list[set[str]] = [set() for _ in range(max(1, turns))]
        self._dealt = 0  # claims dealt so far: the next one gets turn _dealt % turns
        self._turn = 0  # the turn ``confirm_turn`` refreshes next
        # The claims counter as of our last full read of the records (None: read them).
        self._checked_at: bytes | None = None

        # Claims of connections arriving together go out as one script (runtime/batched.py).
        self._claims: Batched[NodeConnection, bytes | None] = Batched(self._swap_many)

    async def run(self) -> NoReturn:
        """Sends the claims (a task of the instance nursery)."""
        await self._claims.run()

    async def claim(self, conn: NodeConnection) -> tuple[str, str] | None:
        """Make ``conn`` the owner of its identity; returns the previous (instance, conn)."""
        previous = await self._claims.call(conn)
        if conn.conn_id not in self._turn_of:
            turn = self._dealt % len(self._turns)
            self._dealt += 1
            self._turn_of[conn.conn_id] = turn
            self._turns[turn].add(conn.conn_id)
        return registry.parse_owner(previous)

    def _claimed(self, conn_id: str) -> bool:
        return conn_id in self._turn_of

    async def _swap_many(self, conns: list[NodeConnection]) -> list[bytes | None]:
        items = [
            (keys.owner_key(c.node_id), registry.owner_value(self.me, c.conn_id)) for c in conns
        ]
        return await self._coordination.swap_many(
            items, ttl_s=self._ttl_s, bump=keys.OWNERS_CHANGED
        )

    async def release(self, node_id: str, conn_id: str) -> None:
        """Drop our record, unless a newer connection already took it over."""
        turn = self._turn_of.pop(conn_id, None)
        if turn is not None:
            self._turns[turn].discard(conn_id)
        try:
            await self._coordination.compare_and_set(
                keys.owner_key(node_id), registry.owner_value(self.me, conn_id), None
            )
        except CoordinationUnavailable:
            pass  # it expires with its TTL

    async def confirm(self, conn: NodeConnection) -> bool:
        """Refresh our record, or take it back if it expired; False when owned elsewhere."""
        key, mine = keys.owner_key(conn.node_id), registry.owner_value(self.me, conn.conn_id)
        if await self._coordination.refresh_if(key, mine, self._ttl_s):
            return True
        return await self._take_back(key, mine)

    async def _take_back(self, key: str, mine: bytes) -> bool:
        """The record was not ours a moment ago: claim it if it is absent. A claim of this
        connection still in flight (runtime/batched.py) may have written it meanwhile, which
        is ours too, not a loss."""
        if await self._coordination.compare_and_set(key, None, mine, ttl_s=self._ttl_s):
            # Others watch the counter to re-read their records; if this bump is lost, their
            # refresh (``confirm_all``, a third of the TTL) still finds out.
            await self._coordination.incr(keys.OWNERS_CHANGED)
            return True
        return await self._coordination.get(key) == mine

    async def confirm_turn(
        self, by_conn: Callable[[str], NodeConnection | None]
    ) -> list[NodeConnection]:
        """``confirm_all`` for the connections whose turn it is (one beat of the refresh
        period: called once a beat, every record is refreshed once in ``turns`` beats)."""
        turn = self._turns[self._turn]
        self._turn = (self._turn + 1) % len(self._turns)
        conns = [c for conn_id in sorted(turn) if (c := by_conn(conn_id)) is not None]
        return await self.confirm_all(conns) if conns else []

    async def confirm_all(self, conns: list[NodeConnection]) -> list[NodeConnection]:
        """``confirm`` for many connections, the refreshes batched: those owned elsewhere.
        Only connections whose claim completed are checked (as in ``owned_elsewhere``)."""
        conns = [c for c in conns if self._claimed(c.conn_id)]
        keyed = [
            (keys.owner_key(c.node_id), registry.owner_value(self.me, c.conn_id)) for c in conns
        ]
        refreshed = await self._coordination.refresh_many(keyed, self._ttl_s)
        lost = []
        for conn, (key, mine), done in zip(conns, keyed, refreshed, strict=True):
            if not done and not await self._take_back(key, mine):
                lost.append(conn)
        return lost

    async def owned_elsewhere(self, conns: list[NodeConnection]) -> list[NodeConnection]:
        """One read of our nodes' records: the connections whose identity is owned by another
        connection now (a record that expired in a long freeze is claimed back)."""
        # Owner records move only by claims, and every claim bumps the counter: while it
        # stands still there is nothing to re-read (one GET a beat, not one key per node). It is
        # read before choosing the connections: one claimed meanwhile is checked now, or the
        # counter has moved past our mark and the next beat reads again.
        changed = await self._coordination.get(keys.OWNERS_CHANGED)
        if changed is not None and changed == self._checked_at:
            return []  # before looking at any connection: an idle beat is O(1)
        conns = [c for c in conns if self._claimed(c.conn_id)]
        if not conns:
            return []
        values = await self._coordination.get_many([keys.owner_key(c.node_id) for c in conns])
        self._checked_at = changed
        lost = []
        for conn, value in zip(conns, values, strict=True):
            owner = registry.parse_owner(value)
            if owner is None:
                if not await self.confirm(conn):
                    lost.append(conn)
            elif owner != (self.me, conn.conn_id):
                log.warning(
                    "node %s is owned by %s now; closing our connection", conn.node_id, owner[0]
                )
                lost.append(conn)
        return lost
