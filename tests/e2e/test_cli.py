"""The command line contract of INTERFACE.md."""

from __future__ import annotations

import sys

import httpx
import pytest

from tests.fixtures.processes import Processes, free_port, wait_until

pytestmark = pytest.mark.e2e


def test_key_and_token_are_alone_on_the_last_line(procs: Processes) -> None:
    key = procs.cli("keys", "create", "--name", "n").stdout.strip().splitlines()[-1]
    token = procs.cli("nodes", "enroll", "--node-id", "x").stdout.strip().splitlines()[-1]
    assert key.startswith("gn_") and " " not in key
    assert token.startswith("gnn_") and " " not in token


def test_every_subcommand_has_help(procs: Processes) -> None:
    for args in (
        ["--help"],
        ["serve", "--help"],
        ["keys", "create", "--help"],
        ["nodes", "enroll", "--help"],
        ["node", "--help"],
    ):
        done = procs.cli(*args)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), args


def test_bad_settings_fail_with_one_line(procs: Processes) -> None:
    env = {**procs.env, "GEMMANET_MULTI_INSTANCE": "1"}
    done = procs.cli("serve", "--port", "1", env=env)
    assert done.returncode != 0
    assert "GEMMANET_REDIS_URL" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_app_runs_under_plain_hypercorn(procs: Processes) -> None:
    port = free_port()
    proc = procs._popen(
        [
            sys.executable,
            "-m",
            "hypercorn",
            "--worker-class",
            "trio",
            "-b",
            f"127.0.0.1:{port}",
            "coordinator.app:create_app()",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{url}/healthz").json() == {"ok": True}, "hypercorn serving")
    assert httpx.get(f"{url}/api/v1/status").json()["instances"] == 1
    proc.terminate()


def test_unreachable_database_is_one_clear_line(procs: Processes) -> None:
    env = {**procs.env, "GEMMANET_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    for args in (["serve", "--port", str(free_port())], ["keys", "create", "--name", "x"]):
        done = procs.cli(*args, env=env)
        assert done.returncode == 1, args
        assert done.stderr.startswith("gemmanet: database: cannot open the database"), done.stderr
        assert "Traceback" not in done.stderr


def test_serve_refuses_liveness_settings_over_the_3_s_bound(procs: Processes) -> None:
    env = {**procs.env, "GEMMANET_ALIVE_TTL_S": "2.5"}
    done = procs.cli("serve", "--port", str(free_port()), env=env)
    assert done.returncode == 2
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "alive_ttl_s 2.5" in line and "sweep_s 0.5" in line and "3.40 s" in line, line
    assert "exceeds the promised 3 s" in line and "Traceback" not in line


def test_serve_accepts_a_tighter_ttl(procs: Processes) -> None:
    coord = procs.coordinator(GEMMANET_ALIVE_TTL_S="1.5")
    assert coord.status()["instances"] == 1
