"""``gemmanet prove-takeover`` end to end against a real redis-server: real ``gemmanet monitor``
processes, a real SIGSTOP/SIGCONT, the small Ollama listing it serves itself. The strict gate passes with fencing on
and fails with the test-only unfenced switch (the gate can fail). Plus the one-line start-up
refusals of the timing bound and of a monitor without Redis.

Short timings (poll 0.2 s, TTL 1 s, retry 0.2 s, poll timeout 0.3 s: bound 2 s)
keep the three runs near 12 s; the window (4 s) leaves room for a loaded machine.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.fixtures.processes import CLI, ROOT
from tests.fixtures.redis_server import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

FAST = {
    "GEMMANET_MONITOR_POLL_S": "0.2",
    "GEMMANET_MONITOR_TTL_S": "1",
    "GEMMANET_MONITOR_RETRY_S": "0.2",
    "GEMMANET_MONITOR_POLL_TIMEOUT_S": "0.3",
    "GEMMANET_RESIDENCY_STALE_S": "4",
}


def run_cli(*args: str, timeout: float = 90, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GEMMANET_")}
    return subprocess.run(
        [*CLI, *args],
        cwd=ROOT,
        env={**clean, "PYTHONUNBUFFERED": "1", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def succeeded_counts(stdout: str) -> list[int]:
    return [int(n) for n in re.findall(r"(\d+) SUCCEEDED", stdout)]


def test_the_strict_gate_passes_with_fencing(redis_server: RedisServer) -> None:
    done = run_cli(
        "prove-takeover", "--repeat", "3", "--handover-gate", "strict",
        GEMMANET_REDIS_URL=redis_server.url, **FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line for line in done.stdout.splitlines() if line.startswith("run ")]
    assert len(runs) == 3, done.stdout
    for line in runs:
        # Each run: a handover inside the window, no owner loss, and the resumed primary's
        # write with its old token attempted and rejected by the store.
        handover = float(re.search(r"handover (\d+\.\d+) s", line).group(1))  # type: ignore[union-attr]
        assert 0 < handover <= 4.0, line
        assert "owner loss before stop 0;" in line, line
        assert re.search(r"([1-9]\d*) attempted, \1 rejected \(fenced_rejects \+\1\)", line), line
        assert line.endswith("0 SUCCEEDED; ok"), line
    assert "handover gate strict: PASS (3/3 runs" in done.stdout
    # Nothing of the proof is left in the operator's Redis.
    keys = subprocess.run(
        ["redis-cli", "-p", str(redis_server.port), "--raw", "KEYS", "*"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if keys.returncode == 0:
        assert keys.stdout.strip() == ""


def test_the_gate_fails_when_fencing_is_switched_off(redis_server: RedisServer) -> None:
    done = run_cli(
        "prove-takeover", "--repeat", "1", "--handover-gate", "strict",
        GEMMANET_REDIS_URL=redis_server.url, GEMMANET_MONITOR_UNFENCED="1",
        GEMMANET_ALLOW_TEST_SWITCHES="1", **FAST,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "TEST-ONLY" in done.stdout
    assert succeeded_counts(done.stdout) and all(n > 0 for n in succeeded_counts(done.stdout))
    assert "handover gate strict: FAIL" in done.stdout


def test_the_unfenced_switch_is_refused_without_the_test_flag() -> None:
    done = run_cli(
        "prove-takeover", GEMMANET_REDIS_URL="redis://127.0.0.1:1/0", GEMMANET_MONITOR_UNFENCED="1"
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "GEMMANET_ALLOW_TEST_SWITCHES=1" in done.stderr


@pytest.mark.parametrize("command", [["monitor"], ["prove-takeover"], ["serve", "--port", "1"]])
def test_the_timing_bound_refuses_in_one_line(command: list[str]) -> None:
    done = run_cli(
        *command,
        GEMMANET_REDIS_URL="redis://127.0.0.1:1/0",
        GEMMANET_MONITOR_POLL_S="4",
        GEMMANET_MONITOR_TTL_S="8",
        GEMMANET_MONITOR_RETRY_S="2",
        GEMMANET_MONITOR_POLL_TIMEOUT_S="1",
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "poll 4 + election TTL 8 + standby retry 2 + 2 x poll timeout 1 = 16 s" in done.stderr
    assert "exceeds GEMMANET_RESIDENCY_STALE_S=15" in done.stderr


def test_a_monitor_process_refuses_the_memory_backend() -> None:
    done = run_cli("monitor", timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "needs GEMMANET_REDIS_URL" in done.stderr


def test_prove_takeover_without_a_reachable_redis_is_one_line() -> None:
    done = run_cli("prove-takeover", GEMMANET_REDIS_URL="redis://127.0.0.1:1/0", timeout=30)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Redis is unreachable" in done.stderr, done.stderr


def test_a_lease_shorter_than_a_tick_is_refused() -> None:
    done = run_cli(
        "monitor",
        GEMMANET_REDIS_URL="redis://127.0.0.1:1/0",
        GEMMANET_MONITOR_POLL_S="1",
        GEMMANET_MONITOR_TTL_S="1.5",
        GEMMANET_MONITOR_POLL_TIMEOUT_S="1",
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "must exceed poll 1 + poll timeout 1" in done.stderr
