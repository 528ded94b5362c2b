"""The drain of one instance (SIGTERM): when to refuse, when to end what remains, when to go.

A pure state machine on the time it is given (the shell, ``runtime/drain.py``, carries out
what it says; docs/operations.md tells the sequence to operators)::

    serving ──begin(now, window)──> draining ──window over──> ending ──> done
                                       │                        ^
                                       └── nothing left ────────┴──> done

* serving: ready (``/readyz`` 200), requests admitted.
* draining: not ready, new requests refused (``instance_draining``), nodes told to move as
  their tasks end; requests in flight run on until they end or the window is over.
* ending: the window is over (or a second signal cut it short): every request still in flight
  ends with ``instance_shutting_down`` (a stream's last event says so), every node still here
  is told to move; the requests get ``ENDING_BOUND_S`` to write their last event and give
  back their leases.
* done: the HTTP server may stop; the instance leaves the registry.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

__all__ = ["ENDING_BOUND_S", "Done", "DrainPhase", "DrainPlan", "EndRemaining", "Wait"]

#: after the window, how long the requests that remain get to write their last event and give
#: back their leases (their ends are prompt; this only bounds a store that does not answer)
ENDING_BOUND_S = 2.0


class DrainPhase(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    ENDING = "ending"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do before ``until`` unless the counts change."""

    until: float


@dataclass(frozen=True, slots=True)
class EndRemaining:
    """The window is over: end every request in flight (``instance_shutting_down``) and tell
    every node still connected to move."""


@dataclass(frozen=True, slots=True)
class Done:
    """Stop serving HTTP; leave the cluster. ``clean``: nothing was left in flight."""

    clean: bool


DrainStep = Wait | EndRemaining | Done


class DrainPlan:
    """One instance's drain. ``begin`` once (a second call hurries), then ``step`` whenever
    the counts may have changed or the time it named has come."""

    def __init__(self) -> None:
        self.phase = DrainPhase.SERVING
        self.began_at: float | None = None
        #: when requests in flight stop being waited for
        self.deadline = math.inf
        self._ending_until = math.inf
        self._forced = False
        #: how long to stay once the last node moved away (``begin``)
        self._settle_s = 0.0
        self._had_nodes = False
        self._idle_since: float | None = None

    @property
    def ready(self) -> bool:
        """Whether a load balancer should send requests here (``/readyz``)."""
        return self.phase is DrainPhase.SERVING

    @property
    def admits(self) -> bool:
        """Whether a new request may begin."""
        return self.phase is DrainPhase.SERVING

    def begin(self, now: float, window_s: float, *, settle_s: float = 0.0) -> None:
        """The first SIGTERM: drain for at most ``window_s``. Called again (a second signal),
        the window ends now. ``settle_s``: once nodes moved away, stay (in the registry,
        listing them as moving) this long, so peers read their new instance before this one
        stops listing them (within the window)."""
        if self.phase is DrainPhase.SERVING:
            self.phase = DrainPhase.DRAINING
            self.began_at = now
            self.deadline = now + max(0.0, window_s)
            self._settle_s = max(0.0, settle_s)
        else:
            self.hurry(now)

    def hurry(self, now: float) -> None:
        """Stop at once: what is still in flight ends now (with the shutdown error)."""
        if self.phase is DrainPhase.SERVING:
            self.begin(now, 0.0)
        elif self.phase is DrainPhase.DRAINING:
            self.deadline = min(self.deadline, now)

    def step(self, now: float, *, requests: int, nodes: int, releases: int) -> DrainStep:
        """What to do now, given what is still here: ``requests`` in flight on this instance,
        ``nodes`` connected to it, lease ``releases`` not yet answered by the store."""
        if self.phase is DrainPhase.SERVING:
            return Wait(math.inf)
        if self.phase is DrainPhase.DRAINING:
            self._had_nodes = self._had_nodes or nodes > 0
            if requests == 0 and nodes == 0 and releases == 0:
                if self._idle_since is None:
                    self._idle_since = now
                settled_at = self._idle_since + (self._settle_s if self._had_nodes else 0.0)
                if now >= min(settled_at, self.deadline):
                    self.phase = DrainPhase.DONE
                    return Done(clean=True)
                return Wait(min(settled_at, self.deadline))
            self._idle_since = None
            if now >= self.deadline:
                self.phase = DrainPhase.ENDING
                self._ending_until = now + ENDING_BOUND_S
                self._forced = requests > 0 or nodes > 0
                return EndRemaining()
            return Wait(self.deadline)
        if self.phase is DrainPhase.ENDING:
            if (requests == 0 and releases == 0) or now >= self._ending_until:
                self.phase = DrainPhase.DONE
                return Done(clean=not self._forced and requests == 0)
            return Wait(self._ending_until)
        return Done(clean=not self._forced)
