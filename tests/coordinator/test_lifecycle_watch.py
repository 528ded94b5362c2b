"""An instance's side of the lifecycle (``runtime/lifecycle.py``) on a real SQLite store and
the real node table: after a revocation anywhere its revoked nodes are closed with 4001, a node
that connects afterwards is checked as it appears, and what it holds is written as seen (and
as gone), the uses of keys in batches."""

from __future__ import annotations

import trio

from coordinator.core.effects import CloseNode, Effect
from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.runtime.lifecycle import REVOKED_REASON, LifecycleWatch
from coordinator.store import Store
from protocol import CloseCode


def connection(node_id: str, conn_id: str) -> NodeConnection:
    return NodeConnection(
        conn_id=conn_id,
        node_id=node_id,
        models=frozenset({"echo"}),
        max_parallel=1,
        vram_gb=None,
        agent_version="test",
        connected_at=0.0,
        last_seen=0.0,
    )


async def test_revoked_nodes_are_closed_and_comings_and_goings_written(
    sqlite_database_url: str,
) -> None:
    wall = [1000.0]
    closed: list[Effect] = []
    with (
        Store.open(sqlite_database_url, wall_clock=lambda: wall[0]) as store,
        Store.open(sqlite_database_url) as cli,
    ):
        for node_id in ("a", "b", "late"):
            cli.enroll_node_sync(node_id)
        nodes = NodeTable()
        watch = LifecycleWatch("inst-1", store, nodes, closed.extend, wall_clock=lambda: wall[0])
        await store.auth.check()
        nodes.register(connection("a", "c-a"))
        nodes.register(connection("b", "c-b"))
        await watch.look_at_nodes()
        assert closed == []
        listed = {
            n.node_id: (n.online_instance_id, n.last_seen_at) for n in cli.lifecycle.list_nodes()
        }
        assert listed == {"a": ("inst-1", 1000.0), "b": ("inst-1", 1000.0), "late": (None, None)}

        # Revoked by another process: the epoch moves, every node here is checked again.
        cli.lifecycle.revoke_node("b", actor="cli:ops")
        await store.auth.check()
        await watch.look_at_nodes()
        assert closed == [CloseNode("c-b", CloseCode.AUTH_FAILED, REVOKED_REASON)]

        # Revoked between its token check and its attach: caught as it appears.
        cli.lifecycle.revoke_node("late", actor="cli:ops")
        await store.auth.check()
        await watch.look_at_nodes()  # the recheck, before "late" is attached
        nodes.register(connection("late", "c-late"))
        await watch.look_at_nodes()
        assert closed[-1] == CloseNode("c-late", CloseCode.AUTH_FAILED, REVOKED_REASON)

        wall[0] = 1100.0
        nodes.unregister("c-b")
        await watch.look_at_nodes()
        b = {n.node_id: n for n in cli.lifecycle.list_nodes()}["b"]
        assert (b.online_instance_id, b.last_seen_at) == (None, 1100.0)

        record, secret = cli.create_api_key_sync("client")
        assert await store.authenticate_api_key(secret) == record
        await watch._flush_uses()
        [info] = cli.lifecycle.list_keys()
        assert info.last_used_at == 1100.0

        # A graceful stop writes this instance's nodes as gone.
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run)
            nursery.cancel_scope.cancel()
        a = {n.node_id: n for n in cli.lifecycle.list_nodes()}["a"]
        assert (a.online_instance_id, a.last_seen_at) == (None, 1100.0)
