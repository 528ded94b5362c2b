"""One instance id, one live process (issue 13, items 1 and 3), on both buses.

* A second process started with the id of a running instance refuses to start with one line.
* A restart after kill -9 with the same id is a new life of that instance: it starts at once
  (its old presence is still fresh), and B's tasks on the old life's nodes end with 502 within
  3 s of the kill, not at their deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import trio

from protocol import Assign, TaskErrorCode
from tests.e2e.test_multi_instance import post, sees_node
from tests.fixtures.processes import CLI, Coordinator, Processes, free_port, wait_until
from tests.fixtures.raw_node import raw_node

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


@pytest.fixture(params=["pubsub", "streams"])
def shared(request: pytest.FixtureRequest, procs: Processes, redis_server) -> Processes:  # type: ignore[no-untyped-def]
    return procs.share_redis(
        redis_server, f"ids{os.getpid()}{request.param}", GEMMANET_BUS=request.param
    )


def test_a_second_live_process_with_the_same_id_is_refused(shared: Processes) -> None:
    a = shared.coordinator(GEMMANET_INSTANCE_ID="A")
    started = time.monotonic()
    second = shared._popen(
        [*CLI, "serve", "--host", "127.0.0.1", "--port", str(free_port())],
        {**shared.env, "GEMMANET_INSTANCE_ID": "A"},
    )
    try:
        returncode = second.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("a second process with the id of a live instance started")
    assert returncode == 1
    lines = Path(second.log_path).read_text().strip().splitlines()  # type: ignore[attr-defined]
    assert "already running" in lines[-1] and "'A'" in lines[-1], lines
    assert not any("Traceback" in line for line in lines), lines
    assert time.monotonic() - started < 15
    assert a.healthy()  # the first one is untouched


async def test_kill_9_then_restart_with_the_same_id_is_a_new_life(shared: Processes) -> None:
    a, b = shared.two_instances()
    key = shared.create_key("client")
    async with raw_node(a.url, "doomed", shared.enroll("doomed")) as node:
        wait_until(lambda: sees_node(b, "doomed"), "B sees the node of A")
        results: list[tuple[object, float]] = []
        async with trio.open_nursery() as nursery:

            async def client() -> None:
                results.append(await post(b, key, model="echo", prompt="p q", timeout_s=20))

            nursery.start_soon(client)
            assign = await node.receive()
            assert isinstance(assign, Assign)
            os.kill(a.proc.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            # Restarted at once with the same id, while its old presence is still fresh.
            port = free_port()
            again = shared._popen(
                [*CLI, "serve", "--host", "127.0.0.1", "--port", str(port)],
                {**shared.env, "GEMMANET_INSTANCE_ID": "A"},
            )
    response, answered_at = results[0]
    assert response.status_code == 502, response.text  # type: ignore[attr-defined]
    assert response.json()["error"]["code"] == TaskErrorCode.NODE_DISCONNECTED  # type: ignore[attr-defined]
    assert answered_at - killed_at < 3.0, answered_at - killed_at
    # The restart was accepted, and it is a member of the cluster again.
    a2 = Coordinator(again, f"http://127.0.0.1:{port}", shared.probe_key)
    wait_until(a2.healthy, f"restarted A ({again.log_path})")  # type: ignore[attr-defined]
    wait_until(lambda: b.status()["instances"] == 2, "B counts the new A", timeout_s=10)
    assert again.poll() is None
