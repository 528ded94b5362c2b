"""Host telemetry end to end, with real processes: ``gemmanet telemetry-agent`` queried over
HTTP, and a node agent on instance B sending telemetry in its heartbeats, seen on instance A
(through a real Redis) in ``/api/v1/nodes`` and as a growing history; a hostile node's junk
telemetry is dropped while its heartbeats still count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import trio
from trio_websocket import ConnectionClosed

from tests.coordinator.test_telemetry_sampler import AMD_CARD, GPU_FIELDS, record_card
from tests.fixtures.processes import CLI, Coordinator, Processes, free_port, wait_until
from tests.fixtures.raw_node import raw_node

pytestmark = pytest.mark.e2e


def validate(doc: dict[str, Any], template: str, method: str, body: object) -> None:
    schema = doc["paths"][template][method]["responses"]["200"]["content"]["application/json"]
    jsonschema.Draft202012Validator({**schema["schema"], "components": doc["components"]}).validate(
        body
    )


FIELDS = {"at", "cpu_busy", "memory_used_gb", "memory_total_gb", *GPU_FIELDS}


def fake_sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sysfs"
    record_card(root, "card0", AMD_CARD)
    return root


def assert_cpu_and_memory(sample: dict[str, object]) -> None:
    assert set(sample) == FIELDS, sample
    cpu, used, total = sample["cpu_busy"], sample["memory_used_gb"], sample["memory_total_gb"]
    assert isinstance(cpu, float) and 0.0 <= cpu <= 1.0, sample
    assert isinstance(used, float) and isinstance(total, float) and 0 < used < total, sample


def test_the_telemetry_agent_serves_samples_over_http(procs: Processes, tmp_path: Path) -> None:
    amd_port, plain_port = free_port(), free_port()
    root = fake_sysfs(tmp_path)
    amd = procs._popen(
        [*CLI, "telemetry-agent", "--port", str(amd_port), "--interval", "0.1"]
        + ["--sysfs-root", str(root)]
    )
    plain = procs._popen([*CLI, "telemetry-agent", "--port", str(plain_port), "--interval", "0.1"])
    with httpx.Client(base_url=f"http://127.0.0.1:{amd_port}", timeout=5) as http:
        first = wait_until(lambda: http.get("/").json(), f"the agent ({amd.log_path})")  # type: ignore[attr-defined]
        assert_cpu_and_memory(first)
        assert first["gpu_busy"] == 0.37 and first["vram_total_gb"] == 17.163091968
        assert first["gtt_used_gb"] == 0.123456789 and first["gtt_total_gb"] == 16.777216
        # A new sample every interval, on either path.
        later = wait_until(
            lambda: (s := http.get("/telemetry").json())["at"] > first["at"] and s, "a new sample"
        )
        assert set(later) == FIELDS
        missing = http.get("/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        wrong = http.post("/telemetry")
        assert wrong.status_code == 405
        assert wrong.json()["error"]["code"] == "method_not_allowed"
    # The real /sys of this machine: no GPU here, so every GPU field is null.
    with httpx.Client(base_url=f"http://127.0.0.1:{plain_port}", timeout=5) as http:
        sample = wait_until(lambda: http.get("/").json(), f"the agent ({plain.log_path})")  # type: ignore[attr-defined]
    assert_cpu_and_memory(sample)
    if not Path("/sys/class/drm").exists():
        assert all(sample[field] is None for field in GPU_FIELDS), sample


# -- heartbeats across two instances ----------------------------------------------------------


def telemetry_of(coord: Coordinator, node_id: str) -> object:
    return next(n.get("telemetry") for n in coord.nodes() if n["node_id"] == node_id)


def history(coord: Coordinator, node_id: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or coord.probe_key}"}
    return coord.http.get(f"/api/v1/nodes/{node_id}/telemetry", headers=headers)


JUNK = [
    '"junk"',
    "[1, 2, 3]",
    '{"at": 1, "cpu_busy": 7}',
    '{"at": 1, "vram_used_gb": 1e308}',
    '{"at": "now"}',
    '{"at": 1, "cpu_busy": 0.5, "pad": "' + "x" * 100_000 + '"}',
]


async def hostile_heartbeats(node: object, interval: float) -> None:
    i = 0
    try:
        while True:
            junk = JUNK[i % len(JUNK)]
            await node.send_raw(  # type: ignore[attr-defined]
                f'{{"type": "heartbeat", "v": 1, "in_flight": 0, "telemetry": {junk}}}'
            )
            i += 1
            await trio.sleep(interval)
    except ConnectionClosed:
        pass


@pytest.mark.redis
async def test_heartbeat_telemetry_on_b_is_seen_on_a(
    procs: Processes, redis_server_session: object, redis_key_prefix: str, tmp_path: Path
) -> None:
    shared = procs.share_redis(
        redis_server_session, redis_key_prefix, GEMMANET_TELEMETRY_INTERVAL_S="0.3"
    )
    a, b = await trio.to_thread.run_sync(shared.two_instances)
    extra = ("--telemetry-interval", "0.2", "--telemetry-sysfs-root", str(fake_sysfs(tmp_path)))
    await trio.to_thread.run_sync(lambda: shared.node(b, "gpu-box", extra=extra))

    def wait(predicate, what: str):  # type: ignore[no-untyped-def]
        return trio.to_thread.run_sync(lambda: wait_until(predicate, what))

    latest = await wait(lambda: telemetry_of(a, "gpu-box"), "A shows the telemetry of B's node")
    assert_cpu_and_memory(latest)
    assert latest["gpu_busy"] == 0.37 and latest["gtt_total_gb"] == 16.777216
    assert [n["instance_id"] for n in a.nodes() if n["node_id"] == "gpu-box"] == ["B"]

    first = history(a, "gpu-box")
    assert first.status_code == 200 and first.json()["node_id"] == "gpu-box"
    seen = len(first.json()["samples"])
    grown = await wait(
        lambda: len(r := history(a, "gpu-box").json()["samples"]) >= seen + 2 and r,
        "a growing history on A",
    )
    stamps = [s["at"] for s in grown]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert all(set(s) == FIELDS and s["vram_used_gb"] == 4.294967296 for s in grown)

    # Both bodies, with real samples in them, are what /openapi.json says they are.
    doc = a.http.get("/openapi.json").json()
    nodes_body = a.http.get(
        "/api/v1/nodes", headers={"Authorization": f"Bearer {a.probe_key}"}
    ).json()
    validate(doc, "/api/v1/nodes", "get", nodes_body)
    validate(
        doc, "/api/v1/nodes/{node_id}/telemetry", "get", {"node_id": "gpu-box", "samples": grown}
    )

    unknown = history(a, "nobody")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_node"
    assert history(a, "gpu-box", key="wrong").status_code == 401

    # A hostile node on B: junk in every heartbeat. Its heartbeats still count (it stays
    # online past three heartbeat intervals), nothing of its junk reaches the store or the
    # API, and the honest node's telemetry keeps flowing.
    token = procs.enroll("evil")
    async with (
        raw_node(b.url, "evil", token, heartbeats=False) as evil,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(hostile_heartbeats, evil, 0.1)
        await wait(lambda: a.has_node("evil"), "A sees the hostile node")
        before = history(a, "gpu-box").json()["samples"][-1]["at"]
        await trio.sleep(2.0)  # > 3 heartbeat intervals of 0.5 s
        assert a.has_node("evil") and b.has_node("evil")
        assert telemetry_of(a, "evil") is None and telemetry_of(b, "evil") is None
        evil_history = history(a, "evil")
        assert evil_history.status_code == 200 and evil_history.json()["samples"] == []
        key = f"{redis_key_prefix}:telemetry:evil".encode()
        assert redis_server_session.raw_command("EXISTS", key) == b":0\r\n"  # type: ignore[attr-defined]
        assert history(a, "gpu-box").json()["samples"][-1]["at"] > before
        # Status and everything else still answer normally.
        assert a.status()["online_nodes"] == 2
        nursery.cancel_scope.cancel()
    raw = redis_server_session.raw_command(  # type: ignore[attr-defined]
        "LRANGE", f"{redis_key_prefix}:telemetry:gpu-box", "0", "-1"
    )
    assert b"junk" not in raw and b"pad" not in raw
