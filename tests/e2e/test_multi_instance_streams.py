"""The key two-instance behaviours again, with the instance bus on Redis Streams
(GEMMANET_BUS=streams): a request on B reaches a node on A, streaming across instances, and a
kill -9 of the owner fails B's tasks within 3 s. The scenarios come from
test_multi_instance.py; this module switches the transport and checks it is the one used."""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e import test_multi_instance as pubsub
from tests.fixtures.processes import Coordinator, Processes

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


@pytest.fixture
def shared(procs: Processes, redis_server) -> Processes:  # type: ignore[no-untyped-def]
    prefix = f"e2es{os.getpid()}"
    procs.prefix = prefix  # type: ignore[attr-defined]
    return procs.share_redis(redis_server, prefix, GEMMANET_BUS="streams")


@pytest.fixture
def two(shared: Processes) -> tuple[Coordinator, Coordinator]:
    return shared.two_instances()


def _redis_int(shared: Processes, *command: str) -> int:
    reply: bytes = shared.redis.raw_command(*command)  # type: ignore[attr-defined]
    assert reply.startswith(b":"), reply
    return int(reply[1:].strip())


def assert_streams_carry_the_bus(shared: Processes, *instances: str) -> None:
    """Each instance reads a stream inbox and announces itself there; nobody uses pub/sub."""
    prefix = shared.prefix  # type: ignore[attr-defined]
    for instance in instances:
        assert _redis_int(shared, "EXISTS", f"{prefix}:inst:listening:{instance}") == 1
    assert _redis_int(shared, "PUBSUB", "NUMPAT") == 0
    channels: bytes = shared.redis.raw_command("PUBSUB", "CHANNELS")  # type: ignore[attr-defined]
    assert b"inst:bus:" not in channels, channels


def test_request_and_streaming_on_b_reach_node_on_a(
    shared: Processes, two: tuple[Coordinator, Coordinator]
) -> None:
    # One pair of instances for both scenarios: starting them is most of the time.
    assert_streams_carry_the_bus(shared, "A", "B")
    pubsub.test_request_on_b_reaches_node_on_a(shared, two)
    prefix = shared.prefix  # type: ignore[attr-defined]
    # the assign went into A's stream, the answer into B's
    for instance in ("A", "B"):
        assert _redis_int(shared, "XLEN", f"{prefix}:inst:stream:{instance}") >= 1
    # streaming (test_streaming_across_instances, on the node started above)
    b = two[1]
    key = shared.create_key("streaming")
    prompt = "several words travel over the instance bus in order"
    r = b.request(key, model="echo", prompt=prompt, stream=True)
    events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.strip()]
    assert "".join(e["delta"] for e in events[:-1]) == prompt
    assert events[-1]["done"] is True and events[-1]["output"] == prompt
    assert events[-1]["node_id"] == "on-a"
    assert len(events) == len(prompt.split()) + 1


@pytest.mark.parametrize("stream", [False, True])
async def test_kill_9_of_the_owner_fails_tasks_on_b_within_3s(
    shared: Processes, two: tuple[Coordinator, Coordinator], stream: bool
) -> None:
    # With streams, B learns of A's death when A's presence key (TTL 2 s) or alive key
    # expires, not at once as with pub/sub's subscriber count: still inside the 3 s.
    await pubsub.test_kill_9_of_the_owner_fails_tasks_on_b_within_3s(shared, two, stream)
