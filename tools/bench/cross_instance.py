"""Open-loop latency of a request that crosses instances over the Redis bus, against one that
does not, side by side, on the pub/sub bus's Redis client (the lean one, named ``lean`` in the
report); with raw round trips for scale.

A pair of coordinator instances, A and B, share a private ``redis-server``
(``GEMMANET_MULTI_INSTANCE=1``, a key prefix of its own). An echo node (0 ms) serving model
``remote`` is connected to A, one serving ``local`` to B; all requests go to B, so ``remote`` takes the hop B -> A -> node -> A -> B over the bus and ``local`` does not.
Requests are sent on a fixed schedule whatever the answers do (open loop), the kinds interleaved
in every cycle, and each latency is taken from the *scheduled* send time, so a stall delays every
request scheduled during it (no coordinated omission). In the same cycles, for scale: a raw
pub/sub round trip (PUBLISH ping -> a subscriber republishes -> PUBLISH pong received) through
two ``RedisCoordination`` clients in this process, a PING over a bare socket,
and, when ``channels_redis`` is installed (the ``bench`` extra), the same lap through Django
Channels' Redis pub/sub layer (``channels_probe``, its own asyncio process, same rate and span).

Then the CPU cost of the hop, in closed-loop rounds (``--concurrency`` client tasks, one
request after another) alternating ``remote`` and ``local``: the CPU of A and B
together per answered request (each process's too: nodes, redis-server, the client), and the
ratio remote/local of the two instances together (the aim: at most 1.6). ``--py-spy DIR``
profiles A and B over an extra remote round and B over an extra local one
(after the measured rounds, so py-spy's own CPU stays out of them).

    python -m tools.bench.cross_instance [--rate R] [--duration S] [--cpu-duration S] [--json FILE]
    python -m tools.bench.cross_instance --py-spy /tmp/prof   # + profiles of A and B
    python -m tools.bench.cross_instance --quick     # ~20 s, for smoke use

``--rate`` is the request rate to B, split evenly between the two models (default 50 req/s:
25/s remote + 25/s local; every other kind 25/s too).
"""

import argparse
import os
import sys
from pathlib import Path

import trio

from tools.bench import _profile
from tools.bench._cross_cpu import cpu_rounds, print_cpu, print_profiles
from tools.bench._cross_latency import CLIENTS, measure, print_report, report
from tools.bench._harness import (
    Harness,
    exit_code_for,
    install_signal_handlers,
    wait_until,
    write_json,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.cross_instance", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=50.0,
        help="requests/s to B, half remote, half local (default 50)",
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="measured seconds (default 40; --quick 4)"
    )
    parser.add_argument("--keys", type=int, default=4, help="API keys used in turn (default 4)")
    parser.add_argument(
        "--cpu-duration",
        type=float,
        default=None,
        help="seconds of the CPU rounds per pair, both kinds (default 20; --quick 2)",
    )
    parser.add_argument(
        "--cpu-rounds",
        type=int,
        default=None,
        help="CPU rounds of each kind (default 5; --quick 2)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="client tasks in the CPU rounds (default 8)"
    )
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        type=Path,
        default=None,
        help="profile A and B with py-spy in extra rounds after the measured ones",
    )
    parser.add_argument(
        "--py-spy-seconds",
        type=float,
        default=None,
        help="each profiled round (default 15; --quick 2)",
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
        args.duration = 4.0 if args.quick else 40.0
    if args.cpu_duration is None:
        args.cpu_duration = 2.0 if args.quick else 20.0
    if args.cpu_rounds is None:
        args.cpu_rounds = 2 if args.quick else 5
    if args.py_spy_seconds is None:
        args.py_spy_seconds = 2.0 if args.quick else 15.0
    if not (args.rate > 0 and args.duration > 0 and args.keys >= 1):
        parser.error("--rate, --duration and --keys must be positive")
    if not (args.cpu_duration > 0 and args.cpu_rounds >= 1 and args.concurrency >= 1):
        parser.error("--cpu-duration, --cpu-rounds and --concurrency must be positive")
    if args.py_spy and not _profile.available():
        parser.error("--py-spy needs py-spy beside this Python or on PATH (pip install py-spy)")
    if args.rate * args.duration > 100_000:
        parser.error("at most 100000 requests per run (--rate x --duration)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    warmup_s = 1.0 if args.quick else 3.0
    settings = {"rate": args.rate, "duration_s": args.duration, "warmup_s": warmup_s,
                "api_keys": args.keys, "quick": args.quick, "concurrency": args.concurrency,
                "cpu_rounds": args.cpu_rounds,
                "cpu_round_s": args.cpu_duration / (2 * args.cpu_rounds)}  # fmt: skip
    try:
        with Harness(keep=args.keep, GEMMANET_RATE_LIMIT="1000000/minute") as harness:
            if args.keep:
                print(f"logs in {harness.dir}", file=sys.stderr)
            redis_url = harness.redis()
            harness.env.update(GEMMANET_REDIS_URL=redis_url, GEMMANET_MULTI_INSTANCE="1")
            keys = harness.create_keys(args.keys)
            pids = {"redis": harness.procs[0].popen.pid}
            b_urls: dict[str, str] = {}
            coordinators = []
            for client in CLIENTS:
                x = "" if client == CLIENTS[0] else "2"
                pair = {"GEMMANET_KEY_PREFIX": f"bench{os.getpid()}{client}"}
                a = harness.coordinator(f"instance-A{x}", GEMMANET_INSTANCE_ID=f"A{x}", **pair)
                b = harness.coordinator(f"instance-B{x}", GEMMANET_INSTANCE_ID=f"B{x}", **pair)
                wait_until(
                    lambda a=a, b=b: a.status()["instances"] == 2 and b.status()["instances"] == 2,
                    f"A{x} and B{x} to see each other",
                )
                node_a = harness.node(a, f"node-on-A{x}", ["remote"])
                node_b = harness.node(b, f"node-on-B{x}", ["local"])
                wait_until(
                    lambda b=b, x=x: (
                        {n["node_id"]: n["instance_id"] for n in b.nodes()}
                        == {f"node-on-A{x}": f"A{x}", f"node-on-B{x}": f"B{x}"}
                    ),
                    f"B{x} to see the node of A{x}",
                )
                pids.update({f"A{x}": a.proc.popen.pid, f"B{x}": b.proc.popen.pid,
                             f"node_A{x}": node_a.popen.pid, f"node_B{x}": node_b.popen.pid})  # fmt: skip
                b_urls[client] = b.url
                coordinators += [(f"A{x}", a), (f"B{x}", b)]
            samples, cpu, elapsed, channels_note = trio.run(
                measure, b_urls, redis_url, keys, args.rate, args.duration, warmup_s, pids
            )
            cpu_data, profiled = trio.run(cpu_rounds, b_urls, keys, pids, args)
            for proc in harness.procs:
                proc.check_alive()
            data = report(samples, cpu, elapsed, settings, channels_note)
            data["cpu"] = cpu_data
            data["diagnostics"] = {
                name: coord.status().get("diagnostics") for name, coord in coordinators
            }
            data["log_lines_with_error"] = harness.logs_with("ERROR")
            data["log_lines_with_warning"] = harness.logs_with("WARNING")
    except BaseException as exc:  # noqa: BLE001 - exit_code_for raises again what is not a failure or an interrupt
        return exit_code_for("cross-instance", exc)
    print_report(data)
    print_cpu(data)
    if profiled:
        print_profiles(data, profiled, args.py_spy, args.top)
    if data["log_lines_with_error"] or data["log_lines_with_warning"]:
        print(
            f"log lines with ERROR: {data['log_lines_with_error']}, "
            f"with WARNING: {data['log_lines_with_warning']}"
        )
    write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
