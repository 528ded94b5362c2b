"""``gemmanet audit`` end to end: real ``gemmanet`` processes (an instance, a node agent, a
``gemmanet monitor``), a private redis-server, the fake Ollama of tools/fakes as the direct
host. Every exit code the audit documents, from its ``--json`` report: no monitor (1), ready
(0), settings outside the timing bound (1), the host unreachable (1), the monitor stopped past
the staleness window (1, the host named), Redis down (3), no Redis configured (2).

Monitor timings as in test_monitor_takeover.py: poll 0.2 s, TTL 1 s, retry 0.2 s, poll
timeout 0.3 s (bound 2 s) against a 4 s window.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import CLI, ROOT, Processes, free_port, wait_until
from tests.fixtures.redis_server import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

FAST = {
    "GEMMANET_MONITOR_POLL_S": "0.2",
    "GEMMANET_MONITOR_TTL_S": "1",
    "GEMMANET_MONITOR_RETRY_S": "0.2",
    "GEMMANET_MONITOR_POLL_TIMEOUT_S": "0.3",
    "GEMMANET_RESIDENCY_STALE_S": "4",
}
WINDOW_S = 4.0


def operator_file(tmp_path: Path, ollama_port: int) -> Path:
    path = tmp_path / "capacity.toml"
    path.write_text(
        f"""
[models."llama3:8b"]
resident_gb = 5.5
[models."mistral:7b"]
resident_gb = 4.1
[models."gemma:2b"]
resident_gb = 1.7

[nodes."box-1"]
max_parallel = 2
vram_gb = 24
[nodes."box-2"]
vram_gb = 8

[hosts."box-c"]
url = "http://127.0.0.1:{ollama_port}"
kind = "ollama"
memory_gb = 24
max_parallel = 2
"""
    )
    return path


def audit(env: dict[str, str], *args: str, **overrides: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [*CLI, "audit", "--json", *args],
        cwd=ROOT,
        env={**env, **overrides},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def codes(report: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(r["code"], r["subject"]) for r in report["reasons"]]


def test_audit_exit_codes_from_no_monitor_to_ready_to_stale(
    procs: Processes, redis_server: RedisServer, tmp_path: Path
) -> None:
    ollama_port = free_port()
    ollama = procs._popen(
        [
            sys.executable, "-m", "tools.fakes.ollama", "--port", str(ollama_port),
            "--model", "llama3:8b", "--resident", "llama3:8b=5.5", "--resident", "qwen:0.5b=0.4",
        ]
    )  # fmt: skip
    procs.share_redis(
        redis_server,
        "audit",
        GEMMANET_CAPACITY_FILE=str(operator_file(tmp_path, ollama_port)),
        **FAST,
    )
    instance = procs.coordinator(GEMMANET_INSTANCE_ID="A")
    procs.node(instance, "box-1", models=("mistral:7b",), extra=("--max-parallel", "4"))
    env = procs.env

    # No monitor yet: not ready, and the host has no facts.
    code, report = audit(env)
    assert code == 1, report
    assert codes(report) == [("no_monitor", None), ("no_facts", "box-c")]
    assert report["monitor"]["holder"] is None

    monitor = procs._popen([*CLI, "monitor", "--id", "audit-m1"])
    code, report = wait_until(lambda: (r := audit(env, "--probe"))[0] == 0 and r, "ready")

    # Ready: exit 0 and the whole report.
    assert report["ready"] is True and report["reasons"] == []
    assert report["monitor"]["holder"] == "audit-m1" and report["monitor"]["lease_epoch"] == 1
    assert report["timing"]["bound_s"] == 2.0 and report["timing"]["ok"] is True
    (host,) = report["hosts"]
    assert host["host_id"] == "box-c" and host["reachable"] is True and host["fresh"] is True
    assert 0 <= host["age_s"] <= WINDOW_S and host["epoch"] == 1
    assert (host["memory_gb"], host["max_parallel"]) == (24.0, 2)
    assert host["resident"] == {"llama3:8b": 5.5, "qwen:0.5b": 0.4}
    assert host["probe"] == {"reachable": True, "error": None}
    box1, box2 = report["nodes"]
    # box-1's budgets: the operator file's parallel and memory override its hello's 4.
    assert {k: v for k, v in box1.items() if k != "owner_age_s"} == {
        "node_id": "box-1", "max_parallel": 2, "vram_gb": 24.0, "budget_from": "operator file",
        "parallel_from": "operator file", "connected": True, "instance_id": "A",
        "models": ["mistral:7b"], "has_facts": True, "fresh": True, "uncatalogued": [],
        "verdict": "ready", "ready": True,
    }  # fmt: skip
    assert 0 <= box1["owner_age_s"] <= 2
    assert box2["connected"] is False and box2["verdict"] == "not_connected"
    catalog = report["catalog"]
    assert catalog["served_by"] == {
        "gemma:2b": [], "llama3:8b": ["box-c"], "mistral:7b": ["box-1"]
    }  # fmt: skip
    assert catalog["unserved"] == ["gemma:2b"]
    assert catalog["unlisted"] == {"qwen:0.5b": ["box-c"]}
    assert [(w["code"], w["subject"]) for w in report["warnings"]] == [
        ("node_not_connected", "box-2"),
        ("catalog_unserved", "gemma:2b"),
        ("catalog_unlisted", "qwen:0.5b"),
    ]

    # The table says the same for people.
    table = subprocess.run(
        [*CLI, "audit"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert table.returncode == 0, table.stdout + table.stderr
    assert table.stdout.startswith("gemmanet audit: READY (exit 0)\n"), table.stdout
    assert "HOST   KIND    REACHABLE  FACTS" in table.stdout
    assert "box-c  ollama  yes        fresh" in table.stdout
    assert "<= GEMMANET_RESIDENCY_STALE_S=4: ok" in table.stdout
    assert table.stderr == ""

    # The same cluster audited with settings outside the timing bound: not ready for that alone.
    code, report = audit(
        env,
        GEMMANET_MONITOR_POLL_S="4",
        GEMMANET_MONITOR_TTL_S="8",
        GEMMANET_MONITOR_RETRY_S="2",
        GEMMANET_MONITOR_POLL_TIMEOUT_S="1",
        GEMMANET_RESIDENCY_STALE_S="15",
    )
    assert code == 1, report
    assert codes(report) == [("bound_exceeded", None)]
    assert report["timing"]["ok"] is False and report["timing"]["bound_s"] == 16.0
    assert "= 16 s exceeds GEMMANET_RESIDENCY_STALE_S=15" in report["reasons"][0]["message"]

    # The host stops answering: the monitor's fresh facts say so, and the audit names it.
    ollama.send_signal(signal.SIGKILL)
    ollama.wait(timeout=10)
    code, report = wait_until(
        lambda: (r := audit(env, "--probe"))[0] == 1 and r, "host unreachable", timeout_s=30
    )
    assert codes(report) == [("host_unreachable", "box-c")], report
    assert report["hosts"][0]["fresh"] is True and report["hosts"][0]["reachable"] is False
    assert report["hosts"][0]["probe"]["reachable"] is False
    assert ("probe_failed", "box-c") in [(w["code"], w["subject"]) for w in report["warnings"]]

    # The monitor freezes: first its lease lapses (no monitor), then, past the window, the
    # host's facts are stale; the reason names the host.
    monitor.send_signal(signal.SIGSTOP)
    code, report = wait_until(
        lambda: (r := audit(env))[0] == 1 and ("stale_facts", "box-c") in codes(r[1]) and r,
        "stale facts",
        timeout_s=60,
    )
    assert codes(report) == [("no_monitor", None), ("stale_facts", "box-c")], report
    # Stale as soon as the window has passed: the first audit that says so ran within one
    # audit's time (a process start, slow on a loaded machine: margin 15 s) after it.
    assert WINDOW_S < report["hosts"][0]["age_s"] <= WINDOW_S + 15, report["hosts"][0]
    assert report["hosts"][0]["fresh"] is False
    assert "box-c" in report["reasons"][1]["message"]
    monitor.send_signal(signal.SIGCONT)


def test_audit_with_redis_down_exits_3(tmp_path: Path, redis_server: RedisServer) -> None:
    redis_server.stop()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMMANET_")}
    env |= {"GEMMANET_REDIS_URL": redis_server.url, "PYTHONUNBUFFERED": "1"}
    env["GEMMANET_CAPACITY_FILE"] = str(operator_file(tmp_path, free_port()))
    code, report = audit(env)
    assert code == 3, report
    assert report["ready"] is False and report["redis"]["reachable"] is False
    assert codes(report) == [("redis_unreachable", None)]
    assert report["hosts"][0]["reachable"] is None and report["catalog"] is None


def test_audit_without_redis_is_one_line_exit_2() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMMANET_")}
    done = subprocess.run(
        [*CLI, "audit"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "audit needs GEMMANET_REDIS_URL" in done.stderr


def test_an_agent_only_cluster_is_ready_and_a_silent_instance_s_node_is_named(
    procs: Processes, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two instances, one agent node on each, no direct host and no monitor: READY, every
    node listed; with B frozen past GEMMANET_ALIVE_TTL_S, NOT READY naming B's node (and the
    node on A still ready)."""
    catalog = tmp_path / "capacity.toml"
    catalog.write_text('[models."gemma:2b"]\nresident_gb = 1.7\n')
    # A 1.5 s TTL (accepted by serve, like the audit's reading of it) shortens the freeze.
    procs.share_redis(
        redis_server, "agents", GEMMANET_CAPACITY_FILE=str(catalog), GEMMANET_ALIVE_TTL_S="1.5"
    )
    a, b = procs.two_instances()
    for coord, node_id in ((a, "agent-a"), (b, "agent-b")):
        procs.node(coord, node_id, models=("gemma:2b",), extra=("--vram-gb", "8"))
    code, report = audit(procs.env)
    assert code == 0, report
    assert report["ready"] is True and report["reasons"] == [] and report["warnings"] == []
    assert [(n["node_id"], n["instance_id"], n["verdict"]) for n in report["nodes"]] == [
        ("agent-a", "A", "ready"),
        ("agent-b", "B", "ready"),
    ]
    assert report["hosts"] == [] and report["monitor"]["holder"] is None
    assert report["catalog"]["served_by"] == {"gemma:2b": ["agent-a", "agent-b"]}

    b.proc.send_signal(signal.SIGSTOP)
    try:
        code, report = wait_until(
            lambda: (r := audit(procs.env))[0] == 1 and r, "agent-b stale", timeout_s=30
        )
    finally:
        b.proc.send_signal(signal.SIGCONT)
    assert codes(report) == [("stale_facts", "agent-b")], report
    assert "instance B last beat" in report["reasons"][0]["message"]
    assert [n["verdict"] for n in report["nodes"]] == ["ready", "stale_facts"]
