"""A node agent whose model backend is down, through the whole system: a real coordinator
process, a real ``gemmanet node`` process with ``--backend ollama`` pointed at a port where
nobody listens, a real client; then a fake Ollama process (tools/fakes, on the ``ollama``
library's types) started on that very port, killed, and started again.

While the backend is down the node is listed (``/api/v1/nodes``: no models, ``host_state``
``unreachable``) and no task is placed on it: a request gets ``503 no_node_for_model`` (or,
caught between the backend's loss and the node's next word, ``503 all_nodes_busy``), never a
``502`` from a doomed node. Once the backend answers, tasks succeed, on the same connection."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import Coordinator, Processes, free_port, wait_until

pytestmark = pytest.mark.e2e

MODEL = "m"
NODE = "ollama-node"
#: generous: the machine running the suite may be loaded
WAIT_S = 30.0


def start_fake_ollama(procs: Processes, port: int) -> subprocess.Popen[bytes]:
    proc = procs._popen(
        [sys.executable, "-m", "tools.fakes.ollama", "--port", str(port), "--model", MODEL]
    )

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"fake ollama exited with {proc.returncode}")
        text = Path(proc.log_path).read_text()  # type: ignore[attr-defined]
        return f"http://127.0.0.1:{port}" in text

    wait_until(listening, "fake ollama listening", timeout_s=WAIT_S)
    return proc


def node_info(coord: Coordinator) -> dict[str, object]:
    (info,) = [n for n in coord.nodes() if n["node_id"] == NODE]
    return info


def ask(coord: Coordinator, key: str, prompt: str) -> httpx.Response:
    return coord.request(key, model=MODEL, prompt=prompt)


def assert_refused_not_failed(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] in ("no_node_for_model", "all_nodes_busy"), (
        response.text
    )


def unreachable_lines(node: subprocess.Popen[bytes]) -> list[str]:
    text = Path(node.log_path).read_text()  # type: ignore[attr-defined]
    return [line for line in text.splitlines() if "backend unreachable" in line]


def test_no_task_is_placed_on_a_node_whose_backend_is_down(procs: Processes) -> None:
    coord = procs.coordinator()
    port = free_port()
    backend_url = f"http://127.0.0.1:{port}"
    extra = ("--backend", "ollama", "--backend-url", backend_url, "--backend-check-s", "0.5")
    node = procs.node(coord, NODE, models=(MODEL,), extra=extra)
    key = procs.create_key("client")

    # Down from the start: connected and listed, visibly unhealthy, serving nothing.
    info = node_info(coord)
    assert info["models"] == [] and info["host_state"] == "unreachable", info
    refused = ask(coord, key, "first")
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "no_node_for_model", refused.text
    # One clear line in the agent's log: which URL, what failed.
    (line,) = unreachable_lines(node)
    assert f"GET {backend_url}/api/tags" in line and "cannot connect" in line, line

    # The backend comes up on that port: the node serves, without reconnecting.
    fake = start_fake_ollama(procs, port)
    wait_until(lambda: node_info(coord)["models"] == [MODEL], "the node serving", WAIT_S)
    assert node_info(coord)["host_state"] is None
    served = ask(coord, key, "hello there")
    assert served.status_code == 200, served.text
    assert served.json()["output"] == "hello there" and served.json()["node_id"] == NODE

    # Lost while connected: the very next requests are refused (503), never failed (502).
    fake.send_signal(signal.SIGKILL)
    fake.wait(timeout=10)
    for attempt in range(3):
        assert_refused_not_failed(ask(coord, key, f"lost {attempt}"))
    wait_until(lambda: node_info(coord)["host_state"] == "unreachable", "the node down", WAIT_S)
    assert node_info(coord)["models"] == []
    refused = ask(coord, key, "still down")
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "no_node_for_model", refused.text

    # And back again.
    start_fake_ollama(procs, port)
    wait_until(lambda: node_info(coord)["models"] == [MODEL], "the node serving again", WAIT_S)
    served = ask(coord, key, "back")
    assert served.status_code == 200 and served.json()["output"] == "back", served.text
    assert len(unreachable_lines(node)) == 2  # one line per outage, not one per check
    assert node.poll() is None
    assert coord.status()["in_flight"] == 0
