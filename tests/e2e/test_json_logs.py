"""Structured logs of a real multi-instance run (GEMMANET_LOG_FORMAT=json, debug level).

Two coordinator processes share one real redis-server that requires a password (from
GEMMANET_REDIS_PASSWORD_FILE); two node agents connect with their tokens; a client makes a
local request, a cross-instance request, a cross-instance stream and one that fails (504), plus
a 401; then everything stops gracefully. Every line every process wrote must be a JSON object
with the documented fields; lines about a task carry its task id, node id and instance id; and
no secret (API keys, node tokens, the Redis password) appears anywhere.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.processes import CLI, Coordinator, Processes, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

TASK_ID = re.compile(r"\bt-[0-9a-f]{24}\b")
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
LEVELS = {"debug", "info", "warning", "error", "critical"}


def _coordinators(procs: Processes, *instance_ids: str) -> list[Coordinator]:
    """Started together (a start takes seconds on a busy machine), ready once all answer."""
    coords = []
    for instance_id in instance_ids:
        port = free_port()
        args = [*CLI, "-v", "serve", "--host", "127.0.0.1", "--port", str(port)]
        proc = procs._popen(args, {**procs.env, "GEMMANET_INSTANCE_ID": instance_id})
        coords.append(Coordinator(proc, f"http://127.0.0.1:{port}", procs.probe_key))
    for coord in coords:
        wait_until(coord.healthy, f"coordinator ({coord.proc.log_path})")  # type: ignore[attr-defined]
    return coords


def _node(
    procs: Processes, coord: Coordinator, node_id: str, token: str, model: str, *extra: str
) -> subprocess.Popen[bytes]:
    args = [*CLI, "-v", "node", "--coordinator", coord.url, "--node-id", node_id]
    args += ["--token", token, "--backend", "echo", "--model", model, *extra]
    return procs._popen(args)


def _parse_every_line(path: Path) -> list[dict[str, object]]:
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"{path.name}:{number} is not JSON: {line!r}")
        assert isinstance(entry, dict), (path.name, number, line)
        assert {"ts", "level", "logger", "msg"} <= entry.keys(), (path.name, number, line)
        assert TS.fullmatch(str(entry["ts"])), line
        assert entry["level"] in LEVELS, line
        entries.append(entry)
    return entries


def test_every_line_is_json_with_ids_and_no_secret(
    procs: Processes, redis_server_factory, tmp_path: Path
) -> None:
    redis_password = "redis-pw-" + secrets.token_hex(12)
    password_file = tmp_path / "redis-password"
    password_file.write_text(redis_password + "\n")
    redis = redis_server_factory(password=redis_password)
    procs.share_redis(
        redis,
        f"logs{os.getpid()}",
        GEMMANET_REDIS_PASSWORD_FILE=str(password_file),
        GEMMANET_LOG_FORMAT="json",
    )
    key = procs.create_key("client")
    tokens = {"fast": procs.enroll("fast"), "slow": procs.enroll("slow")}
    a, b = _coordinators(procs, "A", "B")
    nodes = [
        _node(procs, a, "fast", tokens["fast"], "echo"),
        _node(procs, b, "slow", tokens["slow"], "slow", "--latency-ms", "5000"),
    ]
    for coord in (a, b):
        wait_until(lambda c=coord: {n["node_id"] for n in c.nodes()} == {"fast", "slow"}, "nodes")

    node_of: dict[str, str] = {}  # task id -> node id, from the answers
    local = a.request(key, model="echo", prompt="local")
    remote = b.request(key, model="echo", prompt="across the bus")
    for response in (local, remote):
        assert response.status_code == 200, response.text
        node_of[response.json()["task_id"]] = "fast"
    stream = b.request(key, model="echo", prompt="a streamed answer", stream=True)
    done = json.loads(stream.text.strip().split("\n\n")[-1].removeprefix("data: "))
    node_of[done["task_id"]] = "fast"
    failing = a.request(key, model="slow", prompt="too slow", timeout_s=0.5)
    # 504 at A's deadline, or 502 if the node's own timeout (the same 0.5 s) reached A first.
    assert failing.status_code in (502, 504), failing.text
    wrong_key = "gn_" + secrets.token_urlsafe(32)
    assert a.request(wrong_key, model="echo", prompt="x").status_code == 401

    # The node logs the task too (cancelled, or failed at its own deadline).
    slow_log = Path(nodes[1].log_path)  # type: ignore[attr-defined]
    wait_until(lambda: TASK_ID.search(slow_log.read_text()), "the slow node's line about its task")
    for coord in (a, b):  # an open keep-alive connection would hold the graceful stop 5 s
        coord.http.close()
    for proc in [*nodes, a.proc, b.proc]:  # a graceful stop writes its lines too
        proc.send_signal(signal.SIGTERM)
    for proc in [*nodes, a.proc, b.proc]:
        assert proc.wait(timeout=20) == 0, proc.log_path  # type: ignore[attr-defined]

    logs = {Path(p.log_path).name: p.log_path for p in procs.procs}  # type: ignore[attr-defined]
    entries = {name: _parse_every_line(Path(path)) for name, path in logs.items()}
    instance_of = {a.proc.log_path: "A", b.proc.log_path: "B"}  # type: ignore[attr-defined]
    # The failing task's id is only in the logs: the error answer does not carry it.
    for name, path in logs.items():
        for entry in entries[name]:
            if path in instance_of:
                assert entry.get("instance_id") == instance_of[path], (name, entry)
            if re.search(r"ended: (task_timeout|node_error)$", str(entry["msg"])):
                node_of[str(entry["task_id"])] = "slow"
    assert len(node_of) == 4, node_of

    seen: dict[str, set[str]] = {task: set() for task in node_of}
    for name, path in logs.items():
        for entry in entries[name]:
            for task in TASK_ID.findall(str(entry["msg"])):
                assert entry.get("task_id") == task, (name, entry)
                assert entry.get("node_id") == node_of[task], (name, entry)
                assert entry.get("instance_id") in ("A", "B"), (name, entry)
                seen[task].add(instance_of.get(path, "node"))
    # Each task is logged where it was asked for and where its node is (the node agent
    # logs the failing one).
    remote_task, stream_task = remote.json()["task_id"], done["task_id"]
    slow_task = next(t for t, n in node_of.items() if n == "slow")
    assert seen[local.json()["task_id"]] == {"A"}
    assert seen[remote_task] == seen[stream_task] == {"A", "B"}
    assert seen[slow_task] == {"A", "B", "node"}
    # The request id the client got is the one on the lines of its request.
    ended = [e for e in entries[Path(b.proc.log_path).name] if e.get("task_id") == remote_task]  # type: ignore[attr-defined]
    assert remote.headers["X-Request-Id"] in {e.get("request_id") for e in ended}

    everything = "\n".join(Path(path).read_text(encoding="utf-8") for path in logs.values())
    secret_values = {
        "API key": key,
        "probe API key": procs.probe_key,
        "wrong API key": wrong_key,
        "Redis password": redis_password,
        **{f"token of {node}": token for node, token in tokens.items()},
    }
    leaked = [what for what, value in secret_values.items() if value in everything]
    assert not leaked, f"found in the logs: {leaked}"
    # Debug level really was on (the check above means something): library lines are there.
    loggers = {str(e["logger"]) for lines in entries.values() for e in lines}
    assert {"hypercorn.access", "trio-websocket", "gemmanet.instance"} <= loggers, loggers


def test_an_unknown_format_is_refused_with_one_line(procs: Processes) -> None:
    done = procs.cli("serve", env={**procs.env, "GEMMANET_LOG_FORMAT": "xml"})
    assert done.returncode == 2
    assert done.stderr == "gemmanet: GEMMANET_LOG_FORMAT='xml' must be 'text' or 'json'\n"


def test_a_start_up_refusal_is_a_json_line_in_json_mode(procs: Processes) -> None:
    env = {**procs.env, "GEMMANET_LOG_FORMAT": "json", "GEMMANET_MULTI_INSTANCE": "1"}
    done = procs.cli("serve", env=env)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "error" and "GEMMANET_REDIS_URL" in entry["msg"], entry
