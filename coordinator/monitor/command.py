"""``gemmanet monitor``: the monitor loop as a process of its own, against Redis.

It refuses the embedded memory backend (one line): a monitor in its own process could only
share facts with instances through Redis. Inside an instance (``GEMMANET_MONITOR=1``) the
memory backend is fine: there the facts live in that instance's own store.
"""

from __future__ import annotations

import json
import logging
import secrets
import signal
import sys
from functools import partial
from typing import Any

import trio

from coordinator.coordination.base import CoordinationUnavailable
from coordinator.coordination.factory import coordination_for
from coordinator.errors import SettingsError, StartupRefused
from coordinator.monitor.loop import run_monitor
from coordinator.monitor.timing import check_monitor_bound, monitor_bound_sum
from coordinator.settings import Settings
from protocol.constraints import is_identifier

__all__ = ["run_monitor_command"]

log = logging.getLogger("gemmanet.monitor")


def _print_event(event: dict[str, Any]) -> None:
    event["t"] = round(trio.current_time(), 4)
    print(json.dumps(event, separators=(",", ":")), flush=True)


def run_monitor_command(settings: Settings, *, candidate: str | None, events: bool) -> int:
    if not settings.redis_url:
        raise SettingsError(
            "gemmanet monitor needs GEMMANET_REDIS_URL: a monitor process shares its facts "
            "through Redis/Valkey (or run it inside an instance with GEMMANET_MONITOR=1)"
        )
    check_monitor_bound(settings)
    name = candidate or f"monitor-{secrets.token_hex(4)}"
    if not is_identifier(name):
        # The id goes into the lease value "<id>|<epoch>": keep it to the identifier rule.
        raise SettingsError(f"--id {name!r} may hold only [A-Za-z0-9._:-]")
    if settings.monitor_unfenced:
        log.warning("GEMMANET_MONITOR_UNFENCED=1: fact writes skip the token compare (TEST ONLY)")

    async def main() -> None:
        coordination = coordination_for(settings)
        stop = trio.Event()
        async with coordination, trio.open_nursery() as nursery:
            await coordination.ping()
            emit = _print_event if events else (lambda event: None)
            await nursery.start(
                partial(
                    run_monitor,
                    coordination.monitor,
                    coordination.telemetry,
                    settings,
                    name,
                    emit=emit,
                    stop=stop,
                )
            )
            log.info("monitor %s running (%s)", name, monitor_bound_sum(settings))
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    stop.set()
                    break

    try:
        trio.run(main)
    except* CoordinationUnavailable as group:
        first = group.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise StartupRefused(f"monitor: the coordination store is unreachable: {first}") from None
    sys.stdout.flush()
    return 0
