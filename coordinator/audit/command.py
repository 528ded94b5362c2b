"""``gemmanet audit [--json] [--probe]``: read, judge, print; the exit code says whether the
scheduler may be turned on (0), why not (1, reasons listed), or that Redis did not answer (3).
A bad setting is one line on stderr and exit 2 (raised as ``SettingsError`` for the CLI)."""

from __future__ import annotations

import json
import logging
from functools import partial

import trio

from coordinator.audit.findings import judge
from coordinator.audit.observe import observe
from coordinator.audit.render import render_text
from coordinator.errors import SettingsError
from coordinator.settings import Settings

__all__ = ["run_audit_command"]


def run_audit_command(settings: Settings, *, as_json: bool, probe: bool) -> int:
    if not settings.redis_url:
        raise SettingsError(
            "gemmanet audit needs GEMMANET_REDIS_URL: it reads the monitor's facts and the "
            "instance registry from Redis/Valkey, with the instances' own settings"
        )
    if logging.getLogger().level > logging.DEBUG:
        # httpx logs every --probe request at INFO; the report already says how each went.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    observed = trio.run(partial(observe, settings, probe=probe))
    report = judge(settings, observed)
    if as_json:
        print(json.dumps(report.document, indent=2))
    else:
        print(render_text(report.document))
    return report.exit_code
