"""The benchmarks in tools/bench run end to end (--quick) and write their figures as JSON.

This checks that they work — processes start, traffic flows, every request is answered, the
report has its figures and prints its ratio — not how fast anything is (no ratio's value is
checked: on a shared box it says nothing in a quick run)."""

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
    return run_bench_output(module, out, *extra)[0]


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m module args``, which must succeed."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def run_bench_output(module: str, out: Path, *extra: str) -> tuple[dict, str]:  # type: ignore[type-arg]
    """The figures the benchmark wrote and what it printed."""
    proc = run_module(module, "--quick", "--json", str(out), *extra)
    assert "figures measured on " in proc.stdout and " cores, " in proc.stdout
    return json.loads(out.read_text()), proc.stdout


def positive(value: object) -> bool:
    return isinstance(value, int | float) and not math.isnan(value) and value > 0


def has_ratio(data: dict, key: str, stdout: str, printed: str) -> bool:  # type: ignore[type-arg]
    """The report has the ratio (a number; its value is not judged) and printed its line."""
    return isinstance(data["ratios"][key], float) and printed in stdout


def check_kinds(data: dict, kinds: tuple[str, ...], processes: set[str]) -> None:  # type: ignore[type-arg]
    for kind in kinds:
        figures = data[kind]
        for key in ("throughput_rps", "p50_ms", "p95_ms", "p99_ms", "ok"):
            assert positive(figures[key]), (kind, key, figures)
        assert figures["errors"] == {}, figures
        assert figures["p50_ms"] <= figures["p95_ms"] <= figures["p99_ms"]
        # CPU per answered request of every process (the client, each server process)
        assert set(figures["cpu_ms_per_request"]) == processes, figures["cpu_ms_per_request"]
        assert positive(figures["cpu_ms_per_request"]["coordinator"]), figures


def test_throughput_benchmark(tmp_path: Path) -> None:
    data, stdout = run_bench_output(
        "tools.bench.throughput", tmp_path / "throughput.json", "--duration", "3"
    )
    assert data["benchmark"] == "throughput" and positive(data["cores"])
    check_kinds(data, ("request", "healthz"), {"client", "coordinator", "node"})
    for key in ("throughput", "p50", "p95", "p99"):
        assert positive(data["ratios"][key]), data["ratios"]
    assert has_ratio(
        data, "coordinator_cpu_per_request", stdout, "coordinator CPU per request / per healthz:"
    )


@pytest.mark.redis
def test_throughput_benchmark_on_redis(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not found on PATH")
    data, stdout = run_bench_output(
        "tools.bench.throughput", tmp_path / "throughput.json", "--duration", "3", "--redis"
    )
    assert data["settings"]["redis"] is True
    check_kinds(data, ("request", "healthz"), {"client", "coordinator", "node", "redis"})
    assert has_ratio(
        data, "coordinator_cpu_per_request", stdout, "coordinator CPU per request / per healthz:"
    )


def test_stream_benchmark(tmp_path: Path) -> None:
    data, stdout = run_bench_output("tools.bench.stream", tmp_path / "stream.json", "--chunks", "8")
    assert data["benchmark"] == "throughput" and data["mode"] == "stream"
    check_kinds(data, ("request", "stream_one", "stream"), {"client", "coordinator", "node"})
    assert data["stream"]["chunks_per_request"] == 8
    assert set(data["cpu_ms_per_chunk"]["coordinator"]) == {"marginal", "average"}
    assert has_ratio(
        data,
        "coordinator_cpu_per_chunk_vs_request",
        stdout,
        "coordinator CPU per chunk / per non-streamed request:",
    )


@pytest.mark.skipif(
    shutil.which("py-spy", path=str(Path(sys.executable).parent)) is None
    and shutil.which("py-spy") is None,
    reason="py-spy is not installed",
)
def test_throughput_benchmark_profile(tmp_path: Path) -> None:
    data, stdout = run_bench_output(
        "tools.bench.throughput", tmp_path / "throughput.json", "--py-spy", str(tmp_path / "prof")
    )
    assert "py-spy profile of the coordinator over the request round" in stdout
    assert "coordinator CPU by category" in stdout
    assert set(data["profiles"]) == {"request", "healthz"}
    assert (tmp_path / "prof" / "coordinator-request.summary").exists()


@pytest.mark.redis
def test_cross_instance_benchmark(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not found on PATH")
    data, stdout = run_bench_output(
        "tools.bench.cross_instance", tmp_path / "cross.json", "--duration", "3"
    )
    assert data["benchmark"] == "cross_instance"
    # The pair's kinds (the bus's one client), the bare socket; Channels when installed.
    kinds = ["remote", "local", "pubsub", "socket", *(["channels"] if "channels" in data else [])]
    for kind in kinds:
        figures = data[kind]
        for key in ("p50_ms", "p95_ms", "p99_ms", "ok"):
            assert positive(figures[key]), (kind, key, figures)
        assert figures["errors"] == {}, figures
        assert figures["ok"] == figures["scheduled"]
    assert set(data["difference_ms"]) == {"p50", "p95", "p99"}
    assert not any(key.endswith("_coredis") or "coredis" in key for key in data)
    assert all(isinstance(v, float) for v in data["difference_ms"].values())
    assert data["budget_ms"] == {"p95": 20.0, "p99": 50.0} and data["aim_ms"] == {"p95": 1.0}
    # The CPU rounds: the two instances' CPU per remote request against a local one.
    assert set(data["cpu"]) == {"lean"}
    for pair in data["cpu"].values():
        for kind in ("remote", "local"):
            assert pair[kind]["errors"] == {} and positive(pair[kind]["ok"]), pair[kind]
            assert positive(pair[kind]["cpu_ms_per_request"]["instances"]), pair[kind]
        assert has_ratio(pair, "instances_cpu_remote_vs_local", stdout, "A+B CPU per remote")


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


@pytest.mark.redis
def test_affinity_benchmark(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not found on PATH")
    data, stdout = run_bench_output("tools.bench.affinity", tmp_path / "affinity.json")
    assert data["benchmark"] == "affinity" and positive(data["cores"])
    for mode in ("off", "on"):
        figures = data[mode]
        assert figures["requests"] == 4, figures  # 2 conversations x 2 turns, each answered
        assert figures["ttft_p50_ms"] <= figures["ttft_p95_ms"], figures
        assert positive(figures["ttft_mean_ms"]) and positive(figures["read_tokens"])
        assert figures["prompt_tokens"] >= figures["read_tokens"], figures
    # The instance found its own records of who served the first turns (one round trip
    # each way through the shared store); with affinity off nothing is looked up.
    assert data["on"]["hit_rate"] > 0 and data["off"]["hit_rate"] is None
    assert has_ratio(data, "ttft_mean_on_over_off", stdout, "mean time to first token on / off:")


@pytest.mark.redis
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_redis_commands_benchmark() -> None:
    proc = run_module("tools.bench.redis_commands", "--requests", "5")
    assert "Redis commands per POST /api/v1/request (5 requests" in proc.stdout, proc.stdout
    assert "scripts (evalsha)" in proc.stdout and "evalsha" in proc.stdout, proc.stdout
