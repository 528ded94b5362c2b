"""The node connections of one instance, keyed by connection and by node identity."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from coordinator.core.placement.choose import NodeView, Pool

#: ``silent`` looks this much before the earliest verdict it expects
SCAN_EARLY_S = 1e-6


@dataclass(eq=False)
class NodeConnection:
    """One accepted WebSocket of one node identity. ``conn_id`` is unique per connection, so a
    reconnect of the same node is a different connection and cannot answer the old one's tasks."""

    conn_id: str
    node_id: str
    #: the models placement may use it for now: those of its hello, none while its backend
    #: is down (changed through ``NodeTable.set_backend_down``)
    models: frozenset[str]
    max_parallel: int
    vram_gb: float | None
    agent_version: str
    connected_at: float
    last_seen: float
    #: the tasks running on it (changed through ``NodeTable``: the snapshot watches it)
    tasks: set[str] = field(default_factory=set)
    #: models the node reported loaded in its last heartbeat
    resident: frozenset[str] = frozenset()
    #: silent this long, the node is dropped (three of the heartbeat intervals it was told);
    #: 0: the instance's deadline for all nodes (``silent``'s ``deadline_s``)
    silent_after_s: float = 0.0
    #: the protocol version its welcome fixed: a v1 node gets a conversation as a transcript
    protocol: int = 1
    #: why its agent says its model backend cannot serve (``Hello``/``Heartbeat.backend_down``),
    #: None while it answers
    backend_down: str | None = None
    #: the models of its hello (what ``models`` is while the backend answers); default: models
    advertised: frozenset[str] = frozenset()
    #: its instance drains: it serves nothing more here (``NodeTable.withdraw``)
    moving: bool = False

    def __post_init__(self) -> None:
        if not self.advertised:
            self.advertised = self.models

    @property
    def in_flight(self) -> int:
        return len(self.tasks)


class NodeTable:
    """Which connection currently speaks for each node identity on this instance."""

    def __init__(self) -> None:
        self._by_conn: dict[str, NodeConnection] = {}
        self._by_node: dict[str, NodeConnection] = {}
        # model -> the connections serving it (placement draws samples from these)
        self._serving: dict[str, Pool[NodeConnection]] = {}
        # ``connections()``, kept until a connection comes or goes (every beat reads it: the
        # snapshot, the ownership check; sorting thousands of them each time showed up idle)
        self._sorted: list[NodeConnection] | None = None
        #: bumped when a connection comes or goes or its tasks change: what an instance
        #: snapshot holds is the same while it stands still (one check a beat, not one a node)
        self.changes = 0
        #: bumped only when a connection comes or goes (the roster peers fetch in full)
        self.roster_changes = 0
        #: conn id -> tasks running, for the connections running any (the load a beat carries:
        #: it grows with the work, not with the node count)
        self.busy: dict[str, int] = {}
        # ``silent`` looks at the connections only from this time on: no verdict can fall
        # earlier (see there), so a sweep between verdicts costs nothing per node.
        self._silent_scan_at = -math.inf
        self._silent_deadline_s = math.nan
        #: how many times ``silent`` looked at every connection (tests count scans)
        self.silent_scans = 0

    def __len__(self) -> int:
        return len(self._by_node)

    def register(self, conn: NodeConnection) -> NodeConnection | None:
        """Make ``conn`` the connection of its node; returns the connection it replaces."""
        previous = self._by_node.get(conn.node_id)
        self._sorted = None
        self.changes += 1
        self.roster_changes += 1
        self._silent_scan_at = -math.inf  # its own deadline may come before the planned scan
        if previous is not None:
            del self._by_conn[previous.conn_id]
            self.busy.pop(previous.conn_id, None)
            self._unlist(previous)
        if conn.tasks:
            self.busy[conn.conn_id] = len(conn.tasks)
        self._by_node[conn.node_id] = conn
        self._by_conn[conn.conn_id] = conn
        for model in conn.models:
            self._serving.setdefault(model, Pool()).add(conn.conn_id, conn)
        return previous

    def unregister(self, conn_id: str) -> NodeConnection | None:
        """Forget ``conn_id``; a no-op when it was already replaced."""
        conn = self._by_conn.pop(conn_id, None)
        if conn is not None and self._by_node.get(conn.node_id) is conn:
            del self._by_node[conn.node_id]
            self._unlist(conn)
            self._sorted = None
            self.changes += 1
            self.roster_changes += 1
        if conn is not None:
            self.busy.pop(conn_id, None)
        return conn

    def add_task(self, conn: NodeConnection, task_id: str) -> None:
        conn.tasks.add(task_id)
        self._load_moved(conn)

    def end_task(self, conn: NodeConnection, task_id: str) -> None:
        conn.tasks.discard(task_id)
        self._load_moved(conn)

    def end_all_tasks(self, conn: NodeConnection) -> None:
        conn.tasks.clear()
        self._load_moved(conn)

    def _load_moved(self, conn: NodeConnection) -> None:
        self.changes += 1
        if self._by_conn.get(conn.conn_id) is not conn:
            return  # no longer listed: it has no load to publish
        if conn.tasks:
            self.busy[conn.conn_id] = len(conn.tasks)
        else:
            self.busy.pop(conn.conn_id, None)

    def _unlist(self, conn: NodeConnection) -> None:
        for model in conn.models:
            pool = self._serving.get(model)
            if pool is not None:
                pool.remove(conn.conn_id)
                if not pool:
                    del self._serving[model]

    def set_backend_down(self, conn: NodeConnection, problem: str | None) -> bool:
        """``conn``'s agent says its backend is down (``problem``) or answers (None): while it
        is down the connection serves no model (placement passes it by). True when that
        flipped (a new wording of the same state changes nothing else)."""
        if (problem is None) == (conn.backend_down is None):
            if problem is not None:
                conn.backend_down = problem
            return False
        listed = self._by_conn.get(conn.conn_id) is conn and self._by_node.get(conn.node_id) is conn
        if listed:
            self._unlist(conn)
        conn.backend_down = problem
        conn.models = frozenset() if problem is not None or conn.moving else conn.advertised
        if listed:
            for model in conn.models:
                self._serving.setdefault(model, Pool()).add(conn.conn_id, conn)
        # What peers place on is in the stored snapshot, rewritten when the roster moves.
        self.changes += 1
        self.roster_changes += 1
        return True

    def withdraw(self, conn: NodeConnection) -> None:
        """``conn`` takes no new task (its instance drains): placement passes it by, here and,
        through the snapshot, on the peers. Its running tasks go on."""
        if conn.moving:
            return
        if self._by_conn.get(conn.conn_id) is conn and self._by_node.get(conn.node_id) is conn:
            self._unlist(conn)
        conn.moving = True
        conn.models = frozenset()
        self.changes += 1
        self.roster_changes += 1

    def models(self) -> set[str]:
        """The models some connection here serves."""
        return set(self._serving)

    def serving(self, model: str) -> Pool[NodeConnection]:
        """The connections serving ``model``, in no particular order (an empty pool if none)."""
        return self._serving.get(model) or Pool()

    def by_conn(self, conn_id: str) -> NodeConnection | None:
        return self._by_conn.get(conn_id)

    def by_node(self, node_id: str) -> NodeConnection | None:
        return self._by_node.get(node_id)

    def lengthen_silence(self, conn: NodeConnection, silent_after_s: float) -> None:
        """``conn`` (listed here, or about to be) was told a heartbeat interval that lets it be
        silent ``silent_after_s``: its own deadline grows at once, before the node has heard of
        it (lenient first). Never shortened: ``silent`` plans its next look on that."""
        conn.silent_after_s = max(conn.silent_after_s, silent_after_s)

    def touch(self, conn_id: str, now: float) -> None:
        conn = self._by_conn.get(conn_id)
        if conn is not None:
            conn.last_seen = now

    def silent(self, now: float, deadline_s: float) -> list[NodeConnection]:
        """Connections that sent nothing for longer than ``deadline_s`` and than their own
        ``silent_after_s`` (a connection told a longer heartbeat interval).

        Called every sweep; looks at every connection only when the earliest verdict the last
        look found possible is due. That time only moves later for a connection (``last_seen``
        grows, ``silent_after_s`` is only ever lengthened), and a new connection, or another
        ``deadline_s``, makes the next call look again."""
        if deadline_s == self._silent_deadline_s and now < self._silent_scan_at:
            return []
        self.silent_scans += 1
        silent = []
        earliest = math.inf
        for c in self._by_conn.values():
            allowed = max(deadline_s, c.silent_after_s)
            if now - c.last_seen > allowed:
                silent.append(c)
            elif c.last_seen + allowed < earliest:
                earliest = c.last_seen + allowed
        # a hair early, so float rounding in the verdict's subtraction cannot make it late
        self._silent_scan_at = earliest - SCAN_EARLY_S
        self._silent_deadline_s = deadline_s
        return silent

    def connections(self) -> list[NodeConnection]:
        """The connections by node id (a new list: the caller may keep or change it)."""
        if self._sorted is None:
            self._sorted = sorted(self._by_node.values(), key=lambda c: c.node_id)
        return list(self._sorted)

    def views(self, instance_id: str, ratings: dict[str, tuple[float, int]]) -> list[NodeView]:
        return [view_of(c, instance_id, ratings) for c in self.connections()]


def view_of(
    conn: NodeConnection, instance_id: str, ratings: dict[str, tuple[float, int]]
) -> NodeView:
    """What placement sees of a local connection now."""
    return NodeView(
        node_id=conn.node_id,
        instance_id=instance_id,
        conn_id=conn.conn_id,
        models=conn.models,
        max_parallel=conn.max_parallel,
        in_flight=conn.in_flight,
        rating=ratings[conn.node_id][0] if conn.node_id in ratings else None,
    )
