"""Closed-loop cost of ``POST /api/v1/request`` against ``GET /healthz``, side by side; CPU time
per answered request of each process (coordinator, node agent, the client itself; redis-server
with ``--redis``).

One coordinator instance (embedded coordination, temp SQLite; with ``--redis``, Redis
coordination on a private ``redis-server``), one echo node agent (0 ms, 64 parallel).
``--concurrency`` client tasks each send one request after another for a round; rounds of each
kind alternate (every order in turn), so drift on a shared box hits every kind alike.
``/healthz`` is the cost floor of the HTTP stack (Hypercorn + Quart + client), so the ratio
request/healthz of the coordinator's CPU per answer says how much the task path (auth, rate
limit, admission, placement, node round trip, recorder) costs on top.

``--stream`` (also ``python -m tools.bench.stream``): the kinds are a non-streamed request, a
streamed one whose echo answer is one chunk, and a streamed one of ``--chunks`` N chunks (the
echo backend streams one chunk per word of the prompt, so the prompt has N words). The CPU of
one more chunk (node -> coordinator -> client, one SSE event) is the difference of the two
streamed kinds over N - 1 chunks; it is set against the CPU of a non-streamed request.

``--py-spy DIR``: after the measured rounds, extra rounds of the request kinds (and of
/healthz) with ``py-spy`` recording the coordinator (so its own CPU on the shared cores stays
out of the measured figures); prints the top functions and the split of the CPU by category
(``_profile.py``), raw stacks and summaries in DIR.

    python -m tools.bench.throughput [--duration S] [--concurrency N] [--rounds K] [--json FILE]
    python -m tools.bench.throughput --redis --py-spy /tmp/prof
    python -m tools.bench.throughput --stream --chunks 32
    python -m tools.bench.throughput --quick     # ~10 s, for smoke use
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from tools.bench import _profile
from tools.bench._harness import (
    Harness,
    cores,
    cpu_split,
    error_label,
    exit_code_for,
    fmt_ms,
    header_line,
    install_signal_handlers,
    now_text,
    summary_ms,
    write_json,
)

# Safety bound on the requests of one round, whatever the duration.
MAX_REQUESTS_PER_ROUND = 200_000
#: CPU of these processes is split into user and system time in the report
SPLIT = ("coordinator",)


class RoundResult:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.elapsed = 0.0
        #: CPU seconds each process spent during the round (and "<name>.sys": its system part)
        self.cpu: dict[str, float] = {}

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed > 0 else 0.0


#: one operation of a kind: (worker, its i-th call) -> None when answered right, else an
#: error label
Call = Callable[[int, int], Awaitable[str | None]]


@dataclass(frozen=True)
class Kind:
    name: str
    label: str
    call: Call
    #: chunks each answered operation carries (streams), 0 for none
    chunks: int = 0


async def closed_loop_round(
    kind: str, call: Call, concurrency: int, duration_s: float
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
                error = await call(w, i)
            except httpx.HTTPError as exc:
                result.errors[type(exc).__name__] += 1
                continue
            if error is None:
                result.latencies.append(time.perf_counter() - t0)
            else:
                result.errors[error] += 1

    # Hard bound: a round never outlives its duration by more than the request timeout.
    with trio.move_on_after(duration_s + 15):
        async with trio.open_nursery() as nursery:
            for w in range(concurrency):
                nursery.start_soon(worker, w)
    result.elapsed = time.perf_counter() - started
    return result


def cpu_now(pids: dict[str, int], split: tuple[str, ...] = SPLIT) -> dict[str, float]:
    """CPU seconds so far of the client (this process) and of each of ``pids``; for those
    named in ``split`` also their system part, as ``<name>.sys``."""
    now = {"client": time.process_time()}
    for name, pid in pids.items():
        user, system = cpu_split(pid)
        now[name] = user + system
        if name in split:
            now[f"{name}.sys"] = system
    return now


def cpu_since(
    before: dict[str, float], pids: dict[str, int], split: tuple[str, ...] = SPLIT
) -> dict[str, float]:
    after = cpu_now(pids, split)
    return {name: after[name] - before[name] for name in before}


def round_order(kinds: list[str], r: int) -> list[str]:
    """Round ``r``'s order of the kinds: rotated by r // 2, reversed on odd rounds (2 kinds:
    AB BA BA AB...; 3 kinds: all six orders in six rounds)."""
    shift = (r // 2) % len(kinds)
    order = kinds[shift:] + kinds[:shift]
    return order[::-1] if r % 2 else order


def echo_prompt(words: int, w: int, i: int) -> str:
    """A prompt of ``words`` words (one streamed chunk each) whose last word names the call."""
    return " ".join([f"w{w}"] * (words - 1) + [f"r{i}"])


def make_kinds(
    client: httpx.AsyncClient, keys: list[str], stream: bool, chunks: int
) -> dict[str, Kind]:
    headers = [{"Authorization": f"Bearer {key}"} for key in keys]

    async def request(w: int, i: int) -> str | None:
        response = await client.post(
            "/api/v1/request",
            json={"model": "echo", "prompt": f"w{w} r{i}"},
            headers=headers[w % len(headers)],
        )
        if response.status_code != 200:
            return error_label(response)
        return (
            None if str(response.json().get("output", "")).endswith(f" r{i}") else "200 wrong body"
        )

    async def healthz(w: int, i: int) -> str | None:
        response = await client.get("/healthz")
        if response.status_code != 200:
            return error_label(response)
        return None if response.json() == {"ok": True} else "200 wrong body"

    def streamed(words: int) -> Call:
        async def call(w: int, i: int) -> str | None:
            prompt = echo_prompt(words, w, i)
            async with client.stream(
                "POST",
                "/api/v1/request",
                json={"model": "echo", "prompt": prompt, "stream": True},
                headers=headers[w % len(headers)],
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    return error_label(response)
                body = b"".join([part async for part in response.aiter_raw()])
            events = body.split(b"\n\n")
            deltas = sum(1 for e in events if e.startswith(b'data: {"delta"'))
            last = next((e for e in reversed(events) if e.startswith(b"data: ")), b"")
            if b'"done":true' not in last:
                return "stream without done event"
            if deltas != words:
                return f"{deltas} deltas, not {words}"
            done = httpx.Response(200, content=last[len(b"data: ") :]).json()
            return None if done.get("output") == prompt else "200 wrong output"

        return call

    if not stream:
        return {
            "request": Kind("request", "POST /api/v1/request", request),
            "healthz": Kind("healthz", "GET /healthz", healthz),
        }
    return {
        "request": Kind("request", "POST /api/v1/request", request),
        "stream_one": Kind("stream_one", "streamed, 1 chunk", streamed(1), chunks=1),
        "stream": Kind("stream", f"streamed, {chunks} chunks", streamed(chunks), chunks=chunks),
    }


async def measure(
    url: str,
    keys: list[str],
    args: argparse.Namespace,
    round_s: float,
    warmup_s: float,
    pids: dict[str, int],
) -> tuple[dict[str, list[RoundResult]], dict[str, RoundResult]]:
    """The measured rounds of every kind; then, with ``--py-spy``, one profiled round of each
    kind (not in the figures)."""
    concurrency = args.concurrency
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as client:
        kinds = make_kinds(client, keys, args.stream, args.chunks)
        names = list(kinds)
        # Warm-up (not recorded): opens the connections, fills caches, wakes everything up.
        for name in names:
            await closed_loop_round(name, kinds[name].call, concurrency, warmup_s)
        results: dict[str, list[RoundResult]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in round_order(names, r):
                before = cpu_now(pids)
                result = await closed_loop_round(name, kinds[name].call, concurrency, round_s)
                result.cpu = cpu_since(before, pids)
                results[name].append(result)
        profiled: dict[str, RoundResult] = {}
        if args.py_spy:
            seconds = args.py_spy_seconds
            for name in profile_kinds(args):
                procs = _profile.record(
                    {f"coordinator-{name}": pids["coordinator"]}, seconds, args.py_spy,
                    rate=args.py_spy_rate,
                )  # fmt: skip
                before = cpu_now(pids)
                # py-spy takes a moment to attach: load from before it starts until after it ends.
                result = await closed_loop_round(
                    name, kinds[name].call, concurrency, round(seconds) + 1.0
                )
                result.cpu = cpu_since(before, pids)
                profiled[name] = result
                for proc in procs:
                    await trio.to_thread.run_sync(proc.wait)
        return results, profiled


def profile_kinds(args: argparse.Namespace) -> list[str]:
    return ["stream", "request"] if args.stream else ["request", "healthz"]


def aggregate(rounds: list[RoundResult], chunks: int = 0) -> dict[str, Any]:
    latencies = [x for r in rounds for x in r.latencies]
    errors: Counter[str] = Counter()
    for r in rounds:
        errors.update(r.errors)
    elapsed = sum(r.elapsed for r in rounds)
    cpu = {name: sum(r.cpu.get(name, math.nan) for r in rounds) for name in rounds[0].cpu}
    ok = len(latencies)
    per = {name: (seconds * 1000 / ok if ok else math.nan) for name, seconds in cpu.items()}
    data = {
        # CPU time per successful request, by process: steadier than req/s on a noisy box.
        "cpu_ms_per_request": {n: v for n, v in per.items() if "." not in n},
        "cpu_sys_ms_per_request": {n.split(".")[0]: v for n, v in per.items() if "." in n},
        "cpu_utilisation": {
            name: seconds / elapsed for name, seconds in cpu.items() if "." not in name
        },
        "throughput_rps": len(latencies) / elapsed if elapsed > 0 else 0.0,
        "rounds_rps": [round(r.rps, 1) for r in rounds],
        "rounds_coordinator_cpu_ms": [
            round(r.cpu["coordinator"] * 1000 / len(r.latencies), 4) if r.latencies else math.nan
            for r in rounds
        ],
        "ok": len(latencies),
        "errors": dict(errors),
        "seconds": elapsed,
        **summary_ms(latencies),
    }
    if chunks:
        data["chunks_per_request"] = chunks
    return data


def _median(values: list[float]) -> float:
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def report(
    results: dict[str, list[RoundResult]], settings: dict[str, Any], chunks: dict[str, int]
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "benchmark": "throughput",
        "mode": "stream" if settings["stream"] else "request",
        "cores": cores(),
        "date": now_text(),
        "settings": settings,
    }
    for name, rounds in results.items():
        data[name] = aggregate(rounds, chunks.get(name, 0))
    coord = {name: data[name]["cpu_ms_per_request"]["coordinator"] for name in results}
    if not settings["stream"]:
        req, hz = data["request"], data["healthz"]
        paired = [
            ratio(a.rps, b.rps) for a, b in zip(results["request"], results["healthz"], strict=True)
        ]
        paired_cpu = [
            ratio(a, b)
            for a, b in zip(req["rounds_coordinator_cpu_ms"], hz["rounds_coordinator_cpu_ms"],
                            strict=True)
        ]  # fmt: skip
        data["ratios"] = {
            "throughput": ratio(req["throughput_rps"], hz["throughput_rps"]),
            "throughput_per_round": [round(x, 3) for x in paired],
            "throughput_median_of_rounds": _median(paired),
            "p50": ratio(req["p50_ms"], hz["p50_ms"]),
            "p95": ratio(req["p95_ms"], hz["p95_ms"]),
            "p99": ratio(req["p99_ms"], hz["p99_ms"]),
            # the aim: at most 1.3
            "coordinator_cpu_per_request": ratio(coord["request"], coord["healthz"]),
            "coordinator_cpu_per_request_per_round": [round(x, 3) for x in paired_cpu],
            "coordinator_cpu_per_request_median_of_rounds": _median(paired_cpu),
        }
        return data
    n = chunks["stream"]
    per_process = {}
    for proc in data["stream"]["cpu_ms_per_request"]:
        many = data["stream"]["cpu_ms_per_request"][proc]
        one = data["stream_one"]["cpu_ms_per_request"][proc]
        per_process[proc] = {
            # one more chunk: the difference of the two streamed kinds over N - 1 chunks
            "marginal": (many - one) / (n - 1) if n > 1 else math.nan,
            # the whole streamed request spread over its chunks
            "average": many / n,
        }
    data["cpu_ms_per_chunk"] = per_process
    chunk = per_process["coordinator"]
    per_round = [
        ratio((a - b) / (n - 1), c) if n > 1 else math.nan
        for a, b, c in zip(
            data["stream"]["rounds_coordinator_cpu_ms"],
            data["stream_one"]["rounds_coordinator_cpu_ms"],
            data["request"]["rounds_coordinator_cpu_ms"],
            strict=True,
        )
    ]
    data["ratios"] = {
        # the aim: at most 1/3
        "coordinator_cpu_per_chunk_vs_request": ratio(chunk["marginal"], coord["request"]),
        "coordinator_cpu_per_chunk_vs_request_per_round": [round(x, 3) for x in per_round],
        "coordinator_cpu_per_chunk_vs_request_median_of_rounds": _median(per_round),
        "coordinator_cpu_per_chunk_average_vs_request": ratio(chunk["average"], coord["request"]),
        "coordinator_cpu_stream_one_vs_request": ratio(coord["stream_one"], coord["request"]),
    }
    return data


def print_cpu_table(data: dict[str, Any], kinds: list[str]) -> None:
    print("CPU ms per answered request (and share of one core used) by process:")
    for kind in kinds:
        per = data[kind]["cpu_ms_per_request"]
        use = data[kind]["cpu_utilisation"]
        cells = "  ".join(f"{name} {per[name]:.3f} ({use[name]:.0%})" for name in per)
        sys_ms = data[kind]["cpu_sys_ms_per_request"].get("coordinator", math.nan)
        print(f"  {kind:10} {cells}  [coordinator system part {sys_ms:.3f}]")
        if use.get("client", 0) > 0.85:
            print(
                f"  note: the load generator used {use['client']:.0%} of a core in the {kind} "
                "rounds, so their req/s is (partly) the client's limit, not the server's"
            )


def print_report(data: dict[str, Any], labels: dict[str, str]) -> None:
    s = data["settings"]
    kinds = list(labels)
    print(header_line())
    store = "Redis coordination (private redis-server)" if s["redis"] else "embedded coordination"
    print(
        f"closed loop, concurrency {s['concurrency']}, {s['rounds']} rounds of "
        f"{s['round_s']:.1f} s each kind (alternating), {s['api_keys']} API keys, one echo node "
        f"(0 ms), one coordinator instance, {store}"
    )
    print()
    print(f"{'':26}{'req/s':>10}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'ok':>9}  errors")
    for kind in kinds:
        d = data[kind]
        print(
            f"{labels[kind]:26}{d['throughput_rps']:10.1f}{fmt_ms(d['p50_ms']):>10}"
            f"{fmt_ms(d['p95_ms']):>10}{fmt_ms(d['p99_ms']):>10}{d['ok']:9d}  "
            f"{d['errors'] or '-'}"
        )
    r = data["ratios"]
    print()
    if data["mode"] == "request":
        print(
            f"ratio request/healthz: throughput {r['throughput']:.3f} "
            f"(per round {r['throughput_per_round']}, median {r['throughput_median_of_rounds']:.3f})"
        )
        print(
            f"                       latency p50 {r['p50']:.2f}x  p95 {r['p95']:.2f}x  "
            f"p99 {r['p99']:.2f}x"
        )
        print(
            f"coordinator CPU per request / per healthz: {r['coordinator_cpu_per_request']:.2f}x "
            f"(per round {r['coordinator_cpu_per_request_per_round']}, median "
            f"{r['coordinator_cpu_per_request_median_of_rounds']:.2f}x; aim <= 1.3x)"
        )
    else:
        n = data["stream"]["chunks_per_request"]
        chunk = data["cpu_ms_per_chunk"]
        print(
            "CPU ms per streamed chunk, one more chunk = (streamed N - streamed 1) / (N - 1), "
            f"N = {n}; average = streamed N / N:"
        )
        for proc, v in chunk.items():
            print(f"  {proc:12} one more chunk {v['marginal']:.4f}   average {v['average']:.4f}")
        print(
            f"coordinator CPU per chunk / per non-streamed request: "
            f"{r['coordinator_cpu_per_chunk_vs_request']:.3f} (per round "
            f"{r['coordinator_cpu_per_chunk_vs_request_per_round']}, median "
            f"{r['coordinator_cpu_per_chunk_vs_request_median_of_rounds']:.3f}; aim <= 0.333); "
            f"average per chunk / request {r['coordinator_cpu_per_chunk_average_vs_request']:.3f};"
            f" a 1-chunk stream / request {r['coordinator_cpu_stream_one_vs_request']:.2f}x"
        )
    print("rounds req/s: " + "  ".join(f"{k} {data[k]['rounds_rps']}" for k in kinds))
    print(
        "rounds coordinator CPU ms/request: "
        + "  ".join(f"{k} {data[k]['rounds_coordinator_cpu_ms']}" for k in kinds)
    )
    print()
    print_cpu_table(data, kinds)


def profile_report(
    data: dict[str, Any], profiled: dict[str, RoundResult], out_dir: Path, top: int
) -> None:
    """Summaries in ``out_dir``, the top functions of the first profiled kind and the split by
    category of all of them, printed (ms per operation from the *measured* rounds)."""
    raws = {name: out_dir / f"coordinator-{name}.txt" for name in profiled}
    missing = [str(p) for p in raws.values() if not p.exists()]
    if missing:
        print(f"py-spy wrote no profile: {missing}")
        return
    data["profiles"] = {}
    for name, raw in raws.items():
        text = _profile.summary(raw, top=25)
        raw.with_suffix(".summary").write_text(text + "\n")
        rr = profiled[name]
        ok = len(rr.latencies)
        data["profiles"][name] = {
            "raw": str(raw),
            "ok": ok,
            "coordinator_cpu_ms_per_request_while_profiled": (
                rr.cpu["coordinator"] * 1000 / ok if ok else math.nan
            ),
            "categories": _profile.categories(raw)[1],
        }
    first = next(iter(raws))
    print()
    print(f"py-spy profile of the coordinator over the {first} round (--gil; {out_dir}):")
    print(_profile.summary(raws[first], top=top))
    user = {}
    system = {}
    for name in raws:
        per = data[name]["cpu_ms_per_request"]["coordinator"]
        sys_ms = data[name]["cpu_sys_ms_per_request"]["coordinator"]
        user[name], system[name] = per - sys_ms, sys_ms
    print()
    print(
        "coordinator CPU by category (share of the samples; ms per answered request = share x "
        "user CPU per request of the measured rounds):"
    )
    print(_profile.category_table(raws, user, system))
    (out_dir / "categories.txt").write_text(_profile.category_table(raws, user, system) + "\n")


def parse_args(
    argv: list[str] | None, prog: str = "python -m tools.bench.throughput"
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="measured seconds, split over all rounds of every kind (default 40; --stream 60)",
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
    parser.add_argument(
        "--redis", action="store_true", help="Redis coordination on a private redis-server"
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="streamed requests: CPU per chunk against a non-streamed request",
    )
    parser.add_argument(
        "--chunks", type=int, default=32, help="--stream: chunks of the long stream (default 32)"
    )
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        type=Path,
        default=None,
        help="profile the coordinator with py-spy in extra rounds after the measured ones",
    )
    parser.add_argument(
        "--py-spy-seconds",
        type=float,
        default=None,
        help="length of each profiled round (default 15; --quick 2)",
    )
    parser.add_argument(
        "--py-spy-rate", type=int, default=100, help="py-spy samples per second (default 100)"
    )
    parser.add_argument("--top", type=int, default=10, help="functions printed per table")
    parser.add_argument("--json", metavar="FILE", default=None, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="about 10 s in all, for smoke use")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = (
            (6.0 if args.stream else 4.0) if args.quick else (60.0 if args.stream else 40.0)
        )
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    if args.py_spy_seconds is None:
        args.py_spy_seconds = 2.0 if args.quick else 15.0
    if args.duration <= 0 or args.rounds < 1 or args.concurrency < 1 or args.keys < 1:
        parser.error("--duration, --rounds, --concurrency and --keys must be positive")
    if args.stream and args.chunks < 2:
        parser.error("--chunks must be at least 2")
    if args.py_spy and not _profile.available():
        parser.error("--py-spy needs py-spy beside this Python or on PATH (pip install py-spy)")
    return args


def main(argv: list[str] | None = None, prog: str = "python -m tools.bench.throughput") -> int:
    args = parse_args(argv, prog)
    install_signal_handlers()
    kinds = 3 if args.stream else 2
    round_s = args.duration / (kinds * args.rounds)
    warmup_s = 0.5 if args.quick else 2.0
    settings = {
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "round_s": round_s,
        "warmup_s": warmup_s,
        "api_keys": args.keys,
        "quick": args.quick,
        "redis": args.redis,
        "stream": args.stream,
        "chunks": args.chunks if args.stream else None,
    }
    labels: dict[str, str] = {}
    try:
        with Harness(keep=args.keep, GEMMANET_RATE_LIMIT="1000000/minute") as harness:
            if args.keep:
                print(f"logs in {harness.dir}", file=sys.stderr)
            pids: dict[str, int] = {}
            if args.redis:
                harness.env["GEMMANET_REDIS_URL"] = harness.redis()
                pids["redis"] = harness.procs[-1].popen.pid
            keys = harness.create_keys(args.keys)
            coord = harness.coordinator("coordinator")
            node = harness.node(coord, "bench-echo", ["echo"], max_parallel=64)
            pids = {"coordinator": coord.proc.popen.pid, "node": node.popen.pid, **pids}
            results, profiled = trio.run(measure, coord.url, keys, args, round_s, warmup_s, pids)
            for proc in harness.procs:
                proc.check_alive()
            chunks = {"stream": args.chunks, "stream_one": 1} if args.stream else {}
            data = report(results, settings, chunks)
            data["coordinator_log_errors"] = harness.logs_with("ERROR")
            labels = {
                "request": "POST /api/v1/request",
                **(
                    {"stream_one": "streamed, 1 chunk", "stream": f"streamed, {args.chunks} chunks"}
                    if args.stream
                    else {"healthz": "GET /healthz"}
                ),
            }
    except BaseException as exc:  # noqa: BLE001 - exit_code_for raises again what is not a failure or an interrupt
        return exit_code_for("throughput", exc)
    print_report(data, labels)
    if profiled:
        profile_report(data, profiled, args.py_spy, args.top)
    if data["coordinator_log_errors"]:
        print(f"ERROR lines in process logs: {data['coordinator_log_errors']}")
    write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
