"""``GET /api/v1/cluster`` (what the System Health page polls) on two real instances sharing a
real Redis: every instance with its liveness, node details for operator keys only, and a
killed instance shown as dead rather than silently missing."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from tests.fixtures.processes import Coordinator, Processes, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


def cluster(coord: Coordinator, key: str | None) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return coord.http.get("/api/v1/cluster", headers=headers)


def states(body: Any) -> dict[str, str]:
    return {i["instance_id"]: i["state"] for i in body["instances"]}


def test_cluster_view_by_key_kind_and_liveness(procs: Processes, redis_server: Any) -> None:
    # Both instances are monitor candidates: one is elected, the other stands by.
    shared = procs.share_redis(redis_server, f"cluster{os.getpid()}", GEMMANET_MONITOR="1")
    a, b = shared.two_instances()
    shared.node(a, "on-a", extra=("--max-parallel", "3", "--vram-gb", "16"))
    wait_until(lambda: b.has_node("on-a"), "B sees the node of A")
    operator, client = shared.create_key("ops", admin=True), shared.create_key("client")

    full = cluster(b, operator).json()
    assert full["admin"] is True and full["instance_id"] == "B"
    assert states(full) == {"A": "live", "B": "live"}
    assert [i["answering"] for i in full["instances"]] == [False, True]
    assert [(i["nodes"], i["in_flight"]) for i in full["instances"]] == [(1, 0), (0, 0)]
    [node] = full["nodes"]
    assert (node["node_id"], node["instance_id"], node["max_parallel"]) == ("on-a", "A", 3)
    assert node["vram_gb"] == 16 and node["leases"] == 0
    wait_until(lambda: cluster(b, operator).json()["monitor"] is not None, "a monitor elected")
    first = cluster(b, operator).json()["monitor"]
    assert first["primary"] in ("A", "B") and first["epoch"] >= 1, first
    assert full["queue_depth"] == 0
    assert full["online_nodes"] == 1 and full["in_flight"] == 0

    plain = cluster(b, client).json()
    assert plain["admin"] is False and plain["nodes"] is None
    assert states(plain) == {"A": "live", "B": "live"} and plain["online_nodes"] == 1
    assert "on-a" not in cluster(b, client).text

    for key in (None, "gn_not-a-real-key"):
        refused = cluster(b, key)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthorized"

    # kill -9 of A: B lists it as dead (judged within the 3 s failover bound), not as gone.
    a.proc.send_signal(signal.SIGKILL)
    wait_until(lambda: states(cluster(b, client).json()) == {"A": "dead", "B": "live"}, "A dead")
    after = cluster(b, operator).json()
    dead = after["instances"][0]
    assert dead["nodes"] is None and dead["in_flight"] is None and dead["last_beat_age_s"] > 0
    assert after["online_nodes"] == 0 and after["nodes"] == []
    # The monitor is B's now: it was already, or B took over when A's lease ran out (new epoch).
    wait_until(lambda: (cluster(b, client).json()["monitor"] or {}).get("primary") == "B", "B")
    now = cluster(b, client).json()["monitor"]
    assert now["epoch"] == first["epoch"] + (first["primary"] == "A"), (first, now)
