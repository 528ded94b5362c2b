"""Leases under real concurrency: several OS processes, each with its own RedisCoordination
(its own connections), hammer ``admit``/``release`` on one node with ``max_parallel=2`` and a
memory budget that would allow 3 (model 4 GB resident, 1 GB KV per lease, budget 7 GB). Each
holder of a granted lease counts itself in a shared Redis counter while it holds; the most
holders ever seen at once must never exceed the parallel budget.

Mutation check: the same hammer with a broken admission (an ADMIT script without the parallel
check; or that check done in Python with ``lease_usage`` before admitting, a check-then-act
race) must overcommit, which shows the test can see an overcommit when there is one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from coordinator.coordination.leases import NodeFacts
from coordinator.coordination.redis.coordination import RedisCoordination
from tests.coordinator.lease_hammer import RULES
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 6
SECONDS = 1.5


def run_hammers(url: str, prefix: str, variant: str) -> list[dict[str, int]]:
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.coordinator.lease_hammer", url, prefix]
            + [f"I{k}", variant, str(SECONDS)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for k in range(PROCESSES)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()[-2000:]
        results.append(json.loads(out))
    return results


@pytest.mark.parametrize(
    ("variant", "overcommits"),
    [("ok", False), ("no_parallel", True), ("check_then_act", True)],
)
async def test_concurrent_admissions_never_exceed_the_budget(
    redis_server_session: RedisServer, redis_key_prefix: str, variant: str, overcommits: bool
) -> None:
    url = redis_server_session.url
    async with RedisCoordination(url, key_prefix=redis_key_prefix) as c:
        await c.presence.presence_beat(
            "instances", "O", b"", stall_after_s=60.0, forget_after_s=60.0
        )
        await c.leases.put_node_facts(NodeFacts("n1", "c1", "O", 2, 7.0, {"m": 4.0}))
        results = await trio.to_thread.run_sync(run_hammers, url, redis_key_prefix, variant)
        peak = max(r["peak"] for r in results)
        grants = sum(r["grants"] for r in results)
        assert grants > 50, results
        # Never more than the memory budget allows, broken or not (that check is intact).
        assert peak <= 3, results
        if overcommits:
            assert peak > 2, f"the broken variant {variant} was not caught: {results}"
        else:
            assert peak <= 2, results
            assert await c.key_value.get("holders") == b"0"
            assert (await c.leases.lease_usage(["n1"]))["n1"].leases == 0
            assert await c.leases.queue_depths(["m"], RULES) == {"m": 0}
