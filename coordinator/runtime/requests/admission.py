"""Capacity leases and the shared admission queue, the shell's side.

The requester machine asks for a lease (``Reserve``) and gives back what a request held
(``ReleaseLease``); this module carries both out against the shared store
(the ``Leases`` role's ``admit`` / ``release``, semantics in ``coordination/leases.py``):

* ``reserve`` carries out what the admission machine (``core/admission/machine.py``) decides for the
  request: it asks the store, sleeps until the time the machine names (a wake for the model
  cuts a wait short, ``BusWake`` from a peer or a local release), pokes the local waiters and
  tells the peers it names, and feeds every outcome back in. Whether to queue, poll, look again
  or give up, and in which order local waiters go, is the machine's. A client that leaves
  stops waiting at once (the task is cancelled; the machine hears ``ended``).
* ``release`` runs in the background, off the answer's path, and wakes the next in line.
* ``renew`` keeps the leases of long tasks alive; a dead instance's leases heal by their TTL.
* A store call that times out (``CoordinationTimeout``: slow, not known down) is reported to
  the machine (``timed_out``), which has it made again after a backoff until the store has
  been silent for ``Settings.store_outage_s``; a refused or closed connection is reported as
  ``unreachable`` and fails closed at once (``503 coordination_unavailable``). A call that
  hangs past ``ADMIT_GIVE_UP_S`` counts as timed out.
* Neither a release nor a renewal that fails ever fails a task in flight: a release is made
  again in the background (``release_retry_in``), a renewal soon after a failure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio

from coordinator.coordination import CoordinationUnavailable, Leases, keys
from coordinator.coordination.keys import rate_limit_key
from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    RateAsk,
)
from coordinator.core.admission.decisions import lease_id_of
from coordinator.core.admission.machine import (
    AdmissionMachine,
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
    WakeLocal,
    WakePeer,
    step_of,
)
from coordinator.core.admission.retries import release_retry_in
from coordinator.core.effects import Effect, ReleaseLease, Reserve
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.placement.choose import NodeView
from coordinator.errors import CoordinationTimeout, InstanceShuttingDown
from coordinator.runtime.cluster.bus_outbox import BusOutbox
from coordinator.runtime.metrics import Metrics, priority_class
from coordinator.runtime.requests.rate_limit import RateCharge, rate_limited
from coordinator.settings import Settings
from protocol import BusWake

log = logging.getLogger("gemmanet.admission")

SHUT_DOWN_MESSAGE = (
    "the coordinator instance shut down before a node was free; retry on another instance"
)

#: queue and active-set entries of an instance silent this long stop counting
REQUESTER_STALE_S = 10.0
WAKE_GIVE_UP_S = 2.0
#: one store call's bound (a store that hangs must not hold a request, nor a shutdown)
ADMIT_GIVE_UP_S = 5.0
#: after a renewal that failed, the next one comes this soon (not a third of the TTL later)
RENEW_RETRY_S = 1.0


def admission_rules(
    *,
    residency_stale_s: float,
    lease_ttl_s: float,
    queue_max: int,
    max_active_per_key: int,
    queue_policy: str = "fair",
) -> AdmissionRules:
    return AdmissionRules(
        presence_registry=keys.PRESENCE,
        facts_stale_s=residency_stale_s,
        requester_stale_s=REQUESTER_STALE_S,
        lease_ttl_s=lease_ttl_s,
        queue_max=queue_max,
        max_active_per_key=max_active_per_key,
        queue_policy="fifo" if queue_policy == "fifo" else "fair",
    )


class Admissions:
    def __init__(
        self,
        settings: Settings,
        coordination: Leases,
        machine: InstanceMachine,
        outbox: BusOutbox,
        clock: Callable[[], float],
        metrics: Metrics,
    ) -> None:
        self.me = settings.instance_id
        self._metrics = metrics
        self._settings = settings
        self._coordination = coordination
        self._machine = machine
        self._outbox = outbox
        self._clock = clock
        self.rules = admission_rules(
            residency_stale_s=settings.residency_stale_s,
            lease_ttl_s=settings.lease_ttl_s,
            queue_max=settings.queue_max,
            max_active_per_key=settings.max_active_per_key,
            queue_policy=settings.queue_policy,
        )
        # API key id -> its weight in the fair queue, as its last authenticated request had it
        # (the operator file's priority for its name, else the key's own; ``note_key``).
        self._weights: dict[str, int] = {}
        self.waiters = AdmissionMachine(
            self.me,
            queue_timeout_s=settings.queue_timeout_s,
            queue_max=settings.queue_max,
            max_active_per_key=settings.max_active_per_key,
            store_outage_s=settings.store_outage_s,
            fair=settings.queue_policy == "fair",
        )
        # Per waiting ticket, what cuts its wait short: set when the machine records a wake for
        # it (``WakeLocal``), renewed when a wakeable wait ends (the machine consumes the wake
        # then too), so a wake that came while it was asking or looking again after every
        # candidate went away ends its next wakeable wait at once, as the machine expects.
        self._wakes: dict[Ticket, trio.Event] = {}
        # Per waiting ticket, its key's priority class (the queue wait by priority's label).
        self._priorities: dict[Ticket, str] = {}
        #: per priority class, the requests that waited in the shared queue and their total
        #: wait (the System Health page's queue wait by key class; at most five entries)
        self.waited_by_priority: dict[str, tuple[int, float]] = {}
        self.lost_leases = 0
        #: releases not yet answered by the store (a drain waits for them)
        self.releasing = 0
        # The queue waits under way (``_wait``) and whether a drain ended them all
        # (``end_waits``): the only waits a drain's window cuts short, so a request that is
        # granted at once pays for no cancel scope of the drain's.
        self._waits: set[trio.CancelScope] = set()
        self.waits_ended = False
        #: task id -> its request's rate limit, counted by its first answered ask
        #: (``TaskRequests._place`` puts it here while the request is being placed)
        self.rate_charges: dict[str, RateCharge] = {}

    # -- taking a lease ---------------------------------------------------------------------

    def note_key(self, key_id: str, name: str, priority: int) -> None:
        """An authenticated request of this API key: its weight in the fair queue is the
        operator file's priority for its name, else the key's own."""
        weight = self._settings.capacity.key_priorities.get(name, priority)
        self._weights[key_id] = min(max(int(weight), 1), 100)  # a hand-edited row stays usable

    def weight_of(self, key_id: str) -> int:
        return self._weights.get(key_id, 1)

    async def reserve(self, effect: Reserve) -> list[Effect]:
        """Take a lease for the task, waiting for room; the machine's effects that follow."""
        ticket = (effect.task_id, effect.attempt)
        model = self._machine.requester.model_of(effect.task_id)
        key = self._machine.requester.key_of(effect.task_id)
        decisions = self.waiters.start(ticket, model, self._candidates(effect), self._clock())
        if not decisions:
            return []  # the request ended meanwhile
        self._wakes[ticket] = trio.Event()
        self._priorities[ticket] = priority_class(self.weight_of(key))
        try:
            while True:
                step = self._carry_out(decisions)
                if isinstance(step, AskStore):
                    admission = await self._admit(effect, step)
                    if isinstance(admission, Admission) and admission.outcome == "rate_limited":
                        limit, period = self._settings.rate_limit
                        limited = rate_limited(limit, period, admission.retry_after_s)
                        return self._machine.reserve_failed(
                            effect.task_id, effect.attempt, limited, self._clock()
                        )
                    if isinstance(admission, CoordinationTimeout):
                        silent_for = admission.silent_for_s
                        decisions = self.waiters.timed_out(ticket, self._clock(), silent_for)
                    elif isinstance(admission, CoordinationUnavailable):
                        decisions = self.waiters.unreachable(ticket, self._clock())
                    else:
                        decisions = self.waiters.answer(ticket, admission, self._clock())
                elif isinstance(step, WaitUntil):
                    if not self.waits_ended:
                        await self._wait(step)
                    if self.waits_ended:  # a drain's window ended: no lease for it here
                        error = InstanceShuttingDown(SHUT_DOWN_MESSAGE, retry_after_s=1.0)
                        return self._machine.reserve_failed(
                            effect.task_id, effect.attempt, error, self._clock()
                        )
                    decisions = self.waiters.waited(ticket, self._candidates(effect), self._clock())
                elif isinstance(step, Granted):
                    self._metrics.lease_grants.inc()
                    return self._machine.reserved(
                        effect.task_id, effect.attempt, step.view, step.lease_id, self._clock()
                    )
                elif isinstance(step, Failed):
                    self._metrics.lease_denials_of(step.reason).inc()
                    return self._machine.reserve_failed(
                        effect.task_id, effect.attempt, step.error, self._clock()
                    )
                else:
                    return []  # the request ended meanwhile
        finally:
            # A no-op unless the wait was cut short from outside (the client left).
            self._carry_out(self.waiters.ended(ticket, self._clock()))
            del self._wakes[ticket]
            del self._priorities[ticket]

    def _candidates(self, effect: Reserve) -> list[NodeView] | None:
        return self._machine.requester.candidates(effect.task_id, effect.attempt, self._clock())

    def _carry_out(self, decisions: Sequence[Decision]) -> Step | None:
        """Carry out what needs no waiting; the ticket's next step."""
        for decision in decisions:
            if isinstance(decision, WakeLocal):
                wake = self._wakes.get(decision.ticket)
                if wake is not None:
                    wake.set()
            elif isinstance(decision, WakePeer):
                envelope = BusWake(model=decision.model)
                self._outbox.send(decision.instance_id, envelope, give_up_in=WAKE_GIVE_UP_S)
            elif isinstance(decision, Queued):
                self._metrics.lease_denials_of("no_room").inc()
                self._machine.requester.waiting(decision.ticket[0])
            elif isinstance(decision, MayHold):
                # Whatever an unanswered ask left in the store is given back at the end.
                task_id = decision.ticket[0]
                self._machine.requester.waiting(task_id)
                lease_id = lease_id_of(decision.ticket)
                self._machine.requester.may_hold_lease(task_id, lease_id, decision.nodes)
            elif isinstance(decision, Left) and decision.queued_for is not None:
                self._metrics.queue_wait.observe(decision.queued_for)
                priority = self._priorities.get(decision.ticket, "1")
                by_priority = self._metrics.queue_wait_by_priority_of(priority)
                by_priority.observe(decision.queued_for)
                count, total = self.waited_by_priority.get(priority, (0, 0.0))
                self.waited_by_priority[priority] = (count + 1, total + decision.queued_for)
        return step_of(decisions)

    async def _wait(self, step: WaitUntil) -> None:
        # One scope, its deadline the machine's time; ``end_waits`` cancels it.
        scope = trio.CancelScope(deadline=step.at)
        self._waits.add(scope)
        try:
            with scope:
                if step.wakeable:
                    await self._wakes[step.ticket].wait()
                else:
                    await trio.sleep_forever()
        finally:
            self._waits.discard(scope)
        if step.wakeable:
            self._wakes[step.ticket] = trio.Event()

    def end_waits(self) -> None:
        """A drain's window ended: every request waiting in the queue, or about to, is refused
        with ``instance_shutting_down`` (its machine hears ``reserve_failed``)."""
        self.waits_ended = True
        for scope in list(self._waits):
            scope.cancel()

    async def _admit(self, effect: Reserve, step: AskStore) -> Admission | CoordinationUnavailable:
        """The store's answer, or why there is none (``CoordinationTimeout``: it did not
        answer in time; any other: it could not be reached)."""
        requester = self._machine.requester
        model, candidates = step.model, step.candidates
        cost = self._settings.capacity.cost(model)
        ask_key = requester.key_of(effect.task_id)
        ask = LeaseAsk(
            request_id=effect.task_id,
            instance_id=self.me,
            key_id=ask_key,
            model=model,
            model_gb=cost.resident_gb,
            kv_gb=cost.kv_gb,
            candidates=tuple((v.node_id, v.conn_id) for v in candidates),
            lease_id=lease_id_of((effect.task_id, effect.attempt)),
            queue_entry_ttl_s=self._settings.queue_timeout_s + REQUESTER_STALE_S,
            again=step.again,
            weight=self.weight_of(ask_key),
            rate=self._rate_ask(effect.task_id),
        )
        try:
            # Shielded: a lease granted to a request that is being cancelled must still reach
            # the machine (synchronously, in the caller), which gives it back. Bounded: a
            # store that hangs must not hold up a shutdown (a lease granted meanwhile heals
            # by its TTL).
            # (One scope for both: a cancel scope costs several µs, on every request.)
            with trio.CancelScope(shield=True, relative_deadline=ADMIT_GIVE_UP_S):
                admission = await self._coordination.admit(ask, self.rules)
                charge = self.rate_charges.get(effect.task_id)
                if ask.rate is not None and charge is not None:
                    charge.counted = True  # answered: counted (or refused) in that step
                return admission
            raise CoordinationTimeout(f"no answer within {ADMIT_GIVE_UP_S:g} s")
        except CoordinationTimeout as exc:
            # The machine has it asked again (or gives up past the bound and says so).
            log.info("task %s: capacity lease ask timed out: %s", effect.task_id, exc)
            return exc
        except CoordinationUnavailable as exc:
            log.warning("task %s: cannot take a capacity lease: %s", effect.task_id, exc)
            return exc

    def _rate_ask(self, task_id: str) -> RateAsk | None:
        """The request's rate limit, while no ask of it has been answered."""
        charge = self.rate_charges.get(task_id)
        if charge is None or charge.counted:
            return None
        limit, period = self._settings.rate_limit
        return RateAsk(rate_limit_key(charge.key_id), limit, period, charge.token)

    # -- waking -----------------------------------------------------------------------------

    def wake_local(self, model: str) -> None:
        self._carry_out(self.waiters.wake_local(model))

    def wake(self, model: str, instance_id: str) -> None:
        self._carry_out(self.waiters.wake(model, instance_id))

    def queued(self) -> dict[str, int]:
        """This instance's waiting requests per model."""
        return self.waiters.queued()

    # -- giving back ------------------------------------------------------------------------

    async def release(self, effect: ReleaseLease) -> None:
        self.releasing += 1
        try:
            await self._release(effect)
        finally:
            self.releasing -= 1

    async def _release(self, effect: ReleaseLease) -> None:
        started_at = self._clock()
        failures = 0
        while True:
            try:
                heads = await self._coordination.release(
                    LeaseRelease(
                        request_id=effect.task_id,
                        key_id=effect.key_id,
                        model=effect.model,
                        lease=effect.lease,
                        wake_models=effect.wake_models,
                        maybe_leases=effect.maybe_leases,
                    ),
                    self.rules,
                )
                break
            except CoordinationUnavailable as exc:
                failures += 1
                delay = release_retry_in(failures, started_at, self._clock())
                if delay is None:
                    log.warning("task %s: could not release its lease: %s", effect.task_id, exc)
                    return
                await trio.sleep(delay)
        for model, instance_id in heads:
            self.wake(model, instance_id)

    async def renew(self) -> None:
        """Keep this instance's leases alive while their tasks run. A renewal that times out
        is made again soon (a lease outlives two of them); none fails a task."""
        ttl = self.rules.lease_ttl_s
        delay = ttl / 3
        while True:
            await trio.sleep(delay)
            delay = ttl / 3
            leases = self._machine.requester.leases()
            if not leases:
                continue
            try:
                held = await self._coordination.renew_leases(leases, ttl)
            except CoordinationTimeout as exc:
                log.warning("could not renew %d capacity lease(s) yet: %s", len(leases), exc)
                delay = min(RENEW_RETRY_S, ttl / 3)
                continue
            except CoordinationUnavailable as exc:
                log.warning("could not renew %d capacity lease(s): %s", len(leases), exc)
                continue
            lost = [lease for lease, ok in zip(leases, held, strict=True) if not ok]
            if lost:
                self.lost_leases += len(lost)
                log.warning("%d capacity lease(s) had expired before renewal", len(lost))
