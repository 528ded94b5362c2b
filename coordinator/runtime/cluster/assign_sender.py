"""Handing an assign to the instance that owns its node, over the bus, when the store is slow.

A bus send that times out may still be delivered (the store was slow, not down), so giving up
at once failed requests with 503 through a Redis pause of a second or two. The send is made
again after a backoff (``core/admission/retries.py``) while the request still waits for this
placement, until the store has answered nothing for ``store_outage_s`` or the task's own timeout
passed; only then is it a failure. Sending twice is safe: the owner ignores an assign it already
runs (``core/owner.py``, a replayed assign), and the retries stop as soon as the request heard from
the owner or ended."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.bus.base import Bus
from coordinator.core.admission.retries import TimeoutRetries
from coordinator.core.effects import Dispatch, Effect
from coordinator.core.instance_machine import InstanceMachine
from coordinator.errors import CoordinationDown, CoordinationTimeout
from coordinator.runtime.cluster.membership import Membership
from coordinator.runtime.metrics import Metrics
from coordinator.settings import Settings
from protocol import encode

__all__ = ["dispatch", "send_assign"]

log = logging.getLogger("gemmanet.dispatch")


async def dispatch(
    effect: Dispatch,
    bus: Bus,
    machine: InstanceMachine,
    membership: Membership,
    metrics: Metrics,
    settings: Settings,
    clock: Callable[[], float],
) -> list[Effect]:
    """Send ``effect``'s assign; what the machine makes of the outcome."""
    task_id, placement = effect.envelope.task_id, effect.placement
    try:
        reached = await send_assign(
            bus,
            effect.target,
            encode(effect.envelope),
            task_id=task_id,
            still_waiting=lambda: machine.requester.awaits_dispatch(task_id, placement),
            store_outage_s=settings.store_outage_s,
            timeout_s=effect.envelope.timeout_s,
        )
    except CoordinationUnavailable as exc:
        log.warning("task %s: cannot reach the instance bus: %s", task_id, exc)
        error = CoordinationDown(
            "the instance that owns the chosen node cannot be reached for the moment; "
            "retry after the Retry-After delay"
        )
        return machine.dispatch_failed(task_id, placement, effect.target, error, clock())
    if reached is None:  # the request heard from the owner, or ended, meanwhile
        return []
    metrics.bus_sent.inc()
    if reached:
        return machine.dispatched(task_id, placement, clock())
    membership.forget_peer(effect.target)
    return machine.unreached(task_id, placement, effect.target, clock())


async def send_assign(
    bus: Bus,
    target: str,
    payload: bytes,
    *,
    task_id: str,
    still_waiting: Callable[[], bool],
    store_outage_s: float,
    timeout_s: float,
) -> int | None:
    """How many listeners of ``target`` got the assign (0: nobody listens there); None: the
    request stopped waiting for it meanwhile. Raises CoordinationUnavailable when the bus
    refused, or stayed silent past the bounds above (the last CoordinationTimeout)."""
    first_at = trio.current_time()
    retries = TimeoutRetries(
        store_outage_s=store_outage_s, deadline=first_at + timeout_s, salt=task_id
    )
    while True:
        asked_at = trio.current_time()
        try:
            return await bus.send(target, payload)
        except CoordinationTimeout as exc:
            delay = retries.after_timeout(asked_at, trio.current_time(), exc.silent_for_s)
            if delay is None:
                raise
            log.info("task %s: the bus send timed out, sending again: %s", task_id, exc)
            await trio.sleep(delay)
            if not still_waiting():
                return None
