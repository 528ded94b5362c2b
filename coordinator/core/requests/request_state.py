"""A request's lifecycle: its states, the moves allowed between them, and the requester's record.

One request goes through one placement attempt after another until it ends::

    ADMITTING ──► QUEUED ──► DISPATCHING ──► ASSIGNED ──► ACCEPTED ──► STREAMING ──► ENDED
        │            │            ▲
        └────────────┴────────────┘   (a lease granted at once, without waiting)

and from any placement back to ADMITTING when the task never ran on its node (the assign
reached nobody, the owner refused it, the node turned it down as busy), or on to ENDED at any
point. ``TRANSITIONS`` lists every move; ``Request.move`` checks each one and raises
``IllegalTransition`` on any other, so a requester that loses track of a request fails loudly
instead of answering it twice or never.

There is no resting "leased" state: the requester sends the assign the moment its lease is
granted, so a lease is held exactly from DISPATCHING until the placement ends. Answers may
overtake the dispatch's own report (they come on the subscription while the PUBLISH reply is
still on its way), so whether that report is still due is a fact of the request beside its
state (``report_due``), not a state of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from coordinator.core.placement.affinity import PrefixPrediction
from protocol import Assign


class RequestState(enum.Enum):
    #: asking the shared store for a lease for this placement attempt
    ADMITTING = "admitting"
    #: no candidate had room: waiting in the shared admission queue for one
    QUEUED = "queued"
    #: leased; the assign is on its way to the node's owner and nobody has answered yet
    DISPATCHING = "dispatching"
    #: the owner received the assign (its dispatch reported back), nothing more is known
    ASSIGNED = "assigned"
    #: the owner handed it to the node: from now on a dead owner means a lost task (502)
    ACCEPTED = "accepted"
    #: a chunk came: the node runs it
    STREAMING = "streaming"
    #: answered, failed, or given up by its client: forgotten, its store entries given back
    ENDED = "ended"


S = RequestState

#: state -> the states a request may move to from it (a move to the same state is no move)
TRANSITIONS: Mapping[RequestState, frozenset[RequestState]] = {
    # waiting: no room yet; reserved: a lease at once; reserve_failed, ended
    S.ADMITTING: frozenset({S.QUEUED, S.DISPATCHING, S.ENDED}),
    # reserved; reserve_failed (queue timeout), ended; ADMITTING: the late report that the
    # assign of the placement before, which its node had turned down as busy meanwhile,
    # reached nobody (``PlacementAttempts.unreached`` still takes it: another attempt starts)
    S.QUEUED: frozenset({S.DISPATCHING, S.ENDED, S.ADMITTING}),
    # dispatched; accepted or a chunk before the report; unreached, refused, busy: placed
    # again; the report that the bus failed, an answer, a dead owner's report, ended
    S.DISPATCHING: frozenset({S.ASSIGNED, S.ACCEPTED, S.STREAMING, S.ADMITTING, S.ENDED}),
    # accepted; a chunk (the accept is still on its way); refused, busy, its owner died before
    # confirming: placed again; answered or lost
    S.ASSIGNED: frozenset({S.ACCEPTED, S.STREAMING, S.ADMITTING, S.ENDED}),
    # a chunk; busy before any output: placed again; answered or lost
    S.ACCEPTED: frozenset({S.STREAMING, S.ADMITTING, S.ENDED}),
    # answered or lost; ADMITTING only when its owner contradicts its node (a refusal of a
    # task the node streamed), which the requester takes at the owner's word
    S.STREAMING: frozenset({S.ENDED, S.ADMITTING}),
    S.ENDED: frozenset(),
}

#: the states in which a placement is under way: a lease is held and the tracker knows the task
PLACED = frozenset({S.DISPATCHING, S.ASSIGNED, S.ACCEPTED, S.STREAMING})
#: the owner handed the task to its node: a dead owner now means a lost task, not one to move
HANDED_TO_NODE = frozenset({S.ACCEPTED, S.STREAMING})


class IllegalTransition(RuntimeError):
    """The requester moved a request in a way its lifecycle does not allow: a bug."""


def check_transition(old: RequestState, new: RequestState) -> None:
    """Raise ``IllegalTransition`` unless ``old`` may move to ``new``."""
    if new is not old and new not in TRANSITIONS[old]:
        raise IllegalTransition(f"a request cannot go from {old.name} to {new.name}")


@dataclass
class Request:
    """What the requester keeps of one request while it lasts."""

    assign: Assign
    deadline: float
    key_id: str = ""
    state: RequestState = RequestState.ADMITTING
    #: placements made so far (each one sent the assign to a node)
    placements: int = 0
    #: the lease attempt in progress (each placement takes a new lease)
    attempt: int = 0
    #: (node id, lease id) and the models of that node, while a lease is held
    lease: tuple[str, str] | None = None
    lease_models: tuple[str, ...] = ()
    #: it waited in the admission queue at some point (or an ask of it went unanswered): when
    #: it ends, whatever entry it may still have there is removed and the model's next waiter
    #: woken (so this outlasts QUEUED)
    may_hold_queue_entry: bool = False
    #: (node id, lease id) of leases an unanswered ask may have been granted (``MayHold``):
    #: given back with what it holds when it ends or goes on elsewhere
    maybe_leases: set[tuple[str, str]] = field(default_factory=set)
    # Connections that turned this task down as full, and instances it could not reach.
    full: set[str] = field(default_factory=set)
    gone_conns: set[str] = field(default_factory=set)
    gone_instances: set[str] = field(default_factory=set)
    #: the dispatch of the latest placement has not reported back yet: whether anybody
    #: received the assign is not known. Answers can overtake that report, so this may
    #: outlast DISPATCHING; the report decides what a dead owner means meanwhile.
    report_due: bool = False
    #: the owner was declared dead while the report was due: the report decides the outcome
    owner_died_meanwhile: bool = False
    #: which nodes are predicted to hold how much of its prefix (None: rank by load alone)
    prediction: PrefixPrediction | None = None

    def move(self, new: RequestState) -> None:
        """Go to ``new``, if the lifecycle allows it (else ``IllegalTransition``)."""
        check_transition(self.state, new)
        self.state = new
