"""A machine that stalls (every process frozen at once: a busy host, a VM paused, swapping) is not
a dead coordinator nor a dead node: when it resumes, neither side may tear the connection down
for a silence that only the stall made. Real processes, real SIGSTOP/SIGCONT.

The coordinator already judged node silence on the time it was running (a sweep that comes far
too late reads what waits in the sockets first: runtime/supervision.py). The node agent judges
the coordinator's silence the same way (tools/node_agent/silence.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.fixtures.processes import Processes, wait_until

pytestmark = pytest.mark.e2e


def connected_at(procs: Processes, coord: object, node_id: str) -> object:
    nodes = coord.nodes()  # type: ignore[attr-defined]
    return next((n["connected_at"] for n in nodes if n["node_id"] == node_id), None)


def test_a_stall_of_the_whole_machine_drops_no_connection(procs: Processes) -> None:
    coord = procs.coordinator()  # heartbeat 0.5 s: silent past 1.5 s
    agent = procs.node(coord, "steady")
    first = connected_at(procs, coord, "steady")
    time.sleep(1.0)
    frozen = [coord.proc, agent]  # type: ignore[attr-defined]
    for proc in frozen:
        os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(3.0)  # twice the silence deadline, for everybody at once
    for proc in frozen:
        os.kill(proc.pid, signal.SIGCONT)
    time.sleep(3.0)  # any verdict is due by now
    wait_until(lambda: coord.status()["online_nodes"] == 1, "the node online")
    assert connected_at(procs, coord, "steady") == first  # the same connection, not a new one
    log = Path(agent.log_path).read_text()  # type: ignore[attr-defined]
    assert "nothing from the coordinator" not in log
    assert "heartbeat timeout" not in log
