"""Costs that must follow changes, not the node count (issue 11, "ten thousand nodes").

* a beat carries a digest of the snapshot; a peer's unchanged snapshot is neither fetched,
  nor decoded again, nor handed to placement again;
* placement picks its first candidates without sorting every node, in the very order the full
  sort gives;
* the per-request "does anything serve this model" check follows peers that come and go;
* the periodic rewrite of node facts goes in batches, not one round trip per node;
* a beat under load carries the busy connections, not every node: the node list is written
  and fetched when a node comes or goes;
* an idle beat and an idle sweep look at no node: the snapshot is the previous one itself, the
  ownership check stops at the claims counter, the silence check waits for its first possible
  verdict.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.capacity import parse_capacity
from coordinator.coordination import keys
from coordinator.coordination.bus.memory import MemoryBus
from coordinator.coordination.leases import NodeFacts
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.coordination.memory.roles import MemoryLeases
from coordinator.core import cluster_view, registry
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.core.placement.choose import NodeView, rank_candidates
from coordinator.core.registry import InstanceSnapshot, NodeEntry
from coordinator.runtime.cluster.membership import Membership
from coordinator.runtime.cluster.ownership import Ownership
from coordinator.runtime.nodes import facts as node_facts
from coordinator.settings import Settings


def snapshot(instance: str, nodes: int, *, in_flight: int = 0) -> InstanceSnapshot:
    entries = [
        NodeEntry(node_id=f"{instance}-n{i}", conn_id=f"{instance}-c{i}", models=["m"],
                  max_parallel=2, in_flight=in_flight)
        for i in range(nodes)
    ]  # fmt: skip
    return InstanceSnapshot(instance_id=instance, in_flight=0, nodes=entries)


async def test_an_unchanged_peer_snapshot_is_decoded_once_and_not_handed_to_placement_again(
    monkeypatch: object,
) -> None:
    coordination = MemoryCoordination(lambda: 100.0)
    bus = MemoryBus()
    published = {"B": snapshot("B", 50)}

    def member(name: str) -> Membership:
        settings = Settings(instance_id=name, multi_instance=True, redis_url="memory://")
        published.setdefault(name, snapshot(name, 0))
        return Membership(
            coordination.key_value,
            coordination.presence,
            bus,
            settings,
            snapshot=lambda: published[name],
            clock=lambda: 0.0,
        )

    a, b = member("A"), member("B")
    decoded: list[str] = []
    real_decode = registry.decode_snapshot

    def counting_decode(data: bytes) -> InstanceSnapshot | None:
        found = real_decode(data)
        decoded.append(found.instance_id if found is not None else "?")
        return found

    monkeypatch.setattr(registry, "decode_snapshot", counting_decode)  # type: ignore[attr-defined]
    told: list[list[InstanceSnapshot]] = []
    a.on_peers = told.append

    async with bus.listen("B"):  # B is alive to the judge (an inbox with no listener is dead)
        await b._beat(first=True)
        await a._beat(first=True)
        for _ in range(5):
            await a._beat()
            await a.dead_among(["B"])  # the judge's reads see the same bytes too
        assert len(told) == 1 and [len(s.nodes) for s in told[0]] == [50]
        assert decoded.count("B") == 1
        assert a.incarnations.keys() == {"A", "B"}
        # the registry carries a digest, not the 50 nodes: a beat's read does not grow with them
        view = await coordination.presence.presence_read(keys.PRESENCE, stall_after_s=1.0)
        assert max(len(e.data) for e in view.entries) < 200

        published["B"] = snapshot("B", 50, in_flight=1)  # load changed: placement must see it
        await b._beat()
        await a._beat()
        await a._beat()
        assert len(told) == 2 and told[1][0].nodes[0].in_flight == 1
        assert decoded.count("B") == 2
        assert [p.nodes[0].in_flight for p in a.peers()] == [1]


def views(count: int, seed: int) -> list[NodeView]:
    pick = random.Random(seed)
    return [
        NodeView(node_id=f"n{i:03}", instance_id="A", conn_id=f"c{i}", models=frozenset({"m"}),
                 max_parallel=2, in_flight=pick.randrange(3),
                 rating=pick.choice([None, 1.0, 3.0, 5.0]))
        for i in range(count)
    ]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(0, 60),
    seed=st.integers(0, 10**6),
    limit=st.integers(1, 12),
    shuffled=st.booleans(),
)
def test_the_first_candidates_are_the_head_of_the_full_order(
    count: int, seed: int, limit: int, shuffled: bool
) -> None:
    nodes = views(count, seed)
    last = {n.conn_id for n in nodes[::7]}

    def rng() -> random.Random | None:
        return random.Random(seed) if shuffled else None

    full = rank_candidates(nodes, rng=rng(), last=last)
    head = rank_candidates(nodes, rng=rng(), last=last, limit=limit)
    assert head == full[:limit]


def connection(conn_id: str, model: str) -> NodeConnection:
    return NodeConnection(conn_id=conn_id, node_id=conn_id, models=frozenset({model}),
                          max_parallel=1, vram_gb=None, agent_version="", connected_at=0.0,
                          last_seen=0.0)  # fmt: skip


def test_serves_follows_local_nodes_and_peers_that_come_and_go() -> None:
    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(1))
    assert not machine.serves("m")
    machine.node_connected(connection("c-local", "local-model"), 0.0)
    assert machine.serves("local-model") and not machine.serves("m")
    machine.set_peers([snapshot("B", 3)])
    assert machine.serves("m")
    machine.forget_peer("B")
    assert not machine.serves("m")
    machine.set_peers([snapshot("B", 3)])
    assert machine.serves("m")
    machine.set_peers([])
    assert not machine.serves("m")
    machine.node_disconnected("c-local", "test", 0.0)
    assert not machine.serves("local-model")


def test_status_reads_the_served_models_from_the_pools_without_making_views() -> None:
    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(1))
    machine.node_connected(connection("c-local", "local-model"), 0.0)
    machine.set_peers([snapshot("B", 3)])

    def all_views() -> list[NodeView]:
        raise AssertionError("status made every node's view (O(nodes) per call)")

    expected = {m for view in machine.views() for m in view.models}
    machine.views = all_views  # type: ignore[method-assign]
    assert cluster_view.served_models(machine) == sorted(expected) == ["local-model", "m"]
    machine.node_disconnected("c-local", "test", 0.0)
    machine.set_peers([])
    assert cluster_view.served_models(machine) == []


def test_an_unchanged_ratings_refresh_keeps_the_peers_views() -> None:
    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(1))
    machine.set_peers([snapshot("B", 3)])
    machine.set_ratings({"B-n0": (4.0, 2)})
    views = machine._remote_views()
    machine.set_ratings({"B-n0": (4.0, 2)})  # the periodic re-read, nothing rated meanwhile
    assert machine._remote_views() is views
    machine.set_ratings({"B-n0": (5.0, 3)})
    assert machine._remote_views() is not views


async def test_the_periodic_facts_refresh_writes_nodes_in_batches(autojump_clock: object) -> None:
    class Counting(MemoryLeases):
        def __init__(self) -> None:
            super().__init__(MemoryCoordination(trio.current_time).link)
            self.single: list[str] = []
            self.batches: list[list[str]] = []

        async def put_node_facts(self, facts: NodeFacts) -> None:
            self.single.append(facts.node_id)
            await super().put_node_facts(facts)

        async def put_many_node_facts(self, facts: Sequence[NodeFacts]) -> None:
            batch = list(facts)
            self.batches.append([f.node_id for f in batch])
            for one in batch:
                await super().put_node_facts(one)

    coordination = Counting()
    table = NodeTable()
    count = node_facts.REFRESH_BATCH + 3
    for i in range(count):
        table.register(connection(f"c{i:04}", "m"))
    writer = node_facts.NodeFactsWriter("A", parse_capacity(""), coordination, table)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.sleep(node_facts.REFRESH_S + 0.1)
        nursery.cancel_scope.cancel()
    assert coordination.single == []  # not one round trip per node
    assert [len(b) for b in coordination.batches] == [node_facts.REFRESH_BATCH, 3]
    written = sorted(node for batch in coordination.batches for node in batch)
    assert written == sorted(f"c{i:04}" for i in range(count))


def test_a_snapshot_reuses_the_entries_of_connections_whose_load_did_not_move() -> None:
    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(1))
    for name in ("c1", "c2"):
        machine.node_connected(connection(name, "m"), 0.0)
    first = machine.snapshot()
    nodes = machine.owner.nodes
    nodes.add_task(nodes.by_conn("c2"), "t1")  # type: ignore[arg-type]
    second = machine.snapshot()
    assert second.nodes[0] is first.nodes[0]  # c1 unchanged: the same entry, no allocation
    assert second.nodes[1] is not first.nodes[1]
    assert [n.in_flight for n in second.nodes] == [0, 1]
    assert second == InstanceSnapshot(
        instance_id="A", in_flight=0, nodes=[
            NodeEntry(node_id=n, conn_id=n, models=["m"], max_parallel=1, in_flight=i)
            for n, i in (("c1", 0), ("c2", 1))
        ],
    )  # fmt: skip
    machine.node_disconnected("c1", "test", 0.0)
    assert [n.conn_id for n in machine.snapshot().nodes] == ["c2"]


async def test_an_idle_beat_does_not_encode_the_snapshot_again(monkeypatch: object) -> None:
    coordination = MemoryCoordination(lambda: 100.0)
    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(1))
    for i in range(20):
        machine.node_connected(connection(f"c{i}", "m"), 0.0)
    settings = Settings(instance_id="A", multi_instance=True, redis_url="memory://")
    member = Membership(
        coordination.key_value,
        coordination.presence,
        MemoryBus(),
        settings,
        snapshot=machine.snapshot,
        clock=lambda: 0.0,
    )
    encoded: list[int] = []
    real_encode = registry.encode_snapshot

    def counting_encode(snap: InstanceSnapshot) -> bytes:
        encoded.append(len(snap.nodes))
        return real_encode(snap)

    hashed: list[int] = []
    real_digest = registry.snapshot_digest

    def counting_digest(data: bytes) -> str:
        hashed.append(len(data))
        return real_digest(data)

    monkeypatch.setattr(registry, "encode_snapshot", counting_encode)  # type: ignore[attr-defined]
    monkeypatch.setattr(registry, "snapshot_digest", counting_digest)  # type: ignore[attr-defined]
    await member._beat(first=True)
    for _ in range(5):
        await member._beat()
    assert encoded == [20]  # once, not once a beat
    assert len(hashed) == 1  # hashed once too (the digest goes with every beat)
    nodes = machine.owner.nodes
    nodes.add_task(nodes.by_conn("c3"), "t1")  # type: ignore[arg-type]
    await member._beat()
    machine.node_disconnected("c4", "test", 0.0)
    await member._beat()
    assert encoded == [20, 20, 19]  # a load change and a node gone are encoded at once
    stored = await coordination.key_value.get(keys.snapshot_key("A"))
    assert stored is not None and registry.decode_snapshot(stored) == machine.snapshot()


def test_an_idle_snapshot_is_the_previous_one_itself() -> None:
    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(1))
    for name in ("c1", "c2"):
        machine.node_connected(connection(name, "m"), 0.0)
    first = machine.snapshot()
    assert machine.snapshot() is first  # nothing moved: no work per node
    nodes = machine.owner.nodes
    conn = nodes.by_conn("c1")
    assert conn is not None
    nodes.add_task(conn, "t1")
    busy = machine.snapshot()
    assert busy is not first and [n.in_flight for n in busy.nodes] == [1, 0]
    nodes.end_task(conn, "t1")
    assert [n.in_flight for n in machine.snapshot().nodes] == [0, 0]
    nodes.add_task(conn, "t2")
    nodes.end_all_tasks(conn)
    assert [n.in_flight for n in machine.snapshot().nodes] == [0, 0]
    machine.node_connected(connection("c3", "m"), 0.0)
    assert [n.conn_id for n in machine.snapshot().nodes] == ["c1", "c2", "c3"]


async def test_an_idle_ownership_check_looks_at_no_connection() -> None:
    coordination = MemoryCoordination(lambda: 100.0)
    ownership = Ownership(coordination.key_value, "A", ttl_s=15.0)
    conns = [connection(f"c{i}", "m") for i in range(3)]

    class Untouchable(list[NodeConnection]):
        def __iter__(self) -> Iterator[NodeConnection]:
            raise AssertionError("an idle check looked at the connections")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ownership.run)
        for conn in conns:
            await ownership.claim(conn)
        assert await ownership.owned_elsewhere(conns) == []  # reads the records once
        assert await ownership.owned_elsewhere(Untouchable(conns)) == []
        # another instance claims c1: the counter moves and the records are read again
        await coordination.key_value.swap_many(
            [(keys.owner_key("c1"), registry.owner_value("B", "other"))],
            ttl_s=15.0,
            bump=keys.OWNERS_CHANGED,
        )
        assert await ownership.owned_elsewhere(conns) == [conns[1]]
        nursery.cancel_scope.cancel()


@st.composite
def silence_runs(draw: st.DrawFn) -> list[tuple[str, int, float]]:
    """Steps of a node table's life: (what, which connection, how much)."""
    steps = st.tuples(
        st.sampled_from(["connect", "hear", "wait", "lengthen", "sweep", "sweep9"]),
        st.integers(0, 5),
        st.floats(0.0, 8.0),
    )
    return draw(st.lists(steps, max_size=60))


@settings(max_examples=800, deadline=None)
@given(silence_runs())
def test_silent_finds_exactly_what_a_full_scan_finds(run: list[tuple[str, int, float]]) -> None:
    table = NodeTable()
    now = 0.0
    for what, i, amount in run:
        conn = table.by_conn(f"c{i}")
        if what == "connect" and conn is None:
            new = connection(f"c{i}", "m")
            new.last_seen = now
            new.silent_after_s = round(amount) * 3.0
            table.register(new)
        elif what == "hear" and conn is not None:
            table.touch(conn.conn_id, now)
        elif what == "wait":
            now += amount
        elif what == "lengthen" and conn is not None:
            conn.silent_after_s = max(conn.silent_after_s, amount * 3)
        elif what in ("sweep", "sweep9"):
            deadline = 9.0 if what == "sweep9" else 6.0
            expected = [
                c
                for c in table._by_conn.values()
                if now - c.last_seen > deadline and now - c.last_seen > c.silent_after_s
            ]
            assert table.silent(now, deadline) == expected
            for c in expected:  # as the owner does with a verdict
                table.unregister(c.conn_id)


def test_sweeps_between_verdicts_look_at_no_connection() -> None:
    table = NodeTable()
    for i in range(1000):
        table.register(connection(f"c{i}", "m"))
    sweeps = [k * 0.25 for k in range(1, 40)]  # ten seconds of sweeps, deadline 6 s
    for k, now in enumerate(sweeps):
        for c in table.connections()[k % 4 :: 4]:
            table.touch(c.conn_id, now)  # every node heard once a second
        assert table.silent(now, 6.0) == []
    # the first look plans the next one for when the oldest can be due (6 s after 0.25 s)
    assert table.silent_scans <= len(sweeps) // 4


async def test_a_busy_beat_carries_the_loads_and_no_node_list() -> None:
    """Load moves every beat under requests: the stored snapshot (every node) is written and
    fetched only when a node comes or goes; the beat carries the busy connections, and a peer
    places on them without fetching, decoding or rebuilding anything."""
    coordination = MemoryCoordination(lambda: 100.0)
    bus = MemoryBus()
    machine_a = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(1))
    machine_b = InstanceMachine("B", forward_grace_s=1.0, rng=random.Random(2))
    for i in range(100):
        machine_a.node_connected(connection(f"c{i}", "m"), 0.0)

    def member(name: str, machine: InstanceMachine) -> Membership:
        settings = Settings(instance_id=name, multi_instance=True, redis_url="memory://")
        m = Membership(
            coordination.key_value,
            coordination.presence,
            bus,
            settings,
            snapshot=machine.snapshot,
            clock=lambda: 0.0,
            loads=machine.loads,
        )
        m.on_peers = machine.set_peers
        m.on_peer_loads = machine.set_peer_loads
        return m

    a, b = member("A", machine_a), member("B", machine_b)
    built: list[int] = []  # snapshots A builds (each a pass over every node)

    def counted_snapshot() -> InstanceSnapshot:
        built.append(1)
        return machine_a.snapshot()

    a._snapshot = counted_snapshot
    writes: list[str] = []
    real_set = coordination.key_value.set

    async def counting_set(key: str, value: bytes, **kw: float | None) -> None:
        writes.append(key)
        await real_set(key, value, **kw)

    coordination.key_value.set = counting_set  # type: ignore[method-assign]
    await a._beat(first=True)
    await b._beat(first=True)
    assert writes.count(keys.snapshot_key("A")) == 1
    peer_view = b.peers()[0]
    remote = machine_b._remote_views()
    nodes = machine_a.owner.nodes
    built.clear()
    for beat in range(5):  # a load change every beat
        conn = nodes.by_conn(f"c{beat}")
        assert conn is not None
        nodes.add_task(conn, f"t{beat}")
        await a._beat()
        await b._beat()
    assert built == []  # no node list built by A's beats
    assert writes.count(keys.snapshot_key("A")) == 1  # no node list written again
    assert b.peers()[0] is peer_view  # nor fetched and decoded again
    assert machine_b._remote_views() is remote  # nor turned into new views
    assert b.peer_loads["A"].busy == {f"c{i}": 1 for i in range(5)}
    # placement on B sees the load A told (c0..c4 busy: full at max_parallel 1)
    seen = {v.conn_id: v.in_flight for v in machine_b.views()}
    assert seen == {f"c{i}": int(i < 5) for i in range(100)}
    assert cluster_view.status(machine_b, {}, None)["in_flight"] == 0
    # the requests in A's beat are those of now, not those of its stored snapshot
    loads = machine_a.loads()
    a._loads = lambda: registry.BeatLoads(loads.roster, loads.busy, 3)
    await a._beat()
    await b._beat()
    assert b.peer_loads["A"].in_flight == 3 and built == []
    assert cluster_view.status(machine_b, {}, None)["in_flight"] == 3
    a._loads = machine_a.loads
    # a node leaving is a roster change: written once more
    machine_a.node_disconnected("c99", "test", 0.0)
    await a._beat()
    await b._beat()
    assert writes.count(keys.snapshot_key("A")) == 2
    assert len(b.peers()[0].nodes) == 99
