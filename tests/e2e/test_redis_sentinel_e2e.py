"""A real coordinator instance behind Redis Sentinel (GEMMANET_REDIS_URL=redis+sentinel://…):
under a steady trickle of HTTP requests the Redis master is killed (kill -9). Requests during
the failover get 503 for a bounded window, then succeed again on the promoted replica without
restarting anything."""

from __future__ import annotations

import os
import time

import pytest

from tests.fixtures.processes import Processes
from tests.fixtures.redis_sentinel import DOWN_AFTER_MS, RedisSentinelGroup

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

#: kill -> last failed request: sentinel down-after, vote and promotion (~2 s here), the
#: instance's Redis timeouts, and margin for a loaded 2-core machine
WINDOW_BOUND_S = DOWN_AFTER_MS / 1000 + 10.0


def test_failover_gives_bounded_503s_then_requests_succeed(
    procs: Processes, redis_sentinel_group: RedisSentinelGroup
) -> None:
    group = redis_sentinel_group
    shared = procs.share_redis(group, f"e2es{os.getpid()}")
    a = shared.coordinator(GEMMANET_INSTANCE_ID="A")
    shared.node(a, "on-a")
    key = shared.create_key("client")
    assert a.request(key, model="echo", prompt="before").status_code == 200

    outcomes: list[tuple[float, int]] = []
    killed_at = 0.0
    started = time.monotonic()
    deadline = started + 1.0 + WINDOW_BOUND_S + 10
    while time.monotonic() < deadline:
        now = time.monotonic()
        if not killed_at and now - started > 1.0:
            group.master.stop()
            killed_at = time.monotonic()
        status = a.request(key, model="echo", prompt="trickle").status_code
        outcomes.append((now, status))
        after_kill = [s for t, s in outcomes if killed_at and t > killed_at]
        # Done once the failover showed (a failure) and 20 requests in a row succeeded after it.
        if any(s != 200 for s in after_kill) and after_kill[-20:] == [200] * 20:
            break
        time.sleep(0.05)

    failed = [(t, s) for t, s in outcomes if s != 200]
    assert killed_at and failed, outcomes
    assert {s for _, s in failed} == {503}, failed
    assert min(t for t, _ in failed) >= killed_at - 1.0
    window = max(t for t, _ in failed) - killed_at
    assert window < WINDOW_BOUND_S, (window, len(failed))
    last = [s for _, s in outcomes[-20:]]
    assert last == [200] * 20, outcomes[-30:]
    assert group.master_port() == group.replica.port
    print(f"sentinel failover over HTTP: {len(failed)} x 503 within {window:.2f} s of the kill")
