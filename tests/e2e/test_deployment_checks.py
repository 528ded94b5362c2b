"""Deployment mistakes caught at start, against real processes: a second ``gemmanet serve`` on
one embedded store (SQLite file or PostgreSQL schema, no Redis) is refused in one line, and a
restart right after ``kill -9`` of the first is not; a password planted in a URL appears in the
output of no command; a model that no node serving it can hold is refused at once."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.processes import CLI, ROOT, Processes, free_port

pytestmark = pytest.mark.e2e

PLANTED = "PLANTED-pw-4711"


def _second_serve_is_refused(procs: Processes, env: dict[str, str]) -> str:
    done = procs.cli("serve", "--port", str(free_port()), env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("gemmanet: another instance"), line
    assert "without Redis" in line and "GEMMANET_MULTI_INSTANCE=1" in line, line
    return line


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_one_process_per_embedded_store_and_kill_9_frees_it(
    procs: Processes, backend: str, request: pytest.FixtureRequest
) -> None:
    env = dict(procs.env)
    if backend == "postgresql":
        env["GEMMANET_DATABASE_URL"] = request.getfixturevalue("postgresql_database_url")
    first = procs.coordinator(**env)
    line = _second_serve_is_refused(procs, env)
    if backend == "sqlite":
        assert f"(pid {first.proc.pid})" in line and "gemmanet.db.lock" in line, line
    else:
        assert "advisory lock" in line and "schema gn_test_" in line, line
    # The first one goes on serving.
    assert first.status()["online_nodes"] == 0 and first.proc.poll() is None
    # kill -9 leaves no lock behind: the next one starts at once.
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    again = procs.coordinator(**env)
    assert again.status()["instances"] == 1


def test_no_command_prints_a_password_planted_in_a_url(procs: Processes) -> None:
    redis = {**procs.env, "GEMMANET_REDIS_URL": f"redis://127.0.0.1:1/0?password={PLANTED}"}
    database = {**procs.env, "GEMMANET_DATABASE_URL": f"postgresql://gn:{PLANTED}@127.0.0.1:1/gn"}
    runs = [
        (redis, ("serve", "--port", str(free_port()))),
        (redis, ("audit",)),
        (redis, ("audit", "--json")),
        (database, ("keys", "create", "--name", "k")),
    ]
    # All at once (each refuses before it connects). monitor, prove-takeover and nodes enroll
    # read the settings through the same Settings.from_env (tried by hand, and the refusal
    # itself is tests/coordinator/test_url_credentials.py): not run here, to save the suite
    # a second of CPU each.
    started = [
        (env, args, subprocess.Popen([*CLI, *args], cwd=ROOT, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for env, args in runs
    ]  # fmt: skip
    for env, args, proc in started:
        stdout, stderr = proc.communicate(timeout=60)
        assert PLANTED not in stdout + stderr, (args, stdout, stderr)
        assert proc.returncode == 2 and stdout == "", (args, stdout, stderr)
        variable = "GEMMANET_REDIS_URL" if env is redis else "GEMMANET_DATABASE_URL"
        assert stderr.startswith(f"gemmanet: {variable} must not carry credentials"), stderr
        assert stderr.count("\n") == 1, stderr


def test_a_model_no_node_can_hold_is_refused_at_once_not_after_the_queue(
    procs: Processes, tmp_path: Path
) -> None:
    catalog = tmp_path / "capacity.toml"
    catalog.write_text('[models."llama3:8b"]\nresident_gb = 5.5\n')
    coord = procs.coordinator(GEMMANET_CAPACITY_FILE=str(catalog), GEMMANET_QUEUE_TIMEOUT_S="30")
    procs.node(coord, "small-box", models=("llama3:8b",), extra=("--vram-gb", "4"))
    key = procs.create_key()
    began = time.monotonic()
    answer = coord.http.post(
        "/api/v1/request",
        json={"model": "llama3:8b", "prompt": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    # At once: far inside the 30 s the queue would have waited.
    assert time.monotonic() - began < 10
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["code"] == "model_never_fits"
    assert "'llama3:8b'" in error["message"] and "is 4 GB" in error["message"], error
    assert answer.headers["Retry-After"] == "30"
    # The instance said so when the node connected.
    log = Path(coord.proc.log_path).read_text()  # type: ignore[attr-defined]
    assert "node small-box: its memory budget of 4 GB can never hold llama3:8b (5.5 GB)" in log
