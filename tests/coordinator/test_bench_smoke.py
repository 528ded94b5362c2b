"""The benchmarks in tools/bench run end to end (--quick) and write their figures as JSON.

This checks that they work — processes start, traffic flows, every request is answered, the
report has its figures — not how fast anything is."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def run_bench(module: str, out: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    proc = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--json", str(out), *extra],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "figures measured on " in proc.stdout and " cores, " in proc.stdout
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def positive(value: object) -> bool:
    return isinstance(value, int | float) and not math.isnan(value) and value > 0


def test_throughput_benchmark(tmp_path: Path) -> None:
    data = run_bench("tools.bench.throughput", tmp_path / "throughput.json", "--duration", "3")
    assert data["benchmark"] == "throughput" and positive(data["cores"])
    for kind in ("request", "healthz"):
        figures = data[kind]
        for key in ("throughput_rps", "p50_ms", "p95_ms", "p99_ms", "ok"):
            assert positive(figures[key]), (kind, key, figures)
        assert figures["errors"] == {}, figures
        assert figures["p50_ms"] <= figures["p95_ms"] <= figures["p99_ms"]
    for key in ("throughput", "p50", "p95", "p99"):
        assert positive(data["ratios"][key]), data["ratios"]


@pytest.mark.redis
def test_cross_instance_benchmark(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not found on PATH")
    data = run_bench("tools.bench.cross_instance", tmp_path / "cross.json", "--duration", "3")
    assert data["benchmark"] == "cross_instance"
    # The lean pair's kinds, the coredis pair's, the bare socket; Channels when installed.
    kinds = ["remote", "local", "pubsub", "remote_coredis", "local_coredis", "pubsub_coredis"]
    kinds += ["socket", *(["channels"] if "channels" in data else [])]
    for kind in kinds:
        figures = data[kind]
        for key in ("p50_ms", "p95_ms", "p99_ms", "ok"):
            assert positive(figures[key]), (kind, key, figures)
        assert figures["errors"] == {}, figures
        assert figures["ok"] == figures["scheduled"]
    assert set(data["difference_ms"]) == set(data["difference_coredis_ms"]) == {"p50", "p95", "p99"}
    assert all(isinstance(v, float) for v in data["difference_ms"].values())
    assert data["budget_ms"] == {"p95": 20.0, "p99": 50.0} and data["aim_ms"] == {"p95": 1.0}


@pytest.mark.redis
def test_scale_benchmark(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not found on PATH")
    data = run_bench(
        "tools.bench.scale", tmp_path / "scale.json",
        "--nodes", "6,12", "--idle", "1", "--duration", "1", "--rate", "10",
    )  # fmt: skip
    assert data["benchmark"] == "scale" and positive(data["cores"])
    assert [row["nodes"] for row in data["rows"]] == [6, 12]
    for row in data["rows"]:
        assert row["errors"] == {}, row
        assert row["requests"] == 10, row
        assert len(row["idle_cpu_per_instance"]) == 3
        # CPU time moves in 10 ms ticks: an idle instance may show none over one second
        assert all(c >= 0 for c in row["idle_cpu_per_instance"]), row
        assert positive(row["redis_bytes_per_s"]), row
        assert (
            positive(row["latency_ms"]["p50"])
            and row["latency_ms"]["p50"] <= row["latency_ms"]["p99"]
        )
        assert positive(row["placement"]["p50_us"]), row


def test_failover_benchmark(tmp_path: Path) -> None:
    report = run_bench("tools.bench.failover", tmp_path / "failover.json")
    assert report["benchmark"] == "failover" and report["requests"] == 2
    # Every request in flight on the killed owner got its 502, within the 3 s contract.
    assert positive(report["p50_s"]) and report["max_s"] <= 3.0
    assert report["within_contract"] is True
