"""The machine's speed beside the CPU peak: before each phase's load, the CPU one coordinator
instance spends per ``GET /healthz`` in a short closed loop; after it, the phase's CPU peak as a
share of the seed's bound.

A CPU percentage says as much about the machine as about the coordinator: the shared build
machine has run the benchmarks at half its usual speed some hours (docs/benchmarks.md), and a
peak of 60% there is not one of 60% on a machine twice as fast. ``/healthz`` is the cost floor of
the HTTP stack (``tools.bench.throughput`` sets requests against it), so its CPU per answer, taken
on the same machine seconds before the load, tells which machine a peak was measured on. It is
taken before the node helpers start, so the nodes' connects and heartbeats stay out of it, with
the closed loop and the /proc CPU readings of ``tools.bench``.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import trio

from tools.bench._closed_loop import closed_loop_round, cpu_now, cpu_since
from tools.bench._harness import error_label
from tools.loadtest import profile as prof

#: client tasks of the loop: as in tools.bench.throughput, beyond this the client's own CPU sets
#: the pace, not the coordinator's
CONCURRENCY = 8
#: not measured: the instance has just started, its first requests warm it up
WARMUP_S = 0.5


async def _healthz_loop(url: str, pid: int, seconds: float) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as client:

        async def healthz(_worker: int, _call: int) -> str | None:
            response = await client.get("/healthz")
            if response.status_code != 200:
                return error_label(response)
            try:
                body = response.json()
            except ValueError:  # a side measurement: counted, never the end of the load test
                return "200 not JSON"
            return None if body == {"ok": True} else "200 wrong body"

        await closed_loop_round("healthz", healthz, CONCURRENCY, WARMUP_S)
        pids = {"coordinator": pid}
        before = cpu_now(pids)
        result = await closed_loop_round("healthz", healthz, CONCURRENCY, seconds)
        cpu = cpu_since(before, pids)
    ok = len(result.latencies)
    return {
        "healthz_cpu_ms": cpu["coordinator"] * 1000 / ok if ok else math.nan,
        "healthz_cpu_sys_ms": cpu["coordinator.sys"] * 1000 / ok if ok else math.nan,
        "requests": ok,
        "errors": dict(result.errors),
        "rate_per_s": result.rps,
        "seconds": result.elapsed,
        "concurrency": CONCURRENCY,
    }


def measure(url: str, pid: int, instance: str, seconds: float) -> dict[str, Any]:
    """The machine's speed: CPU ms of the coordinator ``pid`` (at ``url``) per ``GET /healthz``
    over ``seconds`` of closed loop (after a short warm-up)."""
    return {"instance": instance, **trio.run(_healthz_loop, url, pid, seconds)}


def cpu_peak(phase: dict[str, Any]) -> dict[str, Any]:
    """The phase's CPU peak (the highest of its instances, the measure of the CPU criterion) and
    that peak as a share of the seed's bound."""
    key = f"cpu_max_{prof.CPU_WINDOW_SAMPLES}s_pct"
    peaks = {
        name: phase["resources_steady"][name][key]
        for name in phase["coordinators"]
        if phase["resources_steady"].get(name, {}).get(key) is not None
    }
    instance = max(peaks, key=lambda name: peaks[name]) if peaks else None
    pct = None if instance is None else peaks[instance]
    return {
        "instance": instance,
        "pct": pct,
        "bound_pct": prof.CPU_LIMIT_PCT,
        "share_of_bound": None if pct is None else pct / prof.CPU_LIMIT_PCT,
    }


def _num(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec)


def peak_and_speed(peak: dict[str, Any], speed: dict[str, Any]) -> str:
    """``CPU peak 41.0 % = 0.59 x the 70 % bound; machine speed 0.81 ms CPU per /healthz``"""
    return (
        f"CPU peak {_num(peak.get('pct'), '.1f')} % = {_num(peak.get('share_of_bound'), '.2f')}"
        f" x the {prof.CPU_LIMIT_PCT:g} % bound; machine speed "
        f"{_num(speed.get('healthz_cpu_ms'), '.2f')} ms CPU per /healthz"
    )


def phase_line(phase: dict[str, Any]) -> str:
    """The summary's line under a phase's row: its peak against the bound, beside the speed of
    the machine it was measured on (and where each was taken)."""
    peak = phase.get("cpu_peak") or {}
    speed = phase.get("machine_speed") or {}
    where = f"{speed.get('instance')}, {_num(speed.get('rate_per_s'), '.0f')} req/s"
    if speed.get("errors"):
        where += f", errors {speed['errors']}"
    return (
        f"{peak_and_speed(peak, speed)} (peak on {peak.get('instance') or 'n/a'}; /healthz on "
        f"{where}, before the load)"
    )
