"""The first hour of a new user (issue 12): stopping, restarting and mixing modes as the README
tells a user to, against real processes and a real Redis."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import CLI, Processes, free_port, wait_until

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


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _run_demo(tmp_path: Path, env: dict[str, str], stop_signal: signal.Signals) -> str:
    """Start `gemmanet demo`, wait for its curl line, stop it with ``stop_signal`` and check that
    nothing it started survives; returns the API key of the curl line."""
    port = free_port()
    out = tmp_path / f"demo-{port}.log"
    with out.open("wb") as log:
        # Started with SIGINT ignored, as a non-interactive shell starts a background job (and
        # as this suite runs when it is started so): Ctrl-C must stop the demo all the same.
        inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child inherits it
        try:
            demo = subprocess.Popen(
                [*CLI, "demo", "--port", str(port)], cwd=tmp_path, env=env, stdout=log, stderr=log
            )
        finally:
            signal.signal(signal.SIGINT, inherited)
    try:
        curl = wait_until(
            lambda: [line for line in out.read_text().splitlines() if line.startswith("curl ")],
            "the demo's curl line",
            timeout_s=60,
        )
        children = _children(demo.pid)
        assert len(children) == 2, children  # the coordinator and the node
        for pid in children:  # the node's token is in its environment, not in `ps`
            assert b"gnn_" not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
        demo.send_signal(stop_signal)
        assert demo.wait(timeout=30) == 0, out.read_text()
        wait_until(lambda: not any(_alive(pid) for pid in children), "the demo's children to end")
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, "port still taken"
    finally:
        if demo.poll() is None:
            demo.kill()
    return curl[0].split("Bearer ")[1].split("'")[0]


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_demo_stops_everything_it_started_and_keeps_its_state_in_one_place(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    env.pop("GEMMANET_DATABASE_URL", None)
    first = _run_demo(tmp_path, env, stop_signal)
    second = _run_demo(tmp_path, env, stop_signal)
    assert first == second and first.startswith("gn_")
    state = tmp_path / "state" / "gemmanet-demo"
    assert (state / "gemmanet.db").exists() and (state / "demo-key").read_text().strip() == first
    assert not (tmp_path / "gemmanet.db").exists()


def test_a_second_demo_is_refused_up_front_and_touches_nothing(tmp_path: Path) -> None:
    """On the same state directory, on the same port or another, a second demo refuses in one
    line before it enrols anything: the first one's node keeps its connection and still
    answers."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("GEMMANET_DATABASE_URL", None)
    state = tmp_path / "state"
    port = free_port()
    out = tmp_path / "first.log"
    with out.open("wb") as log:
        first = subprocess.Popen(
            [*CLI, "demo", "--port", str(port), "--state-dir", str(state)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=log,
        )
    try:
        curl = wait_until(
            lambda: [line for line in out.read_text().splitlines() if line.startswith("curl ")],
            "the first demo's curl line",
            timeout_s=60,
        )
        children = sorted(_children(first.pid))
        key = (state / "demo-key").read_text()
        for other_port, expected in (
            (port, f"gemmanet: cannot listen on 127.0.0.1:{port}: Address already in use"),
            (
                free_port(),
                (
                    f"gemmanet: another gemmanet demo (pid {first.pid}) is running on {state}: "
                    "stop it first, or give this one another --state-dir"
                ),
            ),
        ):
            started = time.monotonic()
            done = subprocess.run(
                [*CLI, "demo", "--port", str(other_port), "--state-dir", str(state)],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 1, done.stderr
            assert done.stderr.strip().splitlines() == [expected], done.stderr
            assert done.stdout == "", done.stdout  # no state line, no curl line
            assert time.monotonic() - started < 15
        # Nothing of the first one was touched: the same processes, key and node connection.
        assert sorted(_children(first.pid)) == children and all(map(_alive, children))
        assert (state / "demo-key").read_text() == key
        api_key = curl[0].split("Bearer ")[1].split("'")[0]
        answer = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/request",
            json={"model": "echo", "prompt": "still mine"},
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=30,
        )
        assert answer.status_code == 200 and answer.json()["output"] == "still mine", answer.text
        assert "replaced" not in out.read_text()
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            first.wait(timeout=30)
        except subprocess.TimeoutExpired:
            first.kill()


def test_demo_on_a_busy_port_fails_at_once_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("GEMMANET_DATABASE_URL", None)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [*CLI, "demo", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"gemmanet: cannot listen on 127.0.0.1:{port}: Address already in use"
    ], done.stderr
    assert time.monotonic() - started < 15
    assert not (tmp_path / "state").exists()  # refused before anything was made


def test_after_kill_9_the_lists_agree_with_placement(procs: Processes, redis_server) -> None:
    """Once placement found the killed instance's node gone (503 no_node_for_model), status and
    nodes never list it again: the next beat's registry read (the dead peer's last beat is
    still within its TTL) must not bring it back."""
    procs.share_redis(redis_server, f"k9{os.getpid()}")
    a, b = procs.two_instances()
    procs.node(a, "on-a", models=("only-a",))
    wait_until(lambda: b.has_node("on-a"), "B lists A's node")
    key = procs.create_key("client")
    assert b.request(key, model="only-a", prompt="x").status_code == 200
    a.proc.kill()
    seen: list[str] = []

    def placement_found_it_gone() -> bool:
        # Only "no node serves it" says placement dropped the node: on a loaded machine a 503
        # of another kind (e.g. all_nodes_busy while A's death is not yet judged) can come first.
        response = b.request(key, model="only-a", prompt="x")
        seen.append(f"{response.status_code} {response.text[:120]}")
        return response.status_code == 503 and "no_node_for_model" in response.text

    refused = wait_until(
        placement_found_it_gone, "placement on B to find A's node gone", timeout_s=10
    )
    assert refused, seen
    deadline = time.monotonic() + 2.5  # past the 0.5 s beats and the 2 s TTL
    while time.monotonic() < deadline:
        assert not b.has_node("on-a"), ("B lists a node placement no longer uses", seen)
        status = b.status()
        assert status["instances"] == 1 and status["online_nodes"] == 0, status
        time.sleep(0.05)
