"""The enablement gate in the audit, pure: the report's ``host_placement`` section, its line of
text, and whether ``gemmanet audit --enable`` may turn the switch on (``command.py`` writes it).

The switch is turned on only from a report with no reason at all (every gate green: exit 0)
and an operator file that lists direct hosts; otherwise the refusal names the red gates.
Turning it off needs no gate. The rule instances follow is ``core/hosts/gate.py``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from coordinator.audit.nodes import Finding
from coordinator.coordination.monitor_types import PlacementSwitch
from coordinator.core.hosts.gate import hosts_placeable
from coordinator.errors import SettingsError
from coordinator.settings import Settings

__all__ = [
    "check_by",
    "enable_refusal",
    "gate_line",
    "gate_warnings",
    "placement_document",
    "utc",
]

_BY = re.compile(r"[A-Za-z0-9._@:+-]{1,64}")


def check_by(name: str) -> str:
    """``--by NAME``: who switches, as the report shows it."""
    if not _BY.fullmatch(name):
        raise SettingsError(
            f"--by {name!r}: 1-64 characters of A-Z a-z 0-9 . _ @ : + - (who switched the gate)"
        )
    return name


def utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def placement_document(
    settings: Settings, switch: PlacementSwitch | None, known: bool
) -> dict[str, Any]:
    """``host_placement``: the setting, the switch as read, and whether an instance with these
    settings places on hosts now (null: the store was not read and the setting defers to it)."""
    mode = settings.host_placement
    placing = (
        hosts_placeable(mode, switch.enabled if switch else None)
        if known or mode != "gated"
        else None
    )
    return {
        "mode": mode,
        "placing": placing,
        "switch": None if switch is None else switch.to_json(),
    }


def gate_warnings(settings: Settings) -> list[Finding]:
    """A setting that does not follow the switch, where there are hosts it would govern."""
    mode = settings.host_placement
    if mode == "gated" or not settings.capacity.hosts:
        return []
    does = "as soon as their facts are fresh" if mode == "on" else "never"
    message = (
        f"GEMMANET_HOST_PLACEMENT={mode}: instances with this setting place on direct hosts "
        f"{does}, whatever the switch of gemmanet audit --enable/--disable"
    )
    return [Finding("placement_not_gated", message)]


def enable_refusal(
    settings: Settings, reasons: list[Finding], redis_error: str | None
) -> str | None:
    """Why ``--enable`` must not turn the switch on (one line), or None: it may."""
    if redis_error is not None:
        return (
            f"audit --enable refused: Redis is unreachable ({redis_error}); the switch is unchanged"
        )
    if not settings.capacity.hosts:
        return (
            "audit --enable refused: the operator file (GEMMANET_CAPACITY_FILE) lists no "
            "[hosts]: there is no placement on direct hosts to switch on"
        )
    if reasons:
        red = ", ".join(f.code if f.subject is None else f"{f.code} ({f.subject})" for f in reasons)
        return f"audit --enable refused: not ready: {red}; the switch is unchanged"
    return None


def gate_line(doc: dict[str, Any]) -> str | None:
    """The report's line about the gate (None: nothing to say: no hosts, never switched)."""
    placement = doc["host_placement"]
    switch = placement["switch"]
    if not doc["hosts"] and switch is None:
        return None
    mode = placement["mode"]
    if switch is None:
        said = "never switched on (gemmanet audit --enable, once ready)"
    else:
        state = "ENABLED" if switch["enabled"] else "disabled"
        said = f"{state} by {switch['by']} at {utc(switch['at'])}"
        if switch["epoch"] is not None:
            said += f" (monitor epoch {switch['epoch']})"
    if mode != "gated":
        return f"gate     GEMMANET_HOST_PLACEMENT={mode}: the switch is not followed ({said})"
    placing = placement["placing"]
    verdict = "placing on hosts" if placing else ("?" if placing is None else "hosts unused")
    return f"gate     {said}: {verdict}"
