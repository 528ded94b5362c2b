"""``gemmanet prove-takeover --against-deployed`` (``monitor/deployed_takeover.py``) on monitors
that run on their own, as deployed: two real ``gemmanet monitor`` processes against a real
redis-server under the deployment's prefix, polling a real (listing-only) Ollama host. The
proof is driven in-process; its every check reads the store.

* The operator stops and resumes the primary themselves (no ``--pid``; the test plays the
  operator, SIGSTOP when told, SIGCONT when told): the gate passes, a handover inside the
  window, owner loss 0, the resumed primary's writes all rejected.
* With ``--pid`` and fencing switched off (test-only) on the deployed monitors, the deposed
  primary's writes land: the gate fails (it can fail).
* Naming a monitor that is not the primary proves nothing and stops nothing.
Plus the command line's one-line refusals.
"""

from __future__ import annotations

import os
import signal
from functools import partial
from pathlib import Path

import pytest
import trio

from coordinator.capacity import load_capacity
from coordinator.coordination.factory import create_coordination
from coordinator.monitor.deployed_takeover import DeployedTakeover
from coordinator.monitor.ollama_listing import OllamaListingHost
from coordinator.monitor.takeover_run import MonitorProcess, RunResult
from coordinator.settings import Settings
from tests.e2e.test_monitor_takeover import FAST, run_cli
from tests.fixtures.redis_server import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

PREFIX = "deployed"
WINDOW_S = float(FAST["GEMMANET_RESIDENCY_STALE_S"])
TIMINGS = {
    "monitor_poll_s": float(FAST["GEMMANET_MONITOR_POLL_S"]),
    "monitor_ttl_s": float(FAST["GEMMANET_MONITOR_TTL_S"]),
    "monitor_retry_s": float(FAST["GEMMANET_MONITOR_RETRY_S"]),
    "monitor_poll_timeout_s": float(FAST["GEMMANET_MONITOR_POLL_TIMEOUT_S"]),
    "residency_stale_s": WINDOW_S,
}


class Deployment:
    def __init__(self, settings: Settings, primary: MonitorProcess, standby: str) -> None:
        self.settings = settings
        self.primary = primary
        self.standby = standby
        self.said: list[str] = []

    async def prove(self, name: str, *, pid: int | None) -> RunResult:
        coordination = create_coordination(self.settings.redis_url, key_prefix=PREFIX)
        async with coordination:
            proof = DeployedTakeover(
                coordination.monitor,
                self.settings,
                primary=name,
                pid=pid,
                timeout_s=20.0,
                say=self.said.append,
            )
            return await proof.execute()

    async def told(self, words: str) -> None:
        with trio.fail_after(30):
            while not any(words in line for line in self.said):
                await trio.sleep(0.02)


async def deploy(
    redis_server: RedisServer, tmp_path: Path, nursery: trio.Nursery, *, fenced: bool
) -> Deployment:
    host = OllamaListingHost(models=["gemma3:4b"], resident={"gemma3:4b": 3_300_000_000})
    url = await nursery.start(partial(host.run, port=0))
    operator_file = tmp_path / "hosts.toml"
    operator_file.write_text(f'[hosts."box-c"]\nurl = "{url}"\nkind = "ollama"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMMANET_")}
    env |= FAST | {"GEMMANET_REDIS_URL": redis_server.url, "GEMMANET_KEY_PREFIX": PREFIX}
    env |= {"GEMMANET_CAPACITY_FILE": str(operator_file), "PYTHONUNBUFFERED": "1"}
    if not fenced:
        env |= {"GEMMANET_MONITOR_UNFENCED": "1", "GEMMANET_ALLOW_TEST_SWITCHES": "1"}
    # Started together, as a deployment's would be: whichever is elected is the primary.
    first = MonitorProcess("monitor-1", env, str(tmp_path / "monitor-1.log"))
    second = MonitorProcess("monitor-2", env, str(tmp_path / "monitor-2.log"))
    await first.start(nursery)
    await second.start(nursery)

    def role(monitor: MonitorProcess) -> str | None:
        seen = {event["event"] for _, event in monitor.events}
        return next((r for r in ("elected", "standby") if r in seen), None)

    with trio.fail_after(30):
        while role(first) is None or role(second) is None:
            await trio.sleep(0.05)
    primary, standby = (first, second) if role(first) == "elected" else (second, first)
    assert (role(primary), role(standby)) == ("elected", "standby")
    settings = Settings(
        redis_url=redis_server.url,
        key_prefix=PREFIX,
        capacity=load_capacity(str(operator_file)),
        **TIMINGS,  # type: ignore[arg-type]
    )
    nursery.start_soon(_stop_at_exit, primary, standby)
    return Deployment(settings, primary, standby.name)


async def _stop_at_exit(*monitors: MonitorProcess) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            for monitor in monitors:
                await monitor.stop()


async def test_the_operator_stops_and_resumes_the_primary_and_the_gate_passes(
    redis_server: RedisServer, tmp_path: Path, nursery: trio.Nursery
) -> None:
    deployment = await deploy(redis_server, tmp_path, nursery, fenced=True)
    primary, standby = deployment.primary.name, deployment.standby
    # A monitor that is not the primary: refused before anything is stopped.
    wrong = await deployment.prove(standby, pid=None)
    assert wrong.problems == [f"{standby} is not the primary ({primary} holds the lease)"]
    assert not wrong.passes(WINDOW_S)

    async def operator() -> None:
        await deployment.told(f"stop {primary} now")
        deployment.primary.signal(signal.SIGSTOP)
        await deployment.told(f"resume {primary} now")
        deployment.primary.signal(signal.SIGCONT)

    nursery.start_soon(operator)
    with trio.fail_after(60):
        result = await deployment.prove(primary, pid=None)
    assert result.problems == [], (result, deployment.said)
    assert result.owner_loss == 0 and result.deposed_succeeded == 0
    assert result.deposed_attempts >= 1
    assert result.handover_s is not None and 0 < result.handover_s <= WINDOW_S
    assert result.passes(WINDOW_S)
    assert any(f"{standby} took over" in line for line in deployment.said), deployment.said


async def test_with_fencing_off_the_deposed_writes_land_and_the_gate_fails(
    redis_server: RedisServer, tmp_path: Path, nursery: trio.Nursery
) -> None:
    deployment = await deploy(redis_server, tmp_path, nursery, fenced=False)
    assert deployment.primary.process is not None
    with trio.fail_after(60):
        result = await deployment.prove(deployment.primary.name, pid=deployment.primary.process.pid)
    assert result.handover_s is not None, (result, deployment.said)
    assert result.deposed_succeeded > 0, (result, deployment.said)
    assert not result.passes(WINDOW_S)


@pytest.mark.parametrize(
    "args, says",
    [
        ((), "--against-deployed needs --primary ID"),
        (("--primary", "monitor-1"), "needs the monitors' operator file"),
    ],
)
def test_the_command_refuses_in_one_line(args: tuple[str, ...], says: str) -> None:
    done = run_cli(
        "prove-takeover", "--against-deployed", *args,
        GEMMANET_REDIS_URL="redis://127.0.0.1:1/0", timeout=30,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
