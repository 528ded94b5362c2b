"""The monitor loop: a standby retries the election every retry interval; the primary, every
poll interval, polls each host (all at once, each bounded by the poll timeout), writes each
host's facts with its fencing token, and only then renews its lease.

That order is deliberate: a primary paused past its TTL (SIGSTOP, a partition, a long GC) and
resumed wakes up at a tick, so the first thing it does with the store is a fact write with its
old token, before any renewal could tell it that it lost the lease. The store's compare rejects
that write (and counts it); the loop then steps down to standby. This is what ``gemmanet
prove-takeover`` exercises. A write rejected or a renewal refused both mean "deposed".

``emit`` receives one dict per event (candidate, standby, elected, write, deposed, resumed,
store_unreachable, resigned); ``gemmanet monitor --events`` prints them as JSON lines.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import trio

from coordinator.coordination.base import CoordinationUnavailable
from coordinator.coordination.roles import MonitorStore, TelemetryStore
from coordinator.monitor.election import Candidacy
from coordinator.monitor.poller import poll_host
from coordinator.monitor.telemetry_poll import run_telemetry_polls
from coordinator.settings import Settings

__all__ = ["Emit", "run_monitor"]

log = logging.getLogger("gemmanet.monitor")

Emit = Callable[[dict[str, Any]], None]


def _log_only(event: dict[str, Any]) -> None:
    log.debug("monitor event %s", event)


async def _poll_all(
    client: httpx.AsyncClient, settings: Settings
) -> list[tuple[str, dict[str, Any]]]:
    hosts = sorted(settings.capacity.hosts.items())
    records: list[tuple[str, dict[str, Any]]] = [("", {})] * len(hosts)

    async def one(index: int, host_id: str) -> None:
        spec = settings.capacity.hosts[host_id]
        records[index] = (
            host_id,
            await poll_host(client, host_id, spec, settings.monitor_poll_timeout_s),
        )

    async with trio.open_nursery() as nursery:
        for index, (host_id, _) in enumerate(hosts):
            nursery.start_soon(one, index, host_id)
    return records


async def _primary_tick(
    candidacy: Candidacy, client: httpx.AsyncClient, settings: Settings, emit: Emit
) -> None:
    epoch = candidacy.epoch
    assert epoch is not None
    coordination = candidacy.coordination
    for host_id, record in await _poll_all(client, settings):
        record["epoch"] = epoch
        accepted = await coordination.write_host_facts(
            candidacy.candidate,
            epoch,
            host_id,
            json.dumps(record, separators=(",", ":")).encode(),
            fenced=not settings.monitor_unfenced,
        )
        emit({"event": "write", "epoch": epoch, "host": host_id, "accepted": accepted})
        if not accepted:
            candidacy.step_down()
            log.warning(
                "monitor %s deposed: a fact write with epoch %d was rejected (fenced)",
                candidacy.candidate,
                epoch,
            )
            emit({"event": "deposed", "epoch": epoch, "reason": "write rejected"})
            return
    if not await candidacy.renew():
        log.warning("monitor %s deposed: its lease (epoch %d) is gone", candidacy.candidate, epoch)
        emit({"event": "deposed", "epoch": epoch, "reason": "lease lost"})


async def run_monitor(
    monitor: MonitorStore,
    telemetry: TelemetryStore,
    settings: Settings,
    candidate: str,
    *,
    emit: Emit = _log_only,
    stop: trio.Event | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    task_status: trio.TaskStatus[Candidacy] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run as a candidate until ``stop`` is set (then resign) or cancelled (the lease expires).

    ``monitor`` holds its election and fenced facts, ``telemetry`` what its agent polls append.
    ``transport`` replaces the network under the host polls (the simulator passes an
    ``httpx.MockTransport`` that answers in the hosts' wire format on virtual time)."""
    candidacy = Candidacy(monitor, candidate, settings.monitor_ttl_s)
    if stop is None:
        stop = trio.Event()
    task_status.started(candidacy)
    emit({"event": "candidate", "candidate": candidate})
    async with (
        httpx.AsyncClient(timeout=settings.monitor_poll_timeout_s, transport=transport) as client,
        trio.open_nursery() as beside,
    ):
        # The telemetry agents of the operator file, polled beside the fact loop (never in it:
        # they must not delay a fenced write or a renewal), only while this one is primary.
        beside.start_soon(
            run_telemetry_polls, telemetry, settings, client, lambda: candidacy.primary
        )
        due = trio.current_time()
        waiting_reported = False
        while not stop.is_set():
            started = trio.current_time()
            # Woken far later than due: this process was paused (or starved) past its TTL.
            gap = started - due
            if candidacy.primary and gap > settings.monitor_ttl_s:
                emit({"event": "resumed", "epoch": candidacy.epoch, "gap_s": round(gap, 3)})
            try:
                if candidacy.primary:
                    await _primary_tick(candidacy, client, settings, emit)
                elif await candidacy.try_acquire():
                    log.info("monitor %s is primary with epoch %s", candidate, candidacy.epoch)
                    emit({"event": "elected", "epoch": candidacy.epoch})
                    due = trio.current_time()
                    continue  # poll at once: facts as soon as possible after a takeover
                elif not waiting_reported:
                    waiting_reported = True
                    emit({"event": "standby", "holder": candidacy.seen_holder})
            except CoordinationUnavailable as exc:
                log.warning("monitor %s: the coordination store is unreachable: %s", candidate, exc)
                emit({"event": "store_unreachable"})
            pause = settings.monitor_poll_s if candidacy.primary else settings.monitor_retry_s
            due = started + pause
            with trio.move_on_at(due):
                await stop.wait()
        with trio.move_on_after(settings.monitor_ttl_s), trio.CancelScope(shield=True):
            try:
                await candidacy.resign()
                emit({"event": "resigned"})
            except CoordinationUnavailable:
                pass
        beside.cancel_scope.cancel()
