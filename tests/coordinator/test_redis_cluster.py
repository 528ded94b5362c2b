"""Redis Cluster specifics (docs/redis.md "Redis Cluster"): the slot arithmetic agrees with the server,
every Lua script of the backend runs on the 3-master cluster with all its keys in the one slot
of the deployment's hash tag, the URL forms are checked, and a MOVED slot is followed (by the
lean pub/sub bus too, on its own).

The contract suites (coordination, lease, monitor, telemetry, bus) also run on the cluster, as
``redis-cluster`` parameters of their fixtures.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from collections.abc import Sequence
from typing import Any

import pytest
import trio

import coordinator.coordination as coordination_package
from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.bus.streams import StreamsBus
from coordinator.coordination.leases import AdmissionRules, LeaseAsk, LeaseRelease, NodeFacts
from coordinator.coordination.redis.acl import instance_acl_rules
from coordinator.coordination.redis.connect.cluster import key_slot, plain_url, tagged_prefix
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.coordination.redis.scripts import LuaScript
from coordinator.errors import SettingsError
from coordinator.settings import Settings
from tests.fixtures.redis_cluster import RedisClusterHandle
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis

KEYS = [
    "",
    "a",
    "gn:lease:facts",
    "{gn}:lease:facts",
    "{gn}:x{y}",
    "x{gn}y",
    "{}gn",
    "{}{gn}",
    "{{gn}}",
    "gn{",
    "gn}{",
    "{gn",
    "t123-abcdef:inst:bus:A",
    "{t123-abcdef}:inst:bus:A",
    "ünïcode{ключ}",
]


def test_key_slot_agrees_with_the_server(redis_cluster_session: RedisClusterHandle) -> None:
    for key in KEYS:
        assert key_slot(key) == redis_cluster_session.keyslot(key), key


def test_cluster_urls() -> None:
    assert plain_url("redis+cluster://h:7000") == ("redis://h:7000", True)
    assert plain_url("rediss+cluster://h:7000/0") == ("rediss://h:7000/0", True)
    assert plain_url("redis://h:6379/2") == ("redis://h:6379/2", False)
    with pytest.raises(SettingsError, match="only database 0"):
        plain_url("redis+cluster://h:7000/3")
    with pytest.raises(SettingsError, match="braces"):
        tagged_prefix("g{n}")
    with pytest.raises(SettingsError, match="only database 0"):
        Settings.from_env({"GEMMANET_REDIS_URL": "redis+cluster://h:7000/1"})
    assert Settings.from_env({"GEMMANET_REDIS_URL": "redis+cluster://h:7000"}).redis_url


def _all_scripts() -> set[str]:
    """Every LuaScript defined at module level in coordinator/coordination and below."""
    names = set()
    prefix = coordination_package.__name__ + "."
    for module_info in pkgutil.walk_packages(coordination_package.__path__, prefix):
        module = importlib.import_module(module_info.name)
        names.update(v.name for v in vars(module).values() if isinstance(v, LuaScript))
    return names


class _Recording:
    """Remembers the slots of the keys of every script a link runs (its ``run_script``)."""

    def __init__(self, link: RedisLink) -> None:
        self.seen: dict[str, set[int]] = {}
        self._run_script = link.run_script
        link.run_script = self.run_script  # type: ignore[method-assign]

    async def run_script(
        self, script: LuaScript, keys: Sequence[str], args: Sequence[Any], *, lane: str = "main"
    ) -> Any:
        self.seen.setdefault(script.name, set()).update(key_slot(k) for k in keys)
        return await self._run_script(script, keys, args, lane=lane)


async def test_every_script_keeps_its_keys_in_the_home_slot(
    redis_cluster_session: RedisClusterHandle, redis_key_prefix: str
) -> None:
    """Runs every script of the backend on the cluster (the server refuses keys of another slot
    with CROSSSLOT or MOVED), and checks the client side: one slot, the tag's. It runs as an
    ACL user with exactly ``gemmanet redis-acl --cluster``'s rights, so those suffice too."""
    cluster = redis_cluster_session
    user, password = f"gn-{redis_key_prefix}", "cluster-secret"
    rules = instance_acl_rules(redis_key_prefix, cluster=True)
    for node in cluster.nodes:
        reply = node.raw_command("ACL", "SETUSER", user, *rules, "on", ">" + password)
        assert reply.startswith(b"+OK"), reply
    url = cluster.url.replace("://", f"://{user}@")
    rules = AdmissionRules("instances", 5.0, 5.0, 10.0, 10, 2)
    async with RedisCoordination(url, key_prefix=redis_key_prefix, password=password) as c:
        recording = _Recording(c.link)
        await c.key_value.compare_and_set("k", None, b"1")
        assert await c.key_value.refresh_if("k", b"1", 5.0)
        assert await c.key_value.refresh_many([("k", b"1"), ("absent", b"1")], 5.0) == [True, False]
        assert await c.key_value.swap_many([("k", b"1"), ("s", b"1")], ttl_s=5.0, bump="b") == [
            b"1",
            None,
        ]
        await c.key_value.incr("n", ttl_s=5.0)
        await c.rate_limits.rate_limit("r", limit=2, period_s=1.0)
        await c.presence.presence_beat("instances", "A", b"", stall_after_s=5, forget_after_s=5)
        await c.leases.put_node_facts(NodeFacts("n1", "c1", "A", 2))
        ask = LeaseAsk("r1", "A", "key", "m", 0.0, 0.0, (("n1", "c1"), ("n2", "c2")), "l1", 5.0)
        admission = await c.leases.admit(ask, rules)
        assert admission.outcome == "granted", admission
        assert await c.leases.renew_leases([("n1", "l1"), ("n2", "l2")], 5.0) == [True, False]
        await c.leases.lease_usage(["n1", "n2"])
        await c.leases.queue_depths(["m", "other"], rules)
        await c.leases.release(
            LeaseRelease("r1", "key", "m", ("n1", "l1"), ("m", "other"), [("n2", "l1")]), rules
        )
        await c.leases.drop_node_facts("n1", "c1")
        claim = await c.monitor.monitor_acquire("M", 5.0)
        assert claim.held
        assert await c.monitor.monitor_renew("M", claim.epoch, 5.0)
        assert await c.monitor.write_host_facts("M", claim.epoch, "h1", b"{}")
        await c.monitor.host_facts()
        assert await c.monitor.monitor_resign("M", claim.epoch)
        await c.affinity.record_prefix("m", "n1", ["h1", "h2"], ttl_s=5.0, max_blocks=10)
        assert await c.affinity.prefix_holders("m", ["h1", "h2"]) == [["n1"], ["n1"]]
        await c.telemetry.append_telemetry("n1", b"s", keep=3, ttl_s=5.0)
        await c.telemetry.latest_telemetry(["n1", "n2", "n3"])
        bus = StreamsBus(c.link, presence_ttl_s=2.0, refresh_s=0.5)
        async with bus.listen("A") as inbox:
            assert await bus.send("A", b"hello") == 1
            with trio.fail_after(5):
                assert await inbox.__anext__() == b"hello"
        assert await bus.is_listening("A") is False
        async with c.pubsub.subscribe("ch") as channel:
            assert await c.pubsub.subscriber_count("ch") == 1
            assert await c.pubsub.publish("ch", b"sharded") == 1
            with trio.fail_after(5):
                assert await channel.__anext__() == b"sharded"
        assert {"k", "n"} <= set(await c.key_value.keys_with_prefix(""))
    assert set(recording.seen) == _all_scripts()
    home = key_slot(tagged_prefix(redis_key_prefix))
    assert all(slots == {home} for slots in recording.seen.values()), recording.seen


def _bulk(reply: bytes) -> str:
    return reply.split(b"\r\n")[1].decode()


def _move_slot(
    cluster: RedisClusterHandle, slot: int, source: RedisServer, target: RedisServer
) -> None:
    """Reshard ``slot`` from ``source`` to ``target`` with its keys, as redis-cli --cluster
    reshard does (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE on every master)."""
    source_id = _bulk(source.raw_command("CLUSTER", "MYID"))
    target_id = _bulk(target.raw_command("CLUSTER", "MYID"))
    assert target.raw_command("CLUSTER", "SETSLOT", str(slot), "IMPORTING", source_id)[:3] == b"+OK"
    assert source.raw_command("CLUSTER", "SETSLOT", str(slot), "MIGRATING", target_id)[:3] == b"+OK"
    while True:
        listing = source.raw_command("CLUSTER", "GETKEYSINSLOT", str(slot), "100")
        keys = [line for line in listing.split(b"\r\n")[1:] if line and not line.startswith(b"$")]
        if not keys:
            break
        reply = source.raw_command(
            "MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *keys
        )
        assert reply.startswith(b"+OK"), reply
    for node in (target, source, *cluster.nodes):
        assert node.raw_command("CLUSTER", "SETSLOT", str(slot), "NODE", target_id)[:3] == b"+OK"
    # Every node agrees before the test goes on (gossip could otherwise still disagree).
    deadline = time.monotonic() + 10
    while not all(_owner_of(node, slot) == target.port for node in cluster.nodes):
        assert time.monotonic() < deadline, "the nodes do not agree on the moved slot"
        time.sleep(0.02)


def _owner_of(node: RedisServer, slot: int) -> int | None:
    """The port of the node ``node`` says serves ``slot`` (CLUSTER NODES)."""
    for line in node.raw_command("CLUSTER", "NODES").decode().splitlines():
        fields = line.split()
        if len(fields) < 9 or "master" not in fields[2]:
            continue
        for part in fields[8:]:
            first, _, last = part.partition("-")
            if part[:1].isdigit() and int(first) <= slot <= int(last or first):
                return int(fields[1].split("@")[0].rsplit(":", 1)[1])
    return None


async def test_a_moved_slot_is_followed(
    redis_cluster_session: RedisClusterHandle, redis_key_prefix: str
) -> None:
    """Resharding the deployment's slot to another master: the next operations follow the
    MOVED reply there (keys intact), and a subscription on the old master is reported lost."""
    cluster = redis_cluster_session
    slot = key_slot(tagged_prefix(redis_key_prefix))
    home = cluster.node_for_slot(slot)
    other = next(node for node in cluster.nodes if node is not home)
    async with RedisCoordination(cluster.url, key_prefix=redis_key_prefix) as c:
        await c.key_value.set("k", b"before")
        await c.key_value.incr("n")
        try:
            async with c.pubsub.subscribe("ch") as inbox:
                await trio.to_thread.run_sync(_move_slot, cluster, slot, home, other)
                with trio.fail_after(5), pytest.raises(CoordinationUnavailable, match="lost"):
                    await inbox.__anext__()
            assert await c.key_value.get("k") == b"before"
            assert await c.key_value.incr("n") == 2
            assert (
                _bulk(other.raw_command("GET", tagged_prefix(redis_key_prefix) + "k")) == "before"
            )
            async with c.pubsub.subscribe("ch") as inbox:
                assert await c.pubsub.subscriber_count("ch") == 1
                assert await c.pubsub.publish("ch", b"after the move") == 1
                with trio.fail_after(5):
                    assert await inbox.__anext__() == b"after the move"
        finally:
            await trio.to_thread.run_sync(_move_slot, cluster, slot, other, home)


async def test_the_bus_follows_a_moved_slot_by_itself(
    redis_cluster_session: RedisClusterHandle, redis_key_prefix: str
) -> None:
    """The lean bus with no key operation to learn the move first: after the slot moved, a
    re-subscription and a publish are each sent to the old master, get MOVED, hand it to the
    link (the one routing answer) and land on the new master, where they meet."""
    cluster = redis_cluster_session
    slot = key_slot(tagged_prefix(redis_key_prefix))
    home = cluster.node_for_slot(slot)
    other = next(node for node in cluster.nodes if node is not home)
    async with (
        RedisCoordination(cluster.url, key_prefix=redis_key_prefix) as sender,
        RedisCoordination(cluster.url, key_prefix=redis_key_prefix) as listener,
    ):
        try:
            async with listener.pubsub.subscribe("ch") as inbox:
                assert await sender.pubsub.publish("ch", b"before") == 1
                with trio.fail_after(5):
                    assert await inbox.__anext__() == b"before"
                await trio.to_thread.run_sync(_move_slot, cluster, slot, home, other)
                with trio.fail_after(5), pytest.raises(CoordinationUnavailable, match="lost"):
                    await inbox.__anext__()
            # Both still point at the old master: only a MOVED can tell them.
            for c in (sender, listener):
                where = await c.link.master()
                assert where is not None and where.port == home.port
            channel = tagged_prefix(redis_key_prefix) + "ch"
            with trio.fail_after(10):
                async with listener.pubsub.subscribe("ch") as inbox:
                    # Subscribed at the new master, where the publish goes too.
                    shards = other.raw_command("PUBSUB", "SHARDNUMSUB", channel)
                    assert shards.endswith(b":1\r\n"), shards
                    assert await sender.pubsub.publish("ch", b"after the move") == 1
                    assert await inbox.__anext__() == b"after the move"
            for c in (sender, listener):
                where = await c.link.master()
                assert where is not None and where.port == other.port
            assert sender.link.lean._pipeline_at == await sender.link.master()
        finally:
            await trio.to_thread.run_sync(_move_slot, cluster, slot, other, home)
