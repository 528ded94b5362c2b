"""Closed-loop throughput of ``POST /api/v1/request`` against ``GET /healthz``, side by side.

One coordinator instance (embedded coordination, temp SQLite), one echo node agent (0 ms,
64 parallel). ``--concurrency`` client tasks each send one request after another for a round;
rounds of requests and of health checks alternate, so drift on a shared box hits both alike.
``/healthz`` is the cost floor of the HTTP stack (Hypercorn + Quart + client), so the ratio
request/healthz says how much the task path (auth, rate limit, placement, node round trip, store)
costs on top.

    python -m tools.bench.throughput [--duration S] [--concurrency N] [--rounds K] [--json FILE]
    python -m tools.bench.throughput --quick     # ~10 s, for smoke use
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio

from tools.bench._harness import (
    Harness,
    cores,
    cpu_seconds,
    error_label,
    exit_code_for,
    fmt_ms,
    header_line,
    install_signal_handlers,
    now_text,
    summary_ms,
    write_json,
)

KINDS = ("request", "healthz")
# Safety bound on the requests of one round, whatever the duration.
MAX_REQUESTS_PER_ROUND = 200_000


class RoundResult:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.elapsed = 0.0
        #: CPU seconds each process spent during the round
        self.cpu: dict[str, float] = {}

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed > 0 else 0.0


Call = Callable[[int, int], Awaitable[httpx.Response]]


async def closed_loop_round(
    kind: str,
    call: Call,
    check: Callable[[httpx.Response, int], bool],
    concurrency: int,
    duration_s: float,
) -> RoundResult:
    result = RoundResult(kind)
    budget = [MAX_REQUESTS_PER_ROUND]
    started = time.perf_counter()
    deadline = started + duration_s

    async def worker(w: int) -> None:
        i = 0
        while time.perf_counter() < deadline and budget[0] > 0:
            budget[0] -= 1
            i += 1
            t0 = time.perf_counter()
            try:
                response = await call(w, i)
            except httpx.HTTPError as exc:
                result.errors[type(exc).__name__] += 1
                continue
            elapsed = time.perf_counter() - t0
            if response.status_code == 200 and check(response, i):
                result.latencies.append(elapsed)
            elif response.status_code == 200:
                result.errors["200 wrong body"] += 1
            else:
                result.errors[error_label(response)] += 1

    # Hard bound: a round never outlives its duration by more than the request timeout.
    with trio.move_on_after(duration_s + 15):
        async with trio.open_nursery() as nursery:
            for w in range(concurrency):
                nursery.start_soon(worker, w)
    result.elapsed = time.perf_counter() - started
    return result


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    return {"client": time.process_time(), **{name: cpu_seconds(pid) for name, pid in pids.items()}}


async def measure(
    url: str,
    keys: list[str],
    concurrency: int,
    rounds: int,
    round_s: float,
    warmup_s: float,
    pids: dict[str, int],
) -> dict[str, list[RoundResult]]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as client:
        headers = [{"Authorization": f"Bearer {key}"} for key in keys]

        async def request(w: int, i: int) -> httpx.Response:
            return await client.post(
                "/api/v1/request",
                json={"model": "echo", "prompt": f"w{w} r{i}"},
                headers=headers[w % len(headers)],
            )

        def request_ok(response: httpx.Response, i: int) -> bool:
            return str(response.json().get("output", "")).endswith(f" r{i}")

        async def healthz(w: int, i: int) -> httpx.Response:
            return await client.get("/healthz")

        def healthz_ok(response: httpx.Response, i: int) -> bool:
            return bool(response.json() == {"ok": True})

        plan = {"request": (request, request_ok), "healthz": (healthz, healthz_ok)}
        # Warm-up (not recorded): opens the connections, fills caches, JITs nothing but wakes
        # everything up.
        for kind in KINDS:
            await closed_loop_round(kind, *plan[kind], concurrency, warmup_s)
        results: dict[str, list[RoundResult]] = {kind: [] for kind in KINDS}
        for r in range(rounds):
            # ABBA order so neither kind always goes first after the other.
            order = KINDS if r % 2 == 0 else KINDS[::-1]
            for kind in order:
                before = cpu_now(pids)
                result = await closed_loop_round(kind, *plan[kind], concurrency, round_s)
                after = cpu_now(pids)
                result.cpu = {name: after[name] - before[name] for name in before}
                results[kind].append(result)
        return results


def aggregate(rounds: list[RoundResult]) -> dict[str, Any]:
    latencies = [x for r in rounds for x in r.latencies]
    errors: Counter[str] = Counter()
    for r in rounds:
        errors.update(r.errors)
    elapsed = sum(r.elapsed for r in rounds)
    cpu = {name: sum(r.cpu.get(name, math.nan) for r in rounds) for name in rounds[0].cpu}
    ok = len(latencies)
    return {
        # CPU time per successful request, by process: steadier than req/s on a noisy box.
        "cpu_ms_per_request": {
            name: (seconds * 1000 / ok if ok else math.nan) for name, seconds in cpu.items()
        },
        "cpu_utilisation": {name: seconds / elapsed for name, seconds in cpu.items()},
        "throughput_rps": len(latencies) / elapsed if elapsed > 0 else 0.0,
        "rounds_rps": [round(r.rps, 1) for r in rounds],
        "ok": len(latencies),
        "errors": dict(errors),
        "seconds": elapsed,
        **summary_ms(latencies),
    }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def report(results: dict[str, list[RoundResult]], settings: dict[str, Any]) -> dict[str, Any]:
    req, hz = aggregate(results["request"]), aggregate(results["healthz"])

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else math.nan

    paired = [
        ratio(a.rps, b.rps) for a, b in zip(results["request"], results["healthz"], strict=True)
    ]
    return {
        "benchmark": "throughput",
        "cores": cores(),
        "date": now_text(),
        "settings": settings,
        "request": req,
        "healthz": hz,
        "ratios": {
            "throughput": ratio(req["throughput_rps"], hz["throughput_rps"]),
            "throughput_per_round": [round(x, 3) for x in paired],
            "throughput_median_of_rounds": _median(paired),
            "p50": ratio(req["p50_ms"], hz["p50_ms"]),
            "p95": ratio(req["p95_ms"], hz["p95_ms"]),
            "p99": ratio(req["p99_ms"], hz["p99_ms"]),
            "coordinator_cpu_per_request": ratio(
                req["cpu_ms_per_request"]["coordinator"], hz["cpu_ms_per_request"]["coordinator"]
            ),
        },
    }


def print_report(data: dict[str, Any]) -> None:
    s = data["settings"]
    print(header_line())
    print(
        f"closed loop, concurrency {s['concurrency']}, {s['rounds']} alternating rounds of "
        f"{s['round_s']:.1f} s each kind, {s['api_keys']} API keys, one echo node (0 ms)"
    )
    print()
    print(f"{'':22}{'req/s':>10}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'ok':>9}  errors")
    for kind, label in (("request", "POST /api/v1/request"), ("healthz", "GET /healthz")):
        d = data[kind]
        print(
            f"{label:22}{d['throughput_rps']:10.1f}{fmt_ms(d['p50_ms']):>10}"
            f"{fmt_ms(d['p95_ms']):>10}{fmt_ms(d['p99_ms']):>10}{d['ok']:9d}  "
            f"{d['errors'] or '-'}"
        )
    r = data["ratios"]
    print()
    print(
        f"ratio request/healthz: throughput {r['throughput']:.3f} "
        f"(per round {r['throughput_per_round']}, median {r['throughput_median_of_rounds']:.3f})"
    )
    print(
        f"                       latency p50 {r['p50']:.2f}x  p95 {r['p95']:.2f}x  "
        f"p99 {r['p99']:.2f}x"
    )
    print(
        f"                       coordinator CPU per request "
        f"{r['coordinator_cpu_per_request']:.2f}x"
    )
    print(
        f"rounds req/s: request {data['request']['rounds_rps']}  "
        f"healthz {data['healthz']['rounds_rps']}"
    )
    print()
    print("CPU ms per answered request (and share of one core used) by process:")
    for kind in KINDS:
        per = data[kind]["cpu_ms_per_request"]
        use = data[kind]["cpu_utilisation"]
        cells = "  ".join(f"{name} {per[name]:.3f} ({use[name]:.0%})" for name in per)
        print(f"  {kind:8} {cells}")
        if use.get("client", 0) > 0.85:
            print(
                f"  note: the load generator used {use['client']:.0%} of a core in the {kind} "
                "rounds, so their req/s is (partly) the client's limit, not the server's"
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.throughput", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="measured seconds, split over all rounds of both kinds (default 40)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="client tasks in the closed loop (default 8: beyond that the httpx client's own "
        "CPU per request grows and the load generator, not the server, sets the pace)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of each kind, alternating (default 5; --quick 2)",
    )
    parser.add_argument("--keys", type=int, default=8, help="API keys used in turn (default 8)")
    parser.add_argument("--json", metavar="FILE", default=None, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="about 10 s in all, for smoke use")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 4.0 if args.quick else 40.0
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    if args.duration <= 0 or args.rounds < 1 or args.concurrency < 1 or args.keys < 1:
        parser.error("--duration, --rounds, --concurrency and --keys must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    round_s = args.duration / (2 * args.rounds)
    warmup_s = 0.5 if args.quick else 2.0
    settings = {
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "round_s": round_s,
        "warmup_s": warmup_s,
        "api_keys": args.keys,
        "quick": args.quick,
    }
    try:
        with Harness(keep=args.keep, GEMMANET_RATE_LIMIT="1000000/minute") as harness:
            if args.keep:
                print(f"logs in {harness.dir}", file=sys.stderr)
            keys = harness.create_keys(args.keys)
            coord = harness.coordinator("coordinator")
            node = harness.node(coord, "bench-echo", ["echo"], max_parallel=64)
            pids = {
                "coordinator": coord.proc.popen.pid,
                "node": node.popen.pid,
            }
            results = trio.run(
                measure, coord.url, keys, args.concurrency, args.rounds, round_s, warmup_s, pids
            )
            for proc in harness.procs:
                proc.check_alive()
            data = report(results, settings)
            data["coordinator_log_errors"] = harness.logs_with("ERROR")
    except BaseException as exc:  # noqa: BLE001 - exit_code_for raises again what is not a failure or an interrupt
        return exit_code_for("throughput", exc)
    print_report(data)
    if data["coordinator_log_errors"]:
        print(f"ERROR lines in process logs: {data['coordinator_log_errors']}")
    write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
