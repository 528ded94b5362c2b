"""The open-loop latency part of ``cross_instance.py``: requests to each B on a fixed schedule,
remote (over the bus to A) and local interleaved with the raw round trips for scale (pub/sub on
the bus client, a bare socket PING, Django Channels' layer when installed); the figures, the
hop (remote - local) against the seed's budget and our aim, and the printed table. Also the
names both parts share (the pair's bus client, the kinds, the request timeout).
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import httpx
import trio

from tools.bench._harness import (
    LOOPBACK,
    cores,
    cpu_seconds,
    error_label,
    fmt_ms,
    header_line,
    now_text,
    summary_ms,
)
from tools.bench._probes import PubSubProbe, SocketProbe, channels_round_trips

# The bus client of the one pair: the pub/sub bus has one client (a coredis pair, A2 and B2,
# was measured beside it until that client was removed). The report keeps naming the pair by it.
CLIENTS = ("lean",)
KINDS = ("remote", "local", "pubsub", "socket")
CHANNELS = "channels"
# One cycle every 2/rate s; the kinds take evenly spaced slots in it.
CYCLE = ("remote", "pubsub", "local", "socket")
BUDGET_MS = {"p95": 20.0, "p99": 50.0}  # the seed's budget for the cross-instance hop
AIM_MS = {"p95": 1.0}  # ours (issue 11), also: no worse than Channels' round trip
REQUEST_TIMEOUT_S = 10.0
DRAIN_S = 12.0


def suffix(client: str) -> str:
    return "" if client == CLIENTS[0] else f"_{client}"


class Samples:
    def __init__(self) -> None:
        self.latencies: dict[str, list[float]] = {kind: [] for kind in (*KINDS, CHANNELS)}
        self.errors: dict[str, Counter[str]] = {kind: Counter() for kind in (*KINDS, CHANNELS)}
        self.lag: list[float] = []  # actual send start - scheduled time, all kinds
        self.scheduled: Counter[str] = Counter()

    def ok(self, kind: str, latency_s: float) -> None:
        self.latencies[kind].append(latency_s)

    def error(self, kind: str, label: str) -> None:
        self.errors[kind][label] += 1


async def open_loop(
    clients: dict[str, httpx.AsyncClient],
    keys: list[str],
    probes: dict[str, PubSubProbe | SocketProbe],
    rate: float,
    duration_s: float,
    samples: Samples | None,
) -> None:
    """One schedule: every 2/rate s a cycle of every kind, evenly spaced."""
    interval = 2.0 / rate
    cycles = max(1, math.ceil(duration_s * rate / 2))
    sent = [0]

    async def request(kind: str, scheduled: float) -> None:
        model, _, client = kind.partition("_")
        i = sent[0] = sent[0] + 1
        prompt = f"{model} {i}"
        try:
            response = await clients[client or CLIENTS[0]].post(
                "/api/v1/request",
                json={"model": model, "prompt": prompt},
                headers={"Authorization": f"Bearer {keys[i % len(keys)]}"},
            )
            finished = trio.current_time()
            output = response.json().get("output") if response.status_code == 200 else None
        except Exception as exc:  # noqa: BLE001 - counted by type, the run goes on
            if samples is not None:
                samples.error(kind, type(exc).__name__)
            return
        if samples is None:
            return
        if response.status_code != 200:
            samples.error(kind, error_label(response))
        elif output != prompt:
            samples.error(kind, "200 wrong output")
        else:
            samples.ok(kind, finished - scheduled)

    async def fire(kind: str, scheduled: float) -> None:
        if samples is not None:
            samples.lag.append(trio.current_time() - scheduled)
            samples.scheduled[kind] += 1
        if kind in probes:
            await probes[kind].round_trip(scheduled, samples)
        else:
            await request(kind, scheduled)

    start = trio.current_time() + 0.05
    with trio.move_on_after(duration_s + DRAIN_S + 1):
        async with trio.open_nursery() as nursery:
            for cycle in range(cycles):
                base = start + cycle * interval
                for slot, kind in enumerate(CYCLE):
                    scheduled = base + slot * interval / len(CYCLE)
                    await trio.sleep_until(scheduled)
                    nursery.start_soon(fire, kind, scheduled)


async def measure(
    b_urls: dict[str, str],
    redis_url: str,
    keys: list[str],
    rate: float,
    duration_s: float,
    warmup_s: float,
    pids: dict[str, int],
) -> tuple[Samples, dict[str, float], float, dict[str, Any]]:
    probes: dict[str, PubSubProbe | SocketProbe] = {
        f"pubsub{suffix(c)}": PubSubProbe(
            redis_url, f"benchps{os.getpid()}{c}", f"pubsub{suffix(c)}"
        )
        for c in CLIENTS
    }
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    probes["socket"] = SocketProbe(LOOPBACK, port)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    channels: dict[str, Any] = {}
    async with AsyncExitStack() as stack:
        clients = {
            c: await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits)
            )
            for c, url in b_urls.items()
        }
        nursery = await stack.enter_async_context(trio.open_nursery())
        for probe in probes.values():
            await nursery.start(probe.run)

        async def run_channels() -> None:
            # Its laps overlap ours: same rate, its own warm-up, the same measured span.
            channels.update(await channels_round_trips(redis_url, rate / 2, warmup_s, duration_s))

        nursery.start_soon(run_channels)
        await open_loop(clients, keys, probes, rate, warmup_s, None)
        samples = Samples()
        cpu_before = {n: cpu_seconds(p) for n, p in pids.items()}
        cpu_before["client"] = time.process_time()
        started = time.perf_counter()
        await open_loop(clients, keys, probes, rate, duration_s, samples)
        elapsed = time.perf_counter() - started
        cpu = {n: cpu_seconds(p) - cpu_before[n] for n, p in pids.items()}
        cpu["client"] = time.process_time() - cpu_before["client"]
        with trio.move_on_after(REQUEST_TIMEOUT_S + DRAIN_S):
            while not channels:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    if "latencies_s" in channels:
        samples.latencies[CHANNELS] = list(channels["latencies_s"])
        samples.errors[CHANNELS].update(channels.get("errors", {}))
        samples.scheduled[CHANNELS] = len(channels["latencies_s"]) + sum(
            channels.get("errors", {}).values()
        )
    note = {k: v for k, v in channels.items() if k != "latencies_s"}
    return samples, {n: s / elapsed for n, s in cpu.items()}, elapsed, note


def report(
    samples: Samples,
    cpu: dict[str, float],
    elapsed: float,
    settings: dict[str, Any],
    channels_note: dict[str, Any],
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "benchmark": "cross_instance",
        "cores": cores(),
        "date": now_text(),
        "settings": settings,
        "seconds": elapsed,
        "cpu_utilisation": cpu,
        "send_lag_ms": {
            "p50": summary_ms(samples.lag)["p50_ms"],
            "p99": summary_ms(samples.lag)["p99_ms"],
            "max": summary_ms(samples.lag)["max_ms"],
        },
    }
    kinds = [*KINDS, *([CHANNELS] if samples.scheduled[CHANNELS] else [])]
    if channels_note:
        data["channels_note"] = channels_note
    for kind in kinds:
        # Cut off by the run's hard deadline before any answer or error: counted, not hidden.
        unfinished = (
            samples.scheduled[kind]
            - len(samples.latencies[kind])
            - sum(samples.errors[kind].values())
        )
        if unfinished > 0:
            samples.errors[kind]["unfinished"] += unfinished
        data[kind] = {
            **summary_ms(samples.latencies[kind]),
            "ok": len(samples.latencies[kind]),
            "scheduled": samples.scheduled[kind],
            "errors": dict(samples.errors[kind]),
        }
    for client in CLIENTS:
        s = suffix(client)
        data[f"difference{s}_ms"] = {
            q: data[f"remote{s}"][f"{q}_ms"] - data[f"local{s}"][f"{q}_ms"]
            for q in ("p50", "p95", "p99")
        }
    diff = data["difference_ms"]
    data["budget_ms"] = BUDGET_MS
    data["aim_ms"] = AIM_MS
    data["within_budget"] = diff["p95"] <= BUDGET_MS["p95"] and diff["p99"] <= BUDGET_MS["p99"]
    data["within_aim"] = diff["p95"] <= AIM_MS["p95"]
    if CHANNELS in data:
        data["no_worse_than_channels"] = diff["p95"] <= data[CHANNELS]["p95_ms"]
    return data


LABELS = {
    "remote": "remote (B -> bus -> A -> node)",
    "local": "local (B -> node)",
    "pubsub": "raw pub/sub round trip",
    "socket": "bare socket PING round trip",
    CHANNELS: "Django Channels pub/sub round trip",
}


def print_report(data: dict[str, Any]) -> None:
    s = data["settings"]
    print(header_line())
    print(
        f"open loop to each B at {s['rate']:g} req/s for {data['seconds']:.1f} s "
        f"(remote and local alternating, {s['rate'] / 2:g}/s each, per bus client; every other"
        f" round trip {s['rate'] / 2:g}/s, interleaved); latency from the scheduled send time"
    )
    print()
    print(f"{'':44}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}{'ok':>7}  errors")

    def row(label: str, d: dict[str, Any]) -> None:
        print(
            f"{label:44}{fmt_ms(d['p50_ms']):>9}{fmt_ms(d['p95_ms']):>9}"
            f"{fmt_ms(d['p99_ms']):>9}{fmt_ms(d['max_ms']):>9}{d['ok']:7d}  {d['errors'] or '-'}"
        )

    for client in CLIENTS:
        x = suffix(client)
        for kind in ("remote", "local", "pubsub"):
            row(f"{client:8}{LABELS[kind]}", data[kind + x])
        diff = data[f"difference{x}_ms"]
        print(
            f"{client:8}{'hop: remote - local':36}{fmt_ms(diff['p50']):>9}{fmt_ms(diff['p95']):>9}"
            f"{fmt_ms(diff['p99']):>9}"
        )
    row(f"{'':8}{LABELS['socket']}", data["socket"])
    if CHANNELS in data:
        row(f"{'':8}{LABELS[CHANNELS]}", data[CHANNELS])
    else:
        print(f"{'':8}{LABELS[CHANNELS]}: not measured ({data.get('channels_note') or 'n/a'})")
    print()
    verdict = "within" if data["within_budget"] else "OVER"
    aim = "met" if data["within_aim"] else "not met"
    print(
        f"seed budget for the hop: p95 <= {BUDGET_MS['p95']:g} ms, p99 <= {BUDGET_MS['p99']:g} ms"
        f" -> {verdict}; our aim p95 <= {AIM_MS['p95']:g} ms (lean) -> {aim}"
        + (
            f"; no worse than Channels' p95 -> {'yes' if data['no_worse_than_channels'] else 'no'}"
            if CHANNELS in data
            else ""
        )
    )
    lag = data["send_lag_ms"]
    if lag["p99"] > 10:
        print(
            "WARNING: the load generator fell behind its schedule (send lag p99 "
            f"{lag['p99']:.0f} ms): the figures show an overloaded client or box, not the hop"
        )
    cpu = "  ".join(f"{n} {u:.0%}" for n, u in data["cpu_utilisation"].items())
    print(
        f"load generator send lag p50 {lag['p50']:.2f} ms, p99 {lag['p99']:.2f} ms, "
        f"max {lag['max']:.2f} ms; CPU (share of one core): {cpu}"
    )
