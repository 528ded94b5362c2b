"""The enablement gate end to end (docs/direct-hosts.md, "4. Enable"): two real instances with
the default ``GEMMANET_HOST_PLACEMENT=gated`` on a private redis-server, a ``gemmanet monitor``
process, the fake Ollama of tools/fakes listed under ``[hosts]``, and ``gemmanet audit`` run as
the operator runs it. Fresh facts alone place nothing; ``--enable`` is refused while a gate is
red and accepted once every gate is green, and both instances follow it; ``--disable`` stops
new placements on the host on both while the call in flight finishes; each instance's
``gemmanet_host_placement_open`` says so on ``GET /metrics``."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_direct_hosts import FAST, HOST, FakeHost, host_info, host_state, monitor
from tests.fixtures.processes import Coordinator, Processes, wait_until
from tests.fixtures.redis_server import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


def placement(coord: Coordinator, operator: str) -> dict[str, Any]:
    cluster = coord.http.get("/api/v1/cluster", headers={"Authorization": f"Bearer {operator}"})
    return cluster.json()["host_placement"]  # type: ignore[no-any-return]


def placing(*coords: Coordinator, operator: str) -> list[bool]:
    return [placement(coord, operator)["placing"] for coord in coords]


def gate_metrics(coord: Coordinator) -> dict[str, float]:
    """The gate's series on the instance's ``GET /metrics`` (with the mode label if any)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(coord.http.get("/metrics").text):
        for s in family.samples:
            if s.name.startswith("gemmanet_host_placement"):
                found[s.name + "".join(f'{{{k}="{v}"}}' for k, v in s.labels.items())] = s.value
    return found


OPEN, READABLE = (
    'gemmanet_host_placement_open{mode="gated"}',
    "gemmanet_host_placement_switch_readable",
)


def test_the_gate_from_off_to_enabled_by_the_audit_and_off_again(
    procs: Processes, redis_server: RedisServer, tmp_path: Path
) -> None:
    host = FakeHost(procs)
    capacity = tmp_path / "capacity.toml"
    capacity.write_text(
        f'[hosts."{HOST}"]\nurl = "{host.url}"\nkind = "ollama"\nmax_parallel = 2\n'
    )
    procs.share_redis(
        redis_server, f"gate{os.getpid()}", GEMMANET_CAPACITY_FILE=str(capacity), **FAST
    )

    # A red gate (no monitor, no facts yet): refused, naming them, and nothing is switched.
    refused = procs.cli("audit", "--enable", "--by", "alice")
    assert refused.returncode == 1, refused
    assert refused.stderr.splitlines() == [
        (
            "gemmanet: audit --enable refused: not ready: no_monitor, no_facts (box-c); the "
            "switch is unchanged"
        )
    ], refused.stderr
    assert "gate     never switched on" in refused.stdout

    a, b = procs.two_instances()
    monitor(procs, "m1")
    wait_until(lambda: host_state(a) == "ok" and host_state(b) == "ok", "fresh host facts")
    key, operator = procs.create_key("gate"), procs.create_key("gate-ops", admin=True)
    # The gate off: fresh facts, yet the host is unused.
    unused = a.request(key, model="llama3", prompt="not yet")
    assert unused.status_code == 503 and unused.json()["error"]["code"] == "no_node_for_model"
    assert placement(b, operator) == {"mode": "gated", "placing": False, "hosts": 1, "switch": None}
    assert host_info(b)["models"] == []  # listed with its facts, serving nothing
    assert gate_metrics(a) == gate_metrics(b) == {OPEN: 0.0, READABLE: 1.0}

    enabled = procs.cli("audit", "--enable", "--by", "alice", "--json")
    assert enabled.returncode == 0 and enabled.stderr == "", enabled
    switch = json.loads(enabled.stdout)["host_placement"]["switch"]
    assert (switch["enabled"], switch["by"], switch["epoch"]) == (True, "alice", 1), switch
    # Both instances follow within a read (0.5 s).
    wait_until(lambda: placing(a, b, operator=operator) == [True, True], "both placing", 5)
    assert placement(a, operator)["switch"] == switch
    assert gate_metrics(a) == gate_metrics(b) == {OPEN: 1.0, READABLE: 1.0}
    assert host_info(b)["models"] == ["llama3"]
    for coord in (a, b):
        placed = coord.request(key, model="llama3", prompt="on the host")
        assert placed.status_code == 200 and placed.json()["node_id"] == HOST, placed.text

    # A slow call in flight on B, then --disable: no new placement, the call finishes.
    host.configure(chunk_delay_ms=600)
    slow: dict[str, httpx.Response] = {}
    body = {"model": "llama3", "prompt": "one slow call finishing"}
    asking = threading.Thread(
        target=lambda: slow.update(answer=b.request(key, **body)), daemon=True
    )
    asking.start()
    wait_until(lambda: host.stats()["requests"] == 3, "the slow call on the host")
    disabled = procs.cli("audit", "--disable", "--by", "bob")
    assert disabled.returncode == 0 and disabled.stdout.startswith("gate     disabled by bob")
    wait_until(lambda: placing(a, b, operator=operator) == [False, False], "both off", 5)
    assert gate_metrics(a) == gate_metrics(b) == {OPEN: 0.0, READABLE: 1.0}
    for coord in (a, b):
        after = coord.request(key, model="llama3", prompt="no more")
        assert after.status_code == 503, after.text
    asking.join(timeout=20)
    assert slow["answer"].status_code == 200, slow["answer"].text
    assert slow["answer"].json()["output"] == body["prompt"]
    assert host.stats()["requests"] == 3 and host.stats()["aborted"] == 0

    # The audit says who switched it last, and when.
    report = procs.cli("audit", "--json")
    assert report.returncode == 0, report
    last = json.loads(report.stdout)["host_placement"]
    assert last["placing"] is False and last["switch"]["by"] == "bob", last
    assert last["switch"]["enabled"] is False and last["switch"]["epoch"] is None
