"""What every invariant of the simulator is (``sim/invariants.py`` lists them): a watcher of the
trace that raises ``Violation`` at the virtual time of the offending event."""

from __future__ import annotations

from typing import NoReturn

from sim.trace import Event

__all__ = ["Invariant", "Violation"]


class Violation(Exception):
    def __init__(self, invariant: str, message: str, t: float) -> None:
        super().__init__(f"[{invariant}] at t={t:.6f}: {message}")
        self.invariant, self.message, self.t = invariant, message, t


class Invariant:
    name = "invariant"

    def observe(self, event: Event) -> None: ...

    def at_end(self, t: float) -> None: ...

    def fail(self, message: str, t: float) -> NoReturn:
        raise Violation(self.name, message, t)
