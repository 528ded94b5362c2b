"""What the admission machine (``machine.py``) decides: one small frozen class per
decision, and ``step_of``, the ticket's next step among them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from coordinator.core.placement.choose import NodeView
from coordinator.errors import GemmaNetError

__all__ = [
    "AskStore",
    "Decision",
    "Failed",
    "Granted",
    "Left",
    "MayHold",
    "Queued",
    "Step",
    "Ticket",
    "WaitUntil",
    "WaitWhy",
    "WakeLocal",
    "WakePeer",
    "step_of",
]

#: one ``Reserve``: (task id, attempt)
Ticket = tuple[str, int]


def lease_id_of(ticket: Ticket) -> str:
    """The lease id every ask of ``ticket`` names (the same for each, so asking again finds
    what an unanswered ask was granted, and the request can give it back unheard)."""
    return f"{ticket[0]}.{ticket[1]}"


WaitWhy = Literal["poll", "queue_deadline", "gone_retry", "store_retry"]


@dataclass(frozen=True, slots=True)
class AskStore:
    """Ask the store for a lease for ``model`` on one of ``candidates`` (best first); then
    ``answer``, ``timed_out`` or ``unreachable``. ``again``: an earlier ask of this attempt got
    no answer (it may hold a lease that this ask must find: ``LeaseAsk.again``)."""

    ticket: Ticket
    model: str
    candidates: tuple[NodeView, ...]
    again: bool = False


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Wait until ``at``, then ``waited``. ``why``: the next poll of the first local waiter,
    the queue deadline (only a wake comes sooner), the next look after every candidate went
    away or the backoff after a timeout (neither cut short by a wake)."""

    ticket: Ticket
    at: float
    why: WaitWhy

    @property
    def wakeable(self) -> bool:
        return self.why not in ("gone_retry", "store_retry")


@dataclass(frozen=True, slots=True)
class Granted:
    """The lease on ``view``'s node is the request's (``InstanceMachine.reserved``)."""

    ticket: Ticket
    view: NodeView
    lease_id: str


@dataclass(frozen=True, slots=True)
class Failed:
    """No lease (``InstanceMachine.reserve_failed``); ``reason`` labels the denial metric."""

    ticket: Ticket
    error: GemmaNetError
    reason: str


@dataclass(frozen=True, slots=True)
class Queued:
    """The store queued the request (``position`` requests ahead): it holds a queue entry now
    (``Requester.waiting``) and was denied for want of room."""

    ticket: Ticket
    position: int


@dataclass(frozen=True, slots=True)
class MayHold:
    """An ask of the ticket got no answer: the store may hold a queue entry (or an active-set
    entry) for the request, which it must give back when it ends (``Requester.waiting``), and
    a lease (the ticket's ``lease_id_of``) on one of ``nodes``, the nodes that ask named that
    no earlier ``MayHold`` of the ticket did (``Requester.may_hold_lease``)."""

    ticket: Ticket
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WakeLocal:
    """Cut short the wait of this instance's ``ticket`` (or, if it is not waiting, the next
    one it starts)."""

    ticket: Ticket


@dataclass(frozen=True, slots=True)
class WakePeer:
    """Tell ``instance_id`` that its first waiter for ``model`` may try again (``BusWake``)."""

    instance_id: str
    model: str


@dataclass(frozen=True, slots=True)
class Left:
    """The ticket left the local queue; ``queued_for``: how long it had waited in the shared
    queue (None: never queued)."""

    ticket: Ticket
    queued_for: float | None


Step = AskStore | WaitUntil | Granted | Failed
Decision = Step | Queued | MayHold | WakeLocal | WakePeer | Left


def step_of(decisions: Sequence[Decision]) -> Step | None:
    """The ticket's next step among ``decisions`` (None: the attempt is over)."""
    steps = [d for d in decisions if isinstance(d, AskStore | WaitUntil | Granted | Failed)]
    assert len(steps) <= 1, steps
    return steps[0] if steps else None
