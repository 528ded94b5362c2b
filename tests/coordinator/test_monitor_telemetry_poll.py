"""The primary monitor polls the telemetry agents the operator file names (``telemetry_url``
under ``[nodes."ID"]`` or ``[hosts."ID"]``) and keeps each one's history in the shared store; a
standby polls nothing. Real ``gemmanet telemetry-agent`` process over a real socket; an agent that is down and
a URL that answers something other than a sample store nothing."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from functools import partial

import httpx
import pytest
import trio

from coordinator.capacity import Capacity, HostSpec, NodeBudget
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.monitor.loop import run_monitor
from coordinator.settings import Settings
from tests.fixtures.processes import CLI, ROOT, free_port
from tools.fakes.ollama import FakeOllama

FAST = {
    "monitor_poll_s": 0.1,
    "monitor_ttl_s": 0.6,
    "monitor_retry_s": 0.1,
    "monitor_poll_timeout_s": 0.5,
    "telemetry_interval_s": 0.2,
}


@pytest.fixture
def agent_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "telemetry-agent", "--port", str(port), "--interval", "0.1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/telemetry"
    try:
        for _ in range(200):
            try:
                if httpx.get(url, timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "telemetry agent exited"
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_the_primary_keeps_each_agents_history_and_a_standby_polls_nothing(
    agent_url: str, nursery: trio.Nursery
) -> None:
    ollama_url = await nursery.start(FakeOllama(models=["m"]).run)
    capacity = Capacity(
        # A direct host names its agent in [hosts] itself: no [nodes] entry of its id.
        hosts={"box-c": HostSpec(url=ollama_url, kind="ollama", telemetry_url=agent_url)},
        nodes={
            "with-agent": NodeBudget(telemetry_url=agent_url),
            "agent-down": NodeBudget(telemetry_url=f"http://127.0.0.1:{free_port()}/telemetry"),
            "not-a-sample": NodeBudget(telemetry_url=f"{ollama_url}/api/tags"),
            "no-agent": NodeBudget(),
        },
    )
    settings = Settings(capacity=capacity, **FAST)  # type: ignore[arg-type]
    coordination = MemoryCoordination(trio.current_time)
    async with coordination:
        # Another candidate holds the lease: this one is a standby and polls nothing.
        await coordination.monitor.monitor_acquire("other", ttl_s=60)
        with trio.move_on_after(1.0):
            await run_monitor(coordination.monitor, coordination.telemetry, settings, "standby")
        assert await coordination.telemetry.telemetry_history("with-agent") == []

        await coordination.monitor.monitor_resign(
            "other", (await coordination.monitor.monitor_status()).epoch
        )
        stop = trio.Event()
        nursery.start_soon(
            partial(
                run_monitor,
                coordination.monitor,
                coordination.telemetry,
                settings,
                "primary",
                stop=stop,
            )
        )
        with trio.fail_after(10):
            for polled in ("with-agent", "box-c"):
                while len(await coordination.telemetry.telemetry_history(polled)) < 3:
                    await trio.sleep(0.05)
        stop.set()
        for polled in ("with-agent", "box-c"):
            samples = await coordination.telemetry.telemetry_history(polled)
            assert all(b'"cpu_busy"' in s for s in samples), samples
        for node in ("agent-down", "not-a-sample", "no-agent"):
            assert await coordination.telemetry.telemetry_history(node) == [], node
