"""Two real coordinator processes on a 3-master Redis Cluster (GEMMANET_REDIS_URL=
redis+cluster://…): a request on B reaches a node on A over sharded pub/sub, and every key of
the deployment sits in the one slot of its hash tag, on one master."""

from __future__ import annotations

import os

import pytest

from coordinator.coordination.redis.connect.cluster import key_slot, tagged_prefix
from tests.e2e import test_multi_instance as pubsub
from tests.fixtures.processes import Processes
from tests.fixtures.redis_cluster import RedisClusterHandle
from tests.fixtures.redis_server import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


def _scan_all(node: RedisServer, pattern: str) -> list[bytes]:
    """KEYS ``pattern`` (a private test server: KEYS is fine here)."""
    reply = node.raw_command("KEYS", pattern)
    return [line for line in reply.split(b"\r\n")[1:] if line and not line.startswith(b"$")]


def test_request_on_b_reaches_node_on_a_over_a_cluster(
    procs: Processes, redis_cluster_session: RedisClusterHandle
) -> None:
    cluster = redis_cluster_session
    prefix = f"e2ec{os.getpid()}"
    # share_redis reads only .url; the raw commands below go to the nodes directly.
    shared = procs.share_redis(cluster, prefix)
    two = shared.two_instances()
    pubsub.test_request_on_b_reaches_node_on_a(shared, two)

    tag = tagged_prefix(prefix)
    home = cluster.node_for_slot(key_slot(tag))
    assert cluster.keyslot(tag + "anything") == key_slot(tag)
    # The instances' state is on the home master only, under the tag; none anywhere else.
    assert len(_scan_all(home, tag.replace("{", "\\{").replace("}", "\\}") + "*")) > 3
    for node in cluster.nodes:
        assert _scan_all(node, f"{prefix}:*") == []
        if node is not home:
            assert _scan_all(node, f"*{prefix}*") == []
    # The inboxes are sharded channels on the home master (PUBSUB SHARDCHANNELS), not classic
    # pub/sub channels (which a cluster would copy to every node).
    shard_channels = home.raw_command("PUBSUB", "SHARDCHANNELS", "*")
    assert shard_channels.count(tag.encode()) >= 2, shard_channels
    for node in cluster.nodes:
        assert tag.encode() not in node.raw_command("PUBSUB", "CHANNELS", "*")
