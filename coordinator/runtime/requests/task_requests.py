"""The request side of an instance: the tasks its clients ask for, from placement to record.

``TaskRequests.start`` builds the task's assign (its content checked against what a node can
take, its timeout capped), hands it to the requester machine and waits while it is placed
(its lease, its queue turn, its dispatch); ``end`` tells the machine the request is done
(cancelling the task on its node if it still runs) and records it with its usage; ``open`` is
both around a block. The HTTP routes use them through ``api/task_runs.py``; the simulator
uses them as its clients.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol

import msgspec
import trio

from coordinator.coordination import RateLimits
from coordinator.core.effects import Effect, FailedEvent, MovedEvent, TaskEvent
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.placement.affinity import prefix_text
from coordinator.core.task_content import check_content_fits
from coordinator.errors import (
    CoordinationDown,
    CoordinationUnavailable,
    GemmaNetError,
    InstanceDraining,
    NodeDisconnected,
    RateLimited,
    StoreError,
)
from coordinator.runtime.drain import Drain
from coordinator.runtime.log_context import bind_log_ids
from coordinator.runtime.metrics import Metrics
from coordinator.runtime.requests import task_log
from coordinator.runtime.requests.admission import Admissions
from coordinator.runtime.requests.affinity import Affinity, Lookup
from coordinator.runtime.requests.rate_limit import RateCharge, check_rate_limit
from coordinator.runtime.requests.task_handle import TaskHandle, queued_failure
from coordinator.runtime.requests.task_recorder import TaskRecorder
from coordinator.settings import Settings
from protocol import Assign, Message, Options

if TYPE_CHECKING:
    # Only the type (the instance's store is passed in): importing the runtime need not load
    # SQLAlchemy, which a simulator process never uses.
    from coordinator.store import Store

__all__ = ["RequestHost", "TaskRequests"]

log = logging.getLogger("gemmanet.instance")


class RequestHost(Protocol):
    """What the request side needs of its instance (``coordinator.runtime.instance.Instance``)."""

    instance_id: str
    settings: Settings
    machine: InstanceMachine
    metrics: Metrics
    recorder: TaskRecorder
    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    affinity: Affinity
    #: task id -> the channel of the request waiting for its events
    waiting: dict[str, trio.MemorySendChannel[TaskEvent]]

    store: Store
    #: SIGTERM's drain: refuses new requests, ends queued ones when its window is over
    drain: Drain
    #: leases and the admission queue (a request's rate charge rides on its first ask)
    admissions: Admissions

    def new_id(self, prefix: str) -> str: ...
    def apply(self, effects: list[Effect]) -> None: ...
    async def carry_out(self, effects: list[Effect]) -> None: ...


class TaskRequests:
    def __init__(self, instance: RequestHost, rate_limits: RateLimits) -> None:
        self._instance = instance
        self._rate_limits = rate_limits

    async def check_rate_limit(self, key_id: str, *, token: str | None = None) -> None:
        """Raises RateLimited past the key's budget (one budget across every route). A slow
        store is waited out up to the outage bound, within the request's own budget (its
        queue timeout, capped by the task timeout)."""
        settings = self._instance.settings
        await check_rate_limit(
            self._rate_limits,
            settings.rate_limit,
            key_id,
            store_outage_s=settings.store_outage_s,
            budget_s=min(settings.queue_timeout_s, settings.task_timeout_s),
            token=token,
        )

    async def charge(self, charge: RateCharge) -> None:
        """Count the request's rate limit now unless an admission ask counted it already
        (raises RateLimited over the limit, CoordinationDown when the store cannot tell)."""
        if charge.counted:
            return
        try:
            await self.check_rate_limit(charge.key_id, token=charge.token)
        except RateLimited:
            charge.counted = True
            raise
        charge.counted = True

    async def charge_first(self, charge: RateCharge, error: GemmaNetError) -> GemmaNetError:
        """A request refused with ``error`` before an ask counted its rate limit: counted now,
        and what it is answered (the rate limit's error first, as when it was counted on
        arrival)."""
        if charge.counted or isinstance(error, InstanceDraining):
            return error  # a draining instance spends no rate limit
        if isinstance(error, (CoordinationDown, CoordinationUnavailable)):
            # The store already failed this request past its outage bound: counting it now
            # would wait out that bound a second time, for the same answer.
            return error
        try:
            await self.charge(charge)
        except GemmaNetError as first:
            return first
        return error

    async def rate(self, task_id: str, key_id: str, score: int) -> None:
        inst = self._instance
        await inst.recorder.rate_task(task_id, key_id, score)
        # Visible at once here; the other instances re-read the ratings every
        # RATINGS_REFRESH_S (see the docs/clients.md).
        try:
            inst.machine.set_ratings(await inst.store.node_ratings())
        except StoreError as exc:
            log.warning("could not re-read the node ratings after a rating: %s", exc)

    async def start(
        self,
        *,
        key_id: str,
        model: str,
        prompt: str | None = None,
        messages: list[Message] | None = None,
        options: Options | None = None,
        stream: bool,
        timeout_s: float | None,
        rate: RateCharge | None = None,
    ) -> TaskHandle:
        """Place a task on a node and send it there. The caller must ``end`` the handle
        (``open`` does it); a handle that is never ended is swept at its deadline.
        The task runs on ``prompt`` or on ``messages`` (exactly one), with ``options``.
        Raises NoNodeForModel when no node serves the model; waits in the admission queue
        while none has room (AllNodesBusy after the queue timeout). With ``rate``, the
        request's rate limit is counted too: in its admission ask (the same round trip), or
        on its own when it did not get that far (RateLimited first when over it)."""
        inst = self._instance
        began = inst.clock()
        try:
            refusal = inst.drain.refusal()
            if refusal is not None:
                raise refusal
            assign, deadline = self._assign(model, prompt, messages, options, stream, timeout_s)
            # Nothing at all with affinity off (not even the prefix's text).
            lookup = None
            if inst.affinity.enabled:
                text = prefix_text(prompt, messages)
                lookup = await inst.affinity.predict(model, text, messages is not None)
            handle = await self._place(key_id, assign, deadline, lookup, rate)
        except GemmaNetError as exc:
            error = exc if rate is None else await self.charge_first(rate, exc)
            if not isinstance(error, RateLimited):  # counted with the route's refusals
                inst.metrics.task_refused(error)
            if error is exc:
                raise
            raise error from None
        except trio.Cancelled:
            inst.metrics.task_outcome("client_gone")
            raise
        handle.began_at = began
        return handle

    def _assign(
        self,
        model: str,
        prompt: str | None,
        messages: list[Message] | None,
        options: Options | None,
        stream: bool,
        timeout_s: float | None,
    ) -> tuple[Assign, float]:
        """The task's assign and its deadline; raises what refuses it before placement."""
        if (prompt is None) == (messages is None):
            raise ValueError("a task runs on exactly one of a prompt and messages")
        check_content_fits(prompt, messages, options)
        inst = self._instance
        limit = inst.settings.task_timeout_s
        timeout = min(timeout_s or limit, limit)
        task_id = inst.new_id("t-")
        # The rest of this request logs with its task (and, once placed, its node).
        bind_log_ids(task_id=task_id, node_id=None)
        assign = Assign(
            task_id=task_id,
            model=model,
            prompt=prompt,
            stream=stream,
            timeout_s=timeout,
            messages=msgspec.UNSET if messages is None else messages,
            options=msgspec.UNSET if options is None or options.is_empty() else options,
        )
        return assign, inst.clock() + timeout

    async def _place(
        self,
        key_id: str,
        assign: Assign,
        deadline: float,
        lookup: Lookup | None,
        rate: RateCharge | None,
    ) -> TaskHandle:
        inst = self._instance
        task_id = assign.task_id
        send, receive = trio.open_memory_channel[TaskEvent](math.inf)
        inst.waiting[task_id] = send
        prediction = lookup.prediction if lookup is not None else None
        if rate is not None:
            inst.admissions.rate_charges[task_id] = rate
        try:
            # A drain's window that ends while this waits in the queue refuses it there
            # (Admissions.end_waits: instance_shutting_down).
            await inst.carry_out(
                inst.machine.submit(assign, deadline, inst.clock(), key_id, prediction)
            )
            placement = inst.machine.requester.placement(task_id)
            if placement is None and inst.machine.requester.model_of(task_id) is not None:
                placement = await _placed_meanwhile(receive, deadline)
            if placement is not None and rate is not None and not rate.counted:
                await self.charge(rate)  # placed without an ask that counted it
        except BaseException as exc:
            inst.waiting.pop(task_id, None)
            outcome = exc.code if isinstance(exc, GemmaNetError) else "client_gone"
            inst.apply(inst.machine.request_ended(task_id, outcome, inst.clock()))
            raise
        finally:
            if rate is not None:
                inst.admissions.rate_charges.pop(task_id, None)
        if placement is None:
            # Every node it was placed on turned out gone before any of them saw it: the
            # request gets that error now, like a placement that found no node at all.
            inst.waiting.pop(task_id, None)
            raise queued_failure(receive) or NodeDisconnected(f"task {task_id} could not be placed")
        node_id, conn_id, owner = placement
        bind_log_ids(node_id=node_id)
        task_log.task_placed(task_id, node_id, owner)
        inst.affinity.placed(lookup, node_id)
        handle = TaskHandle(
            task_id=task_id,
            node_id=node_id,
            conn_id=conn_id,
            owner_instance=owner,
            events=receive,
            deadline=deadline,
            timeout_s=assign.timeout_s,
            key_id=key_id,
            model=assign.model,
            stream=assign.stream,
            created_at=inst.wall_clock(),
        )
        handle.affinity = lookup
        return handle

    async def end(self, handle: TaskHandle, outcome: str) -> None:
        """The request is done with its task (``outcome``: "ok" or an error code). Cancels it
        on the node if it is still running, and records it. Idempotent."""
        if handle.outcome is not None:
            return
        inst = self._instance
        handle.outcome = outcome
        local = handle.owner_instance == inst.instance_id
        inst.metrics.task_ended(outcome, local=local, took_s=inst.clock() - handle.began_at)
        if handle.done is not None and handle.done.usage is not None:
            inst.metrics.tokens_used(handle.model, handle.done.usage)
        if outcome == "ok" and handle.done is not None:
            inst.affinity.record(handle.affinity, handle.model, handle.node_id, handle.done.output)
        task_log.task_ended(handle.task_id, handle.node_id, outcome)
        inst.waiting.pop(handle.task_id, None)
        inst.apply(inst.machine.request_ended(handle.task_id, outcome, inst.clock()))
        inst.recorder.add(handle.record(inst.instance_id, finished_at=inst.wall_clock()))

    @asynccontextmanager
    async def open(
        self,
        *,
        key_id: str,
        model: str,
        prompt: str | None = None,
        messages: list[Message] | None = None,
        options: Options | None = None,
        stream: bool,
        timeout_s: float | None,
        rate: RateCharge | None = None,
    ) -> AsyncIterator[TaskHandle]:
        """``start`` … ``end`` as a block; leaving it early cancels the task."""
        handle = await self.start(
            key_id=key_id,
            model=model,
            prompt=prompt,
            messages=messages,
            options=options,
            stream=stream,
            timeout_s=timeout_s,
            rate=rate,
        )
        outcome = "internal_error"
        try:
            yield handle
            outcome = "ok"
        except GemmaNetError as exc:
            outcome = exc.code
            raise
        except trio.Cancelled:
            outcome = "client_gone"
            raise
        finally:
            await self.end(handle, outcome)


async def _placed_meanwhile(
    events: trio.MemoryReceiveChannel[TaskEvent], deadline: float
) -> tuple[str, str, str] | None:
    """Where a task went that was refused while its own dispatch was still under way (its
    owner answered before the bus confirmed the send, e.g. a node moving off a draining
    instance): the request is placed again in the background, and hears where in a
    ``MovedEvent``, or why not in a ``FailedEvent`` (raised). None: nothing by ``deadline``."""
    with trio.move_on_at(deadline):
        while True:
            event = await events.receive()
            if isinstance(event, MovedEvent):
                return event.node_id, event.conn_id, event.owner_instance
            if isinstance(event, FailedEvent):
                raise event.error
    return None
