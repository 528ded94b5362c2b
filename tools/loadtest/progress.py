"""What the load test shows while it runs: its own lines and a live progress display (phase,
stage, elapsed time, requests, errors), with the libraries' per-request log lines kept out."""

from __future__ import annotations

import math
import sys
import time

import trio

from protocol.log_lines import quiet_chatty_loggers
from tools.loadtest.load import Load

_LIVE = sys.stderr.isatty()


def quiet_libraries() -> None:
    """Keep the libraries' per-request INFO lines (httpx: one per request, ~20,000 for
    --quick) out of the load test's output, even with -v: they would bury its progress."""
    quiet_chatty_loggers(verbose=False)


def say(text: str) -> None:
    # On a terminal, clear the live progress line first; it is redrawn on its next tick.
    clear = "\r\x1b[K" if _LIVE else ""
    print(f"{clear}[loadtest {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def progress_line(load: Load, instances: int, now: float, *, done: bool = False) -> str:
    """One line of live progress: phase, stage, elapsed time, requests, errors."""
    if done:
        stage = "done"
    elif math.isnan(load.t0) or now < load.t0:
        stage = "starting"
    elif now < load.hold_end:
        stage = "ramp"
    elif now < load.steady_end:
        stage = "steady"
    else:
        stage = "after the kill" if load.killed is not None else "draining"
    elapsed = 0.0 if math.isnan(load.t0) else max(0.0, now - load.t0)
    records = load.records
    errors = sum(1 for rec in records if rec.outcome == "error")
    return (
        f"{instances} instance(s) | {stage} | {elapsed:5.0f} s | {len(records)} requests, "
        f"{load.in_flight} in flight | {errors} errors"
    )


async def show_progress(load: Load, instances: int) -> None:
    """A live line on a terminal (redrawn every second), elsewhere a line every 5 s; when
    cancelled (the phase's load is over), the phase's final figures as a line of their own."""
    every = 1.0 if _LIVE else 5.0
    try:
        while True:
            await trio.sleep(every)
            line = progress_line(load, instances, time.monotonic())
            if _LIVE:
                print(f"\r\x1b[K{line}", end="", file=sys.stderr, flush=True)
            else:
                say(line)
    finally:
        say(progress_line(load, instances, time.monotonic(), done=True))
