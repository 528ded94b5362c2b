"""Admission: what a request waiting for a capacity lease does next, and when it gives up.

Pure, in the manner of h11's ``Connection``: events go in with ``now``, decisions come out, and
nothing here sleeps or reads a clock. Where the request has to wait, the machine says until when
(``WaitUntil``) and whether a wake may cut the wait short; the shell
(``runtime/requests/admission.py``) sleeps, asks the store, and feeds what happened back in. The machine test harness drives the
very same object synchronously.

One ``AdmissionMachine`` per instance holds every request of that instance waiting for a lease,
one *ticket* (task id, attempt) per ``Reserve``: a request's decisions depend on the instance's
other waiters for the same model (only the first of them polls, a wake goes to the first, one
not first passes a wake on, the first leaving wakes the next), so one object keeps that order
and each request's own state together, and no decision has to be made in the shell.

Under the fair queue (``fair``; ``coordination/leases.py``, *The queue's order*) the store's
head is the oldest request of the key whose turn it is, seldom this instance's first waiter:
a waiter told it is not the head wakes the local waiter the store names as head
(``Admission.head``) instead of passing the wake down the line (which would walk the whole
local queue, one ask each, to reach it), and the head polls too. A wake still goes to the first
waiter; its answer names the head, so a grant costs about two asks whatever the keys.

Events: ``start`` (the request's candidates), ``answer`` (the store's ``Admission``),
``timed_out`` (the store did not answer in time: slow, maybe not down), ``unreachable`` (it
refused the connection or closed it: down), ``wake``/``wake_local`` (a wake for a model came),
``waited`` (the wait asked for is over: its time came, or a wake cut it short), ``ended`` (the
request stopped waiting: its client left). Each returns a list of decisions, with at most one
next step for the ticket (``AskStore``, ``WaitUntil``, ``Granted``, ``Failed``; none: the attempt
is over, the request ended meanwhile) and around it ``Queued``, ``MayHold``, ``WakeLocal``,
``WakePeer`` and ``Left`` (the ticket left the local queue, with how long it waited in the
shared one).

The policy: ask at once; when the store queues the request, wait for a wake, the first local
waiter of the model re-asking every ``POLL_S`` too (pub/sub is at-most-once, a wake may be
lost); when every candidate went away (a view a beat old, facts the store lost), look again
every ``GONE_RETRY_S`` for at most ``GONE_GIVE_UP_S``; after the queue timeout fail with
``503 all_nodes_busy``; stale facts, an unreachable store, the key limit and a full queue fail
at once (nothing is placed on a guess).

A slow store costs latency, never an error: an ask that timed out is made again after a backoff
(``retries.py``) until the store was silent for ``store_outage_s`` (``core/liveness.py``)
or the queue deadline passed; a refused or closed connection fails at once. Asking again is safe
(``LeaseAsk.again``); what an unanswered ask may have left is given back at the end (``MayHold``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.core.admission.decisions import (
    AskStore,
    Decision,
    Failed,
    Granted,
    Left,
    MayHold,
    Queued,
    Step,
    Ticket,
    WaitUntil,
    WaitWhy,
    WakeLocal,
    WakePeer,
    step_of,
)
from coordinator.core.admission.errors import facts_missing, refusal, timed_out
from coordinator.core.admission.retries import store_retry_in
from coordinator.core.placement.choose import NodeView
from coordinator.core.requests.attempts import no_node_serves
from coordinator.errors import CoordinationDown, GemmaNetError

__all__ = [
    "GONE_GIVE_UP_S",
    "GONE_RETRY_S",
    "POLL_S",
    "AdmissionMachine",
    "AskStore",
    "Decision",
    "Failed",
    "Granted",
    "Left",
    "MayHold",
    "Queued",
    "Step",
    "StoreAnswer",
    "Ticket",
    "WaitUntil",
    "WakeLocal",
    "WakePeer",
    "step_of",
]

#: the first waiter of a model on this instance re-checks this often (a wake may be lost)
POLL_S = 1.0
#: a request whose candidates all went away (a view a beat old, or facts the store lost and
#: their owners are writing again) looks again after this long, for at most GONE_GIVE_UP_S
GONE_RETRY_S = 0.25
GONE_GIVE_UP_S = 3.0


class StoreAnswer(Protocol):
    """What the machine reads of the store's answer to one admission (``leases.Admission``;
    typed here by shape, since the core does not import the coordination layer)."""

    @property
    def outcome(self) -> str: ...
    @property
    def node_id(self) -> str: ...
    @property
    def conn_id(self) -> str: ...
    @property
    def lease_id(self) -> str: ...
    @property
    def position(self) -> int: ...
    @property
    def refusals(self) -> Mapping[str, str]: ...
    @property
    def next_in_queue(self) -> str: ...
    @property
    def head(self) -> str: ...


# -- the machine ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    model: str
    queue_until: float
    #: set at the first answer that every candidate went away; never reset (the give-up bound
    #: holds for the whole wait)
    gone_until: float | None = None
    queued_at: float | None = None
    #: the candidates of the ask in flight (a grant names one of them)
    candidates: tuple[NodeView, ...] = ()
    #: a wake came that no wakeable wait has consumed yet
    woken: bool = False
    #: the ask in flight follows a wake (if the store says it is not first after all, the
    #: wake may be meant for a later local waiter: asks can overtake each other on the way)
    asked_after_wake: bool = False
    waiting: WaitUntil | None = None
    #: when the ask in flight was sent; when the current run of unanswered asks began (None:
    #: answered since) and its length; whether any went unanswered (later asks are ``again``)
    asked_at: float = 0.0
    silent_since: float | None = None
    timeouts: int = 0
    unanswered: bool = False
    #: the nodes an unanswered ask named (a lease on one of them may exist unheard of)
    maybe_on: set[str] = field(default_factory=set)


class AdmissionMachine:
    def __init__(
        self,
        me: str,
        *,
        queue_timeout_s: float,
        queue_max: int,
        max_active_per_key: int,
        store_outage_s: float,
        fair: bool = False,
    ) -> None:
        self.me = me
        # The fair queue: a wake is passed to the head the store names, not down the line.
        self._fair = fair
        self._queue_timeout_s = queue_timeout_s
        self._store_outage_s = store_outage_s
        self._queue_max = queue_max
        self._max_active_per_key = max_active_per_key
        self._waiters: dict[Ticket, _Waiter] = {}
        # Per model, this instance's waiting tickets in arrival order: registered before the
        # first ask, and this instance's asks reach the store in the order they are sent, so
        # local order is the shared queue's order.
        self._by_model: dict[str, list[_Waiter]] = {}

    # -- events -----------------------------------------------------------------------------

    def start(
        self, ticket: Ticket, model: str | None, candidates: Sequence[NodeView] | None, now: float
    ) -> list[Decision]:
        """A ``Reserve``: ``candidates`` as ``Requester.candidates`` gives them now (None, or no
        model: the request ended meanwhile). Nothing (and nothing registered) for a ticket
        already waiting: each ``Reserve`` is carried out once."""
        if model is None or candidates is None or ticket in self._waiters:
            return []
        waiter = _Waiter(ticket, model, queue_until=now + self._queue_timeout_s)
        self._waiters[ticket] = waiter
        self._by_model.setdefault(model, []).append(waiter)
        return self._ask(waiter, candidates, now)

    def answer(self, ticket: Ticket, admission: StoreAnswer, now: float) -> list[Decision]:
        """The store's answer to the ticket's ask."""
        waiter = self._waiters.get(ticket)
        if waiter is None:
            return []
        model, outcome = waiter.model, admission.outcome
        waiter.silent_since, waiter.timeouts = None, 0
        decisions: list[Decision] = []
        if outcome == "granted":
            if admission.next_in_queue == self.me and self._fair:
                decisions += self._wake_head(model, admission.head)
            elif admission.next_in_queue:
                decisions += self.wake(model, admission.next_in_queue)
            view = next(
                v
                for v in waiter.candidates
                if v.node_id == admission.node_id and v.conn_id == admission.conn_id
            )
            decisions.append(Granted(ticket, view, admission.lease_id))
            return decisions + self._leave(waiter, now)
        if outcome == "queued":
            waiter.queued_at = now if waiter.queued_at is None else waiter.queued_at
            decisions.append(Queued(ticket, admission.position))
            if self._fair and admission.position > 0:
                decisions += self._wake_head(model, admission.head)
            elif waiter.asked_after_wake and admission.position > 0:
                decisions += self._pass_wake(waiter)
        elif outcome != "refused" or "stale" in admission.refusals.values():
            reason = outcome if outcome != "refused" else "stale_facts"
            error = refusal(
                model,
                outcome,
                admission.refusals,
                queue_max=self._queue_max,
                max_active_per_key=self._max_active_per_key,
            )
            return decisions + self._fail(waiter, error, reason, now)
        if now >= waiter.queue_until:
            error = timed_out(model, self._queue_timeout_s)
            return decisions + self._fail(waiter, error, "queue_timeout", now)
        if outcome == "refused":  # every candidate went away: look again
            if waiter.gone_until is None:
                waiter.gone_until = now + GONE_GIVE_UP_S
            if now >= waiter.gone_until:
                error = facts_missing(model)
                return decisions + self._fail(waiter, error, "facts_missing", now)
            return [*decisions, self._wait(waiter, now + GONE_RETRY_S, "gone_retry")]
        first = self._by_model[model][0] is waiter or (self._fair and admission.position == 0)
        if first and now + POLL_S < waiter.queue_until:
            return [*decisions, self._wait(waiter, now + POLL_S, "poll")]
        return [*decisions, self._wait(waiter, waiter.queue_until, "queue_deadline")]

    def unreachable(self, ticket: Ticket, now: float) -> list[Decision]:
        """The store refused the connection or closed it (down, not slow): fail closed."""
        waiter = self._waiters.get(ticket)
        if waiter is None:
            return []
        error = CoordinationDown(
            "capacity cannot be reserved while the coordination store is unreachable; "
            "retry after the Retry-After delay"
        )
        return self._fail(waiter, error, "coordination_unavailable", now)

    def timed_out(
        self, ticket: Ticket, now: float, silent_for_s: float | None = None
    ) -> list[Decision]:
        """The store did not answer the ask in time (slow, maybe not down; the ask may still
        land: asking again is safe); ``silent_for_s``: how long it answered nobody (None: not
        known). Ask again after a backoff until the store was silent for ``store_outage_s``
        (never counted from before this ticket's first unanswered ask; a store that answers
        others is slow, not gone) or the queue deadline passed; then fail closed."""
        waiter = self._waiters.get(ticket)
        if waiter is None:
            return []
        # Said once per node: a re-ask after a wake or a new view may name other candidates.
        nodes = tuple(v.node_id for v in waiter.candidates if v.node_id not in waiter.maybe_on)
        waiter.maybe_on.update(nodes)
        said = waiter.unanswered and not nodes
        decisions: list[Decision] = [] if said else [MayHold(ticket, nodes)]
        waiter.unanswered, waiter.timeouts = True, waiter.timeouts + 1
        if waiter.silent_since is None:
            waiter.silent_since = waiter.asked_at
        since = waiter.silent_since
        if silent_for_s is not None:
            since = max(since, now - silent_for_s)
        give_up_at = min(since + self._store_outage_s, waiter.queue_until)
        delay = store_retry_in(waiter.timeouts, now, give_up_at, f"{ticket[0]}.{ticket[1]}")
        if delay is None:
            silent = now - since
            error = CoordinationDown(
                f"capacity cannot be reserved: the coordination store did not answer for "
                f"{silent:.1f} s; retry after the Retry-After delay"
            )
            return decisions + self._fail(waiter, error, "coordination_unavailable", now)
        return [*decisions, self._wait(waiter, now + delay, "store_retry")]

    def waited(
        self, ticket: Ticket, candidates: Sequence[NodeView] | None, now: float
    ) -> list[Decision]:
        """The ticket's wait is over (its time came, or a wake cut it short); ``candidates`` as
        the requester gives them now (None: the request ended meanwhile)."""
        waiter = self._waiters.get(ticket)
        if waiter is None:
            return []
        wait, waiter.waiting = waiter.waiting, None
        if wait is not None and wait.wakeable:
            waiter.asked_after_wake, waiter.woken = waiter.woken, False
        elif wait is not None and wait.why == "store_retry":
            pass  # the same ask once more: it follows a wake if the one that timed out did
        else:
            # A wake during a look after every candidate went away is kept for the next
            # wakeable wait, which it then ends at once.
            waiter.asked_after_wake = False
        if candidates is None:
            return self._leave(waiter, now)
        return self._ask(waiter, candidates, now)

    def ended(self, ticket: Ticket, now: float) -> list[Decision]:
        """The ticket stopped waiting, whatever it was doing (its client left)."""
        waiter = self._waiters.get(ticket)
        return [] if waiter is None else self._leave(waiter, now)

    def wake_local(self, model: str) -> list[Decision]:
        """Capacity may be free for ``model``: this instance's first waiter tries again."""
        waiters = self._by_model.get(model)
        return self._woken(waiters[0]) if waiters else []

    def wake(self, model: str, instance_id: str) -> list[Decision]:
        """``instance_id``'s first waiter for ``model`` is first in the shared queue: wake it."""
        if instance_id == self.me:
            return self.wake_local(model)
        return [WakePeer(instance_id, model)]

    # -- views ------------------------------------------------------------------------------

    def queued(self) -> dict[str, int]:
        """This instance's waiting requests per model."""
        return {model: len(waiters) for model, waiters in sorted(self._by_model.items())}

    def waiting(self) -> list[WaitUntil]:
        """The waits in progress, in arrival order per model."""
        return [
            w.waiting
            for waiters in self._by_model.values()
            for w in waiters
            if w.waiting is not None
        ]

    # -- helpers ----------------------------------------------------------------------------

    def _ask(self, waiter: _Waiter, candidates: Sequence[NodeView], now: float) -> list[Decision]:
        if not candidates:
            return self._fail(waiter, no_node_serves(waiter.model), "no_node", now)
        waiter.candidates = tuple(candidates)
        waiter.asked_at = now
        return [AskStore(waiter.ticket, waiter.model, waiter.candidates, waiter.unanswered)]

    def _wait(self, waiter: _Waiter, at: float, why: WaitWhy) -> WaitUntil:
        waiter.waiting = WaitUntil(waiter.ticket, at, why)
        return waiter.waiting

    def _woken(self, waiter: _Waiter) -> list[Decision]:
        waiter.woken = True
        return [WakeLocal(waiter.ticket)]

    def _pass_wake(self, waiter: _Waiter) -> list[Decision]:
        waiters = self._by_model.get(waiter.model, [])
        index = waiters.index(waiter)
        return self._woken(waiters[index + 1]) if index + 1 < len(waiters) else []

    def _fail(
        self, waiter: _Waiter, error: GemmaNetError, reason: str, now: float
    ) -> list[Decision]:
        return [Failed(waiter.ticket, error, reason), *self._leave(waiter, now)]

    def _leave(self, waiter: _Waiter, now: float) -> list[Decision]:
        del self._waiters[waiter.ticket]
        queued_for = None if waiter.queued_at is None else now - waiter.queued_at
        decisions: list[Decision] = [Left(waiter.ticket, queued_for)]
        waiters = self._by_model[waiter.model]
        was_first = waiters[0] is waiter
        waiters.remove(waiter)
        if not waiters:
            del self._by_model[waiter.model]
        elif was_first:
            decisions += self._woken(waiters[0])  # the next local waiter may be first now
        return decisions

    def _wake_head(self, model: str, head: str) -> list[Decision]:
        """Fair order: wake the local waiter that is the store's ``head``, if it waits here."""
        waiters = self._by_model.get(model, [])
        found = next((w for w in waiters if w.ticket[0] == head), None)
        return self._woken(found) if found is not None else []
