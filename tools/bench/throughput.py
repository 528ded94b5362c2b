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
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from tools.bench import _profile
from tools.bench._closed_loop import (
    Call,
    RoundResult,
    closed_loop_round,
    cpu_now,
    cpu_since,
    round_order,
)
from tools.bench._harness import (
    Harness,
    error_label,
    exit_code_for,
    install_signal_handlers,
    write_json,
)
from tools.bench._throughput_report import print_report, profile_report, report


@dataclass(frozen=True)
class Kind:
    name: str
    label: str
    call: Call
    #: chunks each answered operation carries (streams), 0 for none
    chunks: int = 0


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
