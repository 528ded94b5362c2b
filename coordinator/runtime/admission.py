"""Capacity leases and the shared admission queue, the shell's side.

The requester machine asks for a lease (``Reserve``) and gives back what a request held
(``ReleaseLease``); this module carries both out against the shared store
(``Coordination.admit`` / ``release``, semantics in ``coordination/leases.py``):

* ``reserve`` takes a lease in one round trip, or waits for its turn in the model's queue:
  it tries again when woken (a release anywhere tells the instance whose request is first in
  the queue, ``BusWake``), and the first waiter of a model on this instance also re-checks
  every ``POLL_S`` in case a wake was lost (pub/sub is at-most-once). After the queue timeout
  it fails with ``503 all_nodes_busy``; a client that leaves stops waiting at once.
* ``release`` runs in the background, off the answer's path, and wakes the next in line.
* ``renew`` keeps the leases of long tasks alive; a dead instance's leases heal by their TTL.
* When the store cannot answer, or a candidate's facts are stale, nothing is placed on a
  guess: ``503 coordination_unavailable`` (fail closed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.coordination.leases import Admission, AdmissionRules, LeaseAsk, LeaseRelease
from coordinator.core import registry
from coordinator.core.effects import Effect, ReleaseLease, Reserve
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.placement import NodeView
from coordinator.core.requester import no_node_serves
from coordinator.errors import AllNodesBusy, CoordinationDown, GemmaNetError, TooManyActive
from coordinator.runtime.bus_outbox import BusOutbox
from coordinator.runtime.metrics import Metrics
from coordinator.settings import Settings
from protocol import BusWake

log = logging.getLogger("gemmanet.admission")

#: the first waiter of a model on this instance re-checks this often (a wake may be lost)
POLL_S = 1.0
#: a request whose candidates all went away (a view a beat old, or facts the store lost and
#: their owners are writing again) looks again after this long, for at most GONE_GIVE_UP_S
GONE_RETRY_S = 0.25
GONE_GIVE_UP_S = 3.0
#: queue and active-set entries of an instance silent this long stop counting
REQUESTER_STALE_S = 10.0
#: how long a failed release is retried (a lease heals by its TTL anyway; an active-set
#: entry of a live instance would not)
RELEASE_GIVE_UP_S = 30.0
WAKE_GIVE_UP_S = 2.0
ADMIT_GIVE_UP_S = 5.0


def admission_rules(
    *,
    residency_stale_s: float,
    lease_ttl_s: float,
    queue_max: int,
    max_active_per_key: int,
) -> AdmissionRules:
    return AdmissionRules(
        presence_registry=registry.PRESENCE,
        facts_stale_s=residency_stale_s,
        requester_stale_s=REQUESTER_STALE_S,
        lease_ttl_s=lease_ttl_s,
        queue_max=queue_max,
        max_active_per_key=max_active_per_key,
    )


@dataclass(eq=False)
class _Waiter:
    task_id: str
    woken: trio.Event = field(default_factory=trio.Event)


class Admissions:
    def __init__(
        self,
        settings: Settings,
        coordination: Coordination,
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
        )
        # Per model, this instance's waiting requests in arrival order.
        self._waiters: dict[str, list[_Waiter]] = {}
        self.lost_leases = 0

    # -- taking a lease ---------------------------------------------------------------------

    async def reserve(self, effect: Reserve) -> list[Effect]:
        """Take a lease for the task, waiting for room; the machine's effects that follow."""
        requester = self._machine.requester
        model = requester.model_of(effect.task_id)
        if model is None:
            return []
        queue_until = self._clock() + self._settings.queue_timeout_s
        gone_until: float | None = None
        # Registered before the first ask: this instance's asks reach the store in the order
        # they are sent, so local waiters stay in the queue's order.
        waiter = _Waiter(effect.task_id)
        self._waiters.setdefault(model, []).append(waiter)
        woken = False
        queued_at: float | None = None
        try:
            while True:
                candidates = requester.candidates(effect.task_id, effect.attempt, self._clock())
                if candidates is None:
                    return []  # the request ended meanwhile
                if not candidates:
                    return self._failed(effect, no_node_serves(model), "no_node")
                admission = await self._admit(effect, model, candidates)
                if isinstance(admission, GemmaNetError):
                    return self._failed(effect, admission, "coordination_unavailable")
                if admission.outcome == "granted":
                    return self._granted(effect, model, admission, candidates)
                if admission.outcome == "queued":
                    self._metrics.lease_denials.labels(reason="no_room").inc()
                    queued_at = self._clock() if queued_at is None else queued_at
                    requester.waiting(effect.task_id)
                    if woken and admission.position > 0:
                        # Not first in line after all: the wake may be meant for a later
                        # local waiter (asks can overtake each other on the way).
                        self._pass_wake(model, waiter)
                elif admission.outcome != "refused" or "stale" in admission.refusals.values():
                    reason = admission.outcome if admission.outcome != "refused" else "stale_facts"
                    return self._failed(effect, self._refusal(model, admission), reason)
                if self._clock() >= queue_until:
                    return self._failed(effect, self._timed_out(model), "queue_timeout")
                if admission.outcome == "refused":  # every candidate went away: look again
                    now = self._clock()
                    gone_until = gone_until or now + GONE_GIVE_UP_S
                    if now >= gone_until:
                        return self._failed(effect, self._facts_missing(model), "facts_missing")
                    await trio.sleep(GONE_RETRY_S)
                    woken = False
                else:
                    woken = await self._wait_turn(model, waiter, queue_until)
        finally:
            self._leave(model, waiter)
            if queued_at is not None:
                self._metrics.queue_wait.observe(self._clock() - queued_at)

    async def _admit(
        self, effect: Reserve, model: str, candidates: list[NodeView]
    ) -> Admission | GemmaNetError:
        requester = self._machine.requester
        cost = self._settings.capacity.cost(model)
        ask = LeaseAsk(
            request_id=effect.task_id,
            instance_id=self.me,
            key_id=requester.key_of(effect.task_id),
            model=model,
            model_gb=cost.resident_gb,
            kv_gb=cost.kv_gb,
            candidates=tuple((v.node_id, v.conn_id) for v in candidates),
            lease_id=f"{effect.task_id}.{effect.attempt}",
            queue_entry_ttl_s=self._settings.queue_timeout_s + REQUESTER_STALE_S,
        )
        try:
            # Shielded: a lease granted to a request that is being cancelled must still reach
            # the machine (synchronously, in the caller), which gives it back. Bounded: a
            # store that hangs must not hold up a shutdown (a lease granted meanwhile heals
            # by its TTL).
            with trio.CancelScope(shield=True), trio.move_on_after(ADMIT_GIVE_UP_S):
                return await self._coordination.admit(ask, self.rules)
            raise CoordinationUnavailable(f"no answer within {ADMIT_GIVE_UP_S:g} s")
        except CoordinationUnavailable as exc:
            log.warning("task %s: cannot take a capacity lease: %s", effect.task_id, exc)
            return CoordinationDown(
                "capacity cannot be reserved while the coordination store is unreachable; "
                "retry after the Retry-After delay"
            )

    def _granted(
        self, effect: Reserve, model: str, admission: Admission, candidates: list[NodeView]
    ) -> list[Effect]:
        self._metrics.lease_grants.inc()
        if admission.next_in_queue:
            self.wake(model, admission.next_in_queue)
        view = next(
            v
            for v in candidates
            if v.node_id == admission.node_id and v.conn_id == admission.conn_id
        )
        return self._machine.reserved(
            effect.task_id, effect.attempt, view, admission.lease_id, self._clock()
        )

    def _failed(self, effect: Reserve, error: GemmaNetError, reason: str) -> list[Effect]:
        self._metrics.lease_denials.labels(reason=reason).inc()
        return self._machine.reserve_failed(effect.task_id, effect.attempt, error, self._clock())

    def _refusal(self, model: str, admission: Admission) -> GemmaNetError:
        if admission.outcome == "key_limit":
            limit = self.rules.max_active_per_key
            return TooManyActive(
                f"this API key already has {limit} request(s) running or queued "
                "(GEMMANET_MAX_ACTIVE_PER_KEY)",
                retry_after_s=1,
            )
        if admission.outcome == "queue_full":
            return AllNodesBusy(
                f"{self.rules.queue_max} request(s) already wait for model {model!r} "
                "(GEMMANET_QUEUE_MAX)",
                retry_after_s=5,
            )
        stale = sorted(n for n, reason in admission.refusals.items() if reason == "stale")
        return CoordinationDown(
            f"the facts of node(s) {', '.join(stale)} are stale (their instance stopped "
            "updating them); nothing is placed on a guess",
        )

    def _facts_missing(self, model: str) -> CoordinationDown:
        return CoordinationDown(
            f"the shared store has no current facts for the nodes serving model {model!r} "
            "(it may have restarted; their instances are writing them again)"
        )

    def _timed_out(self, model: str) -> AllNodesBusy:
        waited = self._settings.queue_timeout_s
        return AllNodesBusy(
            f"no node serving model {model!r} had room within {waited:g} s "
            "(GEMMANET_QUEUE_TIMEOUT_S)",
            retry_after_s=max(1, round(waited / 10)),
        )

    # -- waiting ----------------------------------------------------------------------------

    async def _wait_turn(self, model: str, waiter: _Waiter, until: float) -> bool:
        """Wait for a wake (True) or, for the first local waiter, the next poll (False)."""
        first = self._waiters[model][0] is waiter
        wake_at = min(until, self._clock() + POLL_S) if first else until
        with trio.move_on_at(wake_at):
            await waiter.woken.wait()
        woken = waiter.woken.is_set()
        waiter.woken = trio.Event()
        return woken

    def _pass_wake(self, model: str, waiter: _Waiter) -> None:
        waiters = self._waiters.get(model, [])
        if waiter in waiters:
            index = waiters.index(waiter)
            if index + 1 < len(waiters):
                waiters[index + 1].woken.set()

    def _leave(self, model: str, waiter: _Waiter) -> None:
        waiters = self._waiters.get(model, [])
        was_first = bool(waiters) and waiters[0] is waiter
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            self._waiters.pop(model, None)
        elif was_first:
            waiters[0].woken.set()  # the next local waiter may be first in line now

    def wake_local(self, model: str) -> None:
        waiters = self._waiters.get(model)
        if waiters:
            waiters[0].woken.set()

    def wake(self, model: str, instance_id: str) -> None:
        if instance_id == self.me:
            self.wake_local(model)
        else:
            self._outbox.send(instance_id, BusWake(model=model), give_up_in=WAKE_GIVE_UP_S)

    def queued(self) -> dict[str, int]:
        """This instance's waiting requests per model."""
        return {model: len(waiters) for model, waiters in sorted(self._waiters.items())}

    # -- giving back ------------------------------------------------------------------------

    async def release(self, effect: ReleaseLease) -> None:
        coordination = self._coordination
        give_up_at = self._clock() + RELEASE_GIVE_UP_S
        delay = 0.1
        while True:
            try:
                heads = await coordination.release(
                    LeaseRelease(
                        request_id=effect.task_id,
                        key_id=effect.key_id,
                        model=effect.model,
                        lease=effect.lease,
                        wake_models=effect.wake_models,
                    ),
                    self.rules,
                )
                break
            except CoordinationUnavailable as exc:
                if self._clock() + delay >= give_up_at:
                    log.warning("task %s: could not release its lease: %s", effect.task_id, exc)
                    return
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
        for model, instance_id in heads:
            self.wake(model, instance_id)

    async def renew(self) -> None:
        """Keep this instance's leases alive while their tasks run."""
        ttl = self.rules.lease_ttl_s
        while True:
            await trio.sleep(ttl / 3)
            leases = self._machine.requester.leases()
            if not leases:
                continue
            try:
                held = await self._coordination.renew_leases(leases, ttl)
            except CoordinationUnavailable as exc:
                log.warning("could not renew %d capacity lease(s): %s", len(leases), exc)
                continue
            lost = [lease for lease, ok in zip(leases, held, strict=True) if not ok]
            if lost:
                self.lost_leases += len(lost)
                log.warning("%d capacity lease(s) had expired before renewal", len(lost))
