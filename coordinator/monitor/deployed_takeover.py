"""``gemmanet prove-takeover --against-deployed --primary ID [--pid PID]``: the takeover proof on
the monitors that really run — the configured Redis, key prefix and operator file's hosts —
instead of a pair of its own. Every gate condition is read from the store.

1. **Before the stop.** The store must show ``ID`` holding the lease, and facts of every host
   of ``[hosts]`` written under its epoch (else one line says what is missing, exit 1). For
   ``max(1 s, 3 polls)`` it samples, every quarter poll, whether that still holds (holder,
   epoch, every host's facts no older than ``GEMMANET_RESIDENCY_STALE_S``): each sample that
   does not is *owner loss*.
2. **The stop.** With ``--pid``, this command SIGSTOPs that process (on this machine; a
   process that was not the primary shows by its epoch's writes going on, and is resumed and
   reported). Without it, the operator stops the primary themselves (``kill -STOP``, pausing a
   VM or container) within ``--timeout``. Either way the stop is dated at the primary's **last
   accepted write** (the store's per-epoch counter stops growing), so the handover measured
   is an upper bound of the real one.
3. **Handover**: until every host's facts carry a newer epoch (the standby's).
4. **Fencing.** The old primary is resumed (``--pid``: SIGCONT; else the operator, who is
   told so) and its first tick writes with its old epoch: the store must reject every such
   write (``fenced_rejects`` grows: the *attempts*) and accept none (the old epoch's accepted
   count does not grow, its facts never come back). A primary killed rather than paused
   attempts nothing, and a run that proved nothing fails.

The gate is ``strict``'s: no owner loss, at least one deposed write attempted, none succeeded,
the handover inside the window. Read-only on the store: it writes nothing, deletes nothing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable

import trio

from coordinator.coordination.roles import MonitorStore
from coordinator.monitor.takeover_run import RunResult
from coordinator.settings import Settings

__all__ = ["DeployedTakeover"]

#: after the old primary is resumed, how long its first rejected write may take (beyond a TTL
#: and a few polls: a machine resuming from a pause is slow for a moment)
_RESUME_GRACE_S = 2.0


class DeployedTakeover:
    def __init__(
        self,
        store: MonitorStore,
        settings: Settings,
        *,
        primary: str,
        pid: int | None,
        timeout_s: float,
        say: Callable[[str], None],
    ) -> None:
        self.store = store
        self.hosts = sorted(settings.capacity.hosts)
        self.primary = primary
        self.pid = pid
        self.timeout_s = timeout_s
        self.say = say
        self.poll_s = settings.monitor_poll_s
        self.ttl_s = settings.monitor_ttl_s
        self.window_s = settings.residency_stale_s
        # A live primary writes at least once per poll plus a slow host's poll timeout.
        self.quiet_s = 2 * settings.monitor_poll_s + settings.monitor_poll_timeout_s
        self.result = RunResult()

    async def _facts_epochs(self) -> dict[str, tuple[int, float]]:
        found = await self.store.host_facts(self.hosts)
        return {h: (f.epoch, f.age_s) for h, f in found.items()}

    async def _owner_holds(self, epoch: int) -> bool:
        status = await self.store.monitor_status()
        facts = await self._facts_epochs()
        return (
            status.holder == self.primary
            and status.lease_epoch == epoch
            and all(h in facts for h in self.hosts)
            and all(e == epoch and age <= self.window_s for e, age in facts.values())
        )

    def _signal(self, signum: int) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                self.result.problems.append(f"no process {self.pid}")

    async def execute(self) -> RunResult:
        try:
            await self._execute()
        finally:
            if self.pid is not None:
                self._signal(signal.SIGCONT)  # never leave a process stopped
        return self.result

    async def _execute(self) -> None:
        result = self.result
        status = await self.store.monitor_status()
        if status.holder != self.primary or status.lease_epoch is None:
            holder = status.holder or "nobody"
            result.problems.append(f"{self.primary} is not the primary ({holder} holds the lease)")
            return
        epoch = status.lease_epoch
        if not await self._owner_holds(epoch):
            result.problems.append(
                f"the hosts' facts are not all fresh under epoch {epoch} before the stop"
            )
            return
        self.say(f"primary {self.primary} holds epoch {epoch}; watching it before the stop")
        observe_until = trio.current_time() + max(1.0, 3 * self.poll_s)
        while trio.current_time() < observe_until:
            result.owner_loss += not await self._owner_holds(epoch)
            await trio.sleep(self.poll_s / 4)

        stopped_at = await self._stop(epoch)
        if stopped_at is None:
            return
        accepted_at_stop = await self.store.accepted_fact_writes(epoch)
        rejects_at_stop = (await self.store.monitor_status()).fenced_rejects

        handed_over = await self._until(self._taken_over(epoch), self.window_s + 5)
        if not handed_over:
            result.problems.append("no standby wrote facts of every host after the stop")
            return
        result.handover_s = trio.current_time() - stopped_at
        status = await self.store.monitor_status()
        self.say(
            f"{status.holder} took over with epoch {status.lease_epoch} "
            f"{result.handover_s:.3f} s after the last write of epoch {epoch}"
        )

        if self.pid is not None:
            self._signal(signal.SIGCONT)
            self.say(f"SIGCONT sent to {self.pid}")
            resume_s = self.ttl_s + 4 * self.poll_s + _RESUME_GRACE_S
        else:
            self.say(f"resume {self.primary} now (kill -CONT): its old-epoch writes must fail")
            resume_s = self.timeout_s
        old_visible = 0

        async def fenced() -> bool:
            nonlocal old_visible
            facts = await self._facts_epochs()
            old_visible += any(e == epoch for e, _ in facts.values())
            return (await self.store.monitor_status()).fenced_rejects > rejects_at_stop

        await self._until(fenced, resume_s)
        # Its tick writes every host before it steps down: let the rest of them come.
        await trio.sleep(self.poll_s)
        status = await self.store.monitor_status()
        result.deposed_attempts = result.deposed_rejected = status.fenced_rejects - rejects_at_stop
        result.fenced_rejects_counted = result.deposed_attempts
        grown = await self.store.accepted_fact_writes(epoch) - accepted_at_stop
        result.deposed_succeeded = max(grown, old_visible and 1)
        if result.deposed_attempts == 0:
            result.problems.append(
                f"no write of epoch {epoch} was rejected: {self.primary} was not resumed "
                "(or it was restarted instead, which proves nothing about fencing)"
            )

    async def _stop(self, epoch: int) -> float | None:
        """Stop the primary (or wait for the operator to) and date the stop at its last
        accepted write: None when it never stopped writing."""
        if self.pid is not None:
            self._signal(signal.SIGSTOP)
            self.say(f"SIGSTOP sent to {self.pid}")
            wait_s = self.quiet_s + self.poll_s
        else:
            self.say(f"stop {self.primary} now (kill -STOP its process); waiting for it")
            wait_s = self.timeout_s
        count = await self.store.accepted_fact_writes(epoch)
        last_at = trio.current_time()
        deadline = last_at + wait_s + self.quiet_s
        while trio.current_time() - last_at <= self.quiet_s:
            if trio.current_time() > deadline:
                who = f"process {self.pid}" if self.pid is not None else self.primary
                self.result.problems.append(
                    f"epoch {epoch}'s writes went on: {who} did not stop"
                    + (" (is it the primary?)" if self.pid is not None else "")
                )
                return None
            await trio.sleep(self.poll_s / 4)
            now_count = await self.store.accepted_fact_writes(epoch)
            if now_count != count:
                count, last_at = now_count, trio.current_time()
        self.say(f"{self.primary} stopped writing ({count} writes of epoch {epoch} accepted)")
        return last_at

    def _taken_over(self, epoch: int) -> Callable[[], Awaitable[bool]]:
        async def newer() -> bool:
            facts = await self._facts_epochs()
            return all(h in facts and facts[h][0] > epoch for h in self.hosts)

        return newer

    async def _until(self, predicate: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
        with trio.move_on_after(timeout_s):
            while not await predicate():
                await trio.sleep(self.poll_s / 8)
            return True
        return False
