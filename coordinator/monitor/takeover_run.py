"""One run of ``gemmanet prove-takeover``: a primary and a standby ``gemmanet monitor`` as real
processes, the primary SIGSTOPped mid-run and SIGCONTed after the standby took over.

What a run measures, each from the store's side where the store can tell:

* owner loss before the stop: samples (every quarter poll) in which the primary, running
  untouched, did not hold the lease or its host's facts were missing or older than the
  staleness window;
* handover: seconds from the SIGSTOP until the store shows the standby's facts (a newer epoch);
* deposed writes: after the SIGCONT, the old primary's writes with its old epoch. Attempts and
  rejections come from its own event lines (and the store's ``fenced_rejects``); successes from
  the store's per-epoch accepted-write counter, taken after the stop and again at the end, and
  from the old epoch's facts being visible again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import trio

from coordinator.coordination.roles import MonitorStore

__all__ = ["MonitorProcess", "RunResult", "TakeoverRun"]

_SPAWN_TIMEOUT_S = 20.0


@dataclass
class RunResult:
    handover_s: float | None = None
    owner_loss: int = 0
    deposed_attempts: int = 0
    deposed_rejected: int = 0
    deposed_succeeded: int = 0
    fenced_rejects_counted: int = 0
    problems: list[str] = field(default_factory=list)

    def passes(self, window_s: float) -> bool:
        return (
            not self.problems
            and self.owner_loss == 0
            and self.deposed_succeeded == 0
            and self.deposed_attempts > 0
            and self.handover_s is not None
            and self.handover_s <= window_s
        )


class MonitorProcess:
    """A ``gemmanet monitor --events`` child whose event lines are collected as they come."""

    def __init__(self, name: str, env: dict[str, str], log_path: str) -> None:
        self.name = name
        self.env = env
        self.log_path = log_path
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.process: trio.Process | None = None
        self._changed = trio.Event()

    async def start(self, nursery: trio.Nursery) -> None:
        command = [
            sys.executable,
            "-m",
            "coordinator.cli",
            "monitor",
            "--id",
            self.name,
            "--events",
        ]
        log = self._open_log()
        try:
            self.process = await trio.lowlevel.open_process(
                command, env=self.env, stdout=subprocess.PIPE, stderr=log
            )
        finally:
            log.close()
        nursery.start_soon(self._read)

    def _open_log(self) -> BinaryIO:
        # The child's stderr (its log lines), for a look when a run goes wrong.
        return open(self.log_path, "ab")

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.events.append((trio.current_time(), event))
                    self._changed.set()
                    self._changed = trio.Event()

    async def wait_event(
        self, kind: str, *, after: float = 0.0, timeout_s: float
    ) -> dict[str, Any] | None:
        with trio.move_on_after(timeout_s):
            while True:
                for at, event in self.events:
                    if at >= after and event.get("event") == kind:
                        return event
                if self.process is not None and self.process.returncode is not None:
                    return None
                with trio.move_on_after(0.2):
                    await self._changed.wait()
        return None

    def last_log_line(self) -> str:
        """The child's last stderr line, for a problem report (the log dir is temporary)."""
        try:
            with open(self.log_path, "rb") as handle:
                lines = handle.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:300] if lines else "(nothing on stderr)"

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.returncode is None:
            os.kill(self.process.pid, signum)

    async def stop(self) -> None:
        if self.process is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        with trio.move_on_after(3):
            await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


class TakeoverRun:
    def __init__(
        self,
        coordination: MonitorStore,
        host_id: str,
        env: dict[str, str],
        log_dir: str,
        *,
        number: int,
        poll_s: float,
        ttl_s: float,
        window_s: float,
    ) -> None:
        self.coordination = coordination
        self.host_id = host_id
        self.number = number
        self.poll_s = poll_s
        self.ttl_s = ttl_s
        self.window_s = window_s
        self.primary = MonitorProcess(f"primary-{number}", env, f"{log_dir}/primary-{number}.log")
        self.standby = MonitorProcess(f"standby-{number}", env, f"{log_dir}/standby-{number}.log")
        self.result = RunResult()

    async def _facts_epoch(self) -> tuple[int | None, float | None]:
        facts = (await self.coordination.host_facts([self.host_id])).get(self.host_id)
        return (None, None) if facts is None else (facts.epoch, facts.age_s)

    async def _wait_for(self, predicate: Any, timeout_s: float) -> bool:
        with trio.move_on_after(timeout_s):
            while not await predicate():
                await trio.sleep(self.poll_s / 4)
            return True
        return False

    async def execute(self) -> RunResult:
        result = self.result
        async with trio.open_nursery() as nursery:
            try:
                await self._execute(nursery)
            finally:
                with trio.CancelScope(shield=True):
                    await self.primary.stop()
                    await self.standby.stop()
                nursery.cancel_scope.cancel()
        return result

    async def _execute(self, nursery: trio.Nursery) -> None:
        result = self.result
        await self.primary.start(nursery)
        elected = await self.primary.wait_event("elected", timeout_s=_SPAWN_TIMEOUT_S)
        if elected is None:
            result.problems.append(f"the primary never got elected: {self.primary.last_log_line()}")
            return
        old_epoch = int(elected["epoch"])

        async def primary_facts() -> bool:
            return (await self._facts_epoch())[0] == old_epoch

        if not await self._wait_for(primary_facts, _SPAWN_TIMEOUT_S):
            result.problems.append("the primary never wrote facts")
            return
        # The primary runs untouched while the standby starts: any loss now is owner loss.
        await self.standby.start(nursery)
        observe_until = trio.current_time() + max(1.0, 3 * self.poll_s)
        standby_ready = False
        while trio.current_time() < observe_until or not standby_ready:
            if trio.current_time() > observe_until + _SPAWN_TIMEOUT_S:
                result.problems.append("the standby never reported standing by")
                return
            status = await self.coordination.monitor_status()
            epoch, age = await self._facts_epoch()
            if (
                status.holder != self.primary.name
                or epoch != old_epoch
                or age is None
                or age > self.window_s
            ):
                result.owner_loss += 1
            standby_ready = standby_ready or any(
                e.get("event") == "standby" for _, e in self.standby.events
            )
            await trio.sleep(self.poll_s / 4)

        self.primary.signal(signal.SIGSTOP)
        stopped_at = trio.current_time()
        # A write sent just before the stop is still the primary's by right: let it land.
        await trio.sleep(min(0.1, self.ttl_s / 4))
        accepted_at_stop = await self.coordination.accepted_fact_writes(old_epoch)
        rejects_at_stop = (await self.coordination.monitor_status()).fenced_rejects

        async def standby_facts() -> bool:
            epoch, _ = await self._facts_epoch()
            return epoch is not None and epoch > old_epoch

        if not await self._wait_for(standby_facts, self.window_s + 5):
            result.problems.append("the standby never wrote facts after the stop")
            return
        result.handover_s = trio.current_time() - stopped_at

        resumed_at = trio.current_time()
        self.primary.signal(signal.SIGCONT)
        old_visible = 0
        with trio.move_on_after(self.ttl_s + 4 * self.poll_s + 2):
            while await self.primary.wait_event("deposed", after=resumed_at, timeout_s=0) is None:
                epoch, _ = await self._facts_epoch()
                old_visible += epoch == old_epoch
                await trio.sleep(self.poll_s / 8)
        writes = [
            e
            for at, e in self.primary.events
            if at >= resumed_at and e.get("event") == "write" and e.get("epoch") == old_epoch
        ]
        result.deposed_attempts = len(writes)
        result.deposed_rejected = sum(1 for e in writes if not e.get("accepted"))
        accepted_now = await self.coordination.accepted_fact_writes(old_epoch)
        result.deposed_succeeded = max(
            accepted_now - accepted_at_stop,
            sum(1 for e in writes if e.get("accepted")),
            old_visible and 1,
        )
        status = await self.coordination.monitor_status()
        result.fenced_rejects_counted = status.fenced_rejects - rejects_at_stop
        if not writes:
            result.problems.append("the resumed primary attempted no write with its old epoch")
