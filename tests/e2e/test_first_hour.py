"""The first hour of a new user (issue 12): stopping, restarting and mixing modes as the README
tells a user to, against real processes and a real Redis."""

from __future__ import annotations

import os
import signal

import pytest

from tests.fixtures.processes import Processes, free_port

pytestmark = pytest.mark.e2e


def _lock_env(procs: Processes, redis_server, prefix: str, multi: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {
        **procs.env,
        "GEMMANET_REDIS_URL": redis_server.url,
        "GEMMANET_KEY_PREFIX": prefix,
        "GEMMANET_MULTI_INSTANCE": multi,
    }


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_graceful_stop_releases_the_single_instance_lock(
    procs: Processes, redis_server, stop_signal: signal.Signals
) -> None:
    prefix = f"lk{os.getpid()}{int(stop_signal)}"
    env = _lock_env(procs, redis_server, prefix, "0")
    first = procs.coordinator(**env)
    first.proc.send_signal(stop_signal)
    assert first.proc.wait(timeout=15) == 0
    assert redis_server.raw_command("EXISTS", f"{prefix}:lock:single-instance") == b":0\r\n"
    # A restart right away is not refused (the lock's TTL is 10 s).
    again = procs.coordinator(**env)
    assert again.status()["instances"] == 1


@pytest.mark.parametrize("first_mode,second_mode", [("0", "1"), ("1", "0")])
def test_the_two_modes_refuse_to_share_a_redis(
    procs: Processes, redis_server, first_mode: str, second_mode: str
) -> None:
    prefix = f"mx{os.getpid()}{first_mode}"
    first = procs.coordinator(**_lock_env(procs, redis_server, prefix, first_mode))
    done = procs.cli(
        "serve",
        "--port",
        str(free_port()),
        env=_lock_env(procs, redis_server, prefix, second_mode),
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]  # after the log lines of its start
    assert line.startswith("gemmanet: "), line
    assert "GEMMANET_MULTI_INSTANCE" in line and "GEMMANET_KEY_PREFIX" in line, line
    # The first one is untouched and still alone.
    assert first.status()["instances"] == 1
    assert first.proc.poll() is None
    if second_mode == "0":
        # The refused =0 instance let go of the lock it took for its check.
        assert redis_server.raw_command("EXISTS", f"{prefix}:lock:single-instance") == b":0\r\n"

