"""The drain of an instance, the shell's side: what ``core/drain.py`` decides, carried out.

``gemmanet serve`` calls ``begin`` on the first SIGTERM and ``hurry`` on a second signal (or
on SIGINT), runs ``run`` and stops its HTTP server when it returns. Meanwhile:

* ``/readyz`` answers 503 and every new task request ``503 instance_draining`` (``refusal``,
  before its rate limit is spent or any work begins);
* the instance's nodes take no new task and are told to move (close 4004) once idle;
* at the end of the window, requests still waiting for a node (queued) are refused with
  ``instance_shutting_down`` (``Admissions.end_waits``: the admission queue's waits, which
  are the only ones cut short, so a request pays for no cancel scope of the drain's) and
  those running get it as their last event (``_end_remaining``);
  nodes still connected are told to move at once.

The sequence for operators is in docs/operations.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import trio

from coordinator.core.drain import Done, DrainPlan, EndRemaining
from coordinator.core.effects import Effect, FailedEvent, TaskEvent
from coordinator.core.instance_machine import InstanceMachine
from coordinator.errors import InstanceDraining, InstanceShuttingDown
from coordinator.runtime.requests.admission import Admissions

__all__ = ["Drain", "DrainHost"]

log = logging.getLogger("gemmanet.drain")

#: how often the counts are looked at while draining (a drain is rare; polling is simplest)
POLL_S = 0.05
#: Retry-After of a request refused while draining: at once, elsewhere
RETRY_ELSEWHERE_S = 1.0


class DrainHost(Protocol):
    """What a drain needs of its instance (``coordinator.runtime.instance.Instance``)."""

    machine: InstanceMachine
    clock: Callable[[], float]
    #: task id -> the channel of the request waiting for its events
    waiting: dict[str, trio.MemorySendChannel[TaskEvent]]

    #: its leases and queue: the releases in flight, the waits to end
    admissions: Admissions

    def apply(self, effects: list[Effect]) -> None: ...


class Drain:
    def __init__(self, host: DrainHost, window_s: float, *, settle_s: float = 0.0) -> None:
        self._host = host
        self.window_s = window_s
        #: once its nodes moved away, how long the instance stays listing them (core/drain.py)
        self.settle_s = settle_s
        self.plan = DrainPlan()
        self._wake = trio.Event()
        #: True once ``run`` returned with nothing cut short
        self.clean = False

    @property
    def ready(self) -> bool:
        return self.plan.ready

    @property
    def started(self) -> bool:
        return self.plan.began_at is not None

    def refusal(self) -> InstanceDraining | None:
        """The error a new request gets while draining (None: admitted)."""
        if self.plan.admits:
            return None
        return InstanceDraining(
            "this coordinator instance is draining (shutting down); retry on another instance",
            retry_after_s=RETRY_ELSEWHERE_S,
        )

    def accepts_nodes(self) -> bool:
        """A node connecting while draining is told to move before it is attached."""
        return self.plan.admits

    def begin(self) -> None:
        """The first SIGTERM (a second call: ``hurry``)."""
        first = not self.started
        self.plan.begin(self._host.clock(), self.window_s, settle_s=self.settle_s)
        if first:
            log.info(
                "draining: %d request(s) in flight, %d node(s) connected, up to %g s",
                len(self._host.waiting),
                len(self._host.machine.owner.nodes),
                self.window_s,
            )
            self._host.apply(self._host.machine.move_nodes(self._host.clock()))
        self._wake.set()

    def hurry(self) -> None:
        """A second signal: what is still in flight ends now (with the shutdown error)."""
        if not self.started:
            self.begin()
        self.plan.hurry(self._host.clock())
        self._wake.set()

    async def run(self) -> None:
        """Until the drain is done (``begin`` first): the window, then the end of the rest."""
        host = self._host
        while True:
            now = host.clock()
            step = self.plan.step(
                now,
                requests=len(host.waiting),
                nodes=len(host.machine.owner.nodes),
                releases=host.admissions.releasing,
            )
            if isinstance(step, Done):
                self.clean = step.clean
                began = self.plan.began_at or now
                log.info("drained in %.2f s%s", now - began, "" if step.clean else " (cut short)")
                return
            if isinstance(step, EndRemaining):
                self._end_remaining()
                continue
            with trio.move_on_at(min(step.until, now + POLL_S)):
                await self._wake.wait()
            self._wake = trio.Event()

    def _end_remaining(self) -> None:
        host = self._host
        if host.waiting or host.machine.owner.nodes:
            log.warning(
                "drain window over: ending %d request(s), moving %d node(s)",
                len(host.waiting),
                len(host.machine.owner.nodes),
            )
        # A queued request ends now rather than at its queue timeout.
        host.admissions.end_waits()
        error = InstanceShuttingDown(
            "the coordinator instance shut down before the task ended; retry on another instance",
            retry_after_s=RETRY_ELSEWHERE_S,
        )
        for channel in list(host.waiting.values()):
            try:
                channel.send_nowait(FailedEvent(error))
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        host.apply(host.machine.move_nodes(host.clock(), at_once=True))
