"""``gemmanet audit [--json] [--probe] [--enable|--disable [--by NAME]]``: read, judge, print;
the exit code says whether the scheduler may be turned on (0), why not (1, reasons listed), or
that Redis did not answer (3). A bad setting is one line on stderr and exit 2 (raised as
``SettingsError`` for the CLI).

``--enable`` turns the shared placement switch on (``gate.py``: only from a report with every
gate green), then prints the report with it; refused, it prints the report and returns the
one line that names the red gates, for the CLI to put on stderr. ``--disable`` turns it off
without judging anything and prints the switch alone.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import re
import socket
import time
from functools import partial
from typing import Literal

import trio

from coordinator.audit.findings import EXIT_NOT_READY, EXIT_REDIS_UNREACHABLE, judge
from coordinator.audit.gate import check_by, enable_refusal, utc
from coordinator.audit.observe import observe
from coordinator.audit.render import render_text
from coordinator.coordination.base import CoordinationUnavailable
from coordinator.coordination.factory import coordination_for
from coordinator.coordination.monitor_types import PlacementSwitch
from coordinator.errors import SettingsError
from coordinator.settings import Settings

__all__ = ["default_by", "run_audit_command"]

Switch = Literal["enable", "disable"]


def default_by() -> str:
    """``--by``'s default: the user and the machine that ran the command."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container without USER)
        user = "unknown"
    return re.sub(r"[^A-Za-z0-9._@:+-]", "-", f"{user}@{socket.gethostname()}")[:64]


async def _set_switch(settings: Settings, switch: PlacementSwitch) -> None:
    async with coordination_for(settings) as coordination:
        await coordination.monitor.set_host_placement(switch)


def _write_switch(settings: Settings, switch: PlacementSwitch) -> str | None:
    """Set the switch; None, or why Redis did not take it."""
    error: str | None = None
    try:
        trio.run(_set_switch, settings, switch)
    except* CoordinationUnavailable as group:
        error = f"Redis is unreachable ({group.exceptions[0]})"
    return error


def _disable(settings: Settings, by: str, as_json: bool) -> tuple[int, str | None]:
    switch = PlacementSwitch(enabled=False, by=by, at=time.time())
    error = _write_switch(settings, switch)
    if error is not None:
        return EXIT_REDIS_UNREACHABLE, f"audit --disable: {error}; the switch is unchanged"
    if as_json:
        print(json.dumps({"host_placement": {"switch": switch.to_json()}}, indent=2))
    else:
        print(
            f"gate     disabled by {by} at {utc(switch.at)}: instances place nothing new on "
            "direct hosts from their next read (0.5 s); calls in flight finish"
        )
    return 0, None


def run_audit_command(
    settings: Settings,
    *,
    as_json: bool,
    probe: bool,
    switch: Switch | None = None,
    by: str | None = None,
) -> tuple[int, str | None]:
    """The exit code, and the one line for stderr when ``--enable`` was refused or Redis did
    not answer a switch."""
    if not settings.redis_url:
        raise SettingsError(
            "gemmanet audit needs GEMMANET_REDIS_URL: it reads the monitor's facts and the "
            "instance registry from Redis/Valkey, with the instances' own settings"
        )
    if by is not None and switch is None:
        raise SettingsError("--by names who switches the gate: give it with --enable or --disable")
    by = check_by(by) if by is not None else default_by()
    if switch == "disable":
        return _disable(settings, by, as_json)
    observed = trio.run(partial(observe, settings, probe=probe))
    report = judge(settings, observed)
    refusal, code = None, report.exit_code
    if switch == "enable":
        refusal = enable_refusal(settings, report.reasons, observed.redis_error)
        if refusal is None:
            epoch = observed.monitor.epoch if observed.monitor else None
            enabled = PlacementSwitch(enabled=True, by=by, at=time.time(), epoch=epoch)
            error = _write_switch(settings, enabled)
            if error is not None:
                refusal = f"audit --enable: {error}; the switch is unchanged"
                code = EXIT_REDIS_UNREACHABLE
            else:
                report = judge(settings, dataclasses.replace(observed, switch=enabled))
    if as_json:
        print(json.dumps(report.document, indent=2))
    else:
        print(render_text(report.document))
    if refusal is not None:
        return code or EXIT_NOT_READY, refusal
    return code, None
