"""How the cost of a cluster grows with the number of connected nodes.

Three coordinator instances share a private ``redis-server``. For each node count (default 200,
2,000 and 10,000) a fresh cluster gets that many light nodes (``tools.bench.scale_fleet``: real
WebSockets speaking protocol v1, spread evenly over the instances), waits until every instance
counts them all (the report gives how long that took and how many "try again later" (1013)
answers the nodes got on the way: a connection storm is paced by them, as with real agents),
and then measures, per instance:

* **idle CPU**: share of one core over ``--idle`` seconds with no requests (nodes heartbeat,
  instances beat and publish their snapshots);
* **Redis bytes per second** over the same window (the server's ``total_net_input_bytes`` +
  ``total_net_output_bytes``, so every instance's traffic together);
* **request latency** p50/p99: an open-loop schedule of ``--rate`` requests/s for
  ``--duration`` s, sent to the instances in turn, each placed on any node of the cluster;
* **placement time**: the coordinator's own placement (``InstanceMachine`` with the cluster's
  nodes in its peers' snapshots: ``submit`` + ``candidates``) timed in this process on the same
  node count, median and p99 of 2,000 placements.

    python -m tools.bench.scale [--nodes 200,2000,10000] [--idle S] [--rate R] [--duration S]
    python -m tools.bench.scale --quick     # 50 and 200 nodes, a few seconds each (smoke)
    python -m tools.bench.scale --nodes 2000 --py-spy DIR   # where the CPU goes, idle and under requests

The light nodes run in separate processes (``--per-fleet`` nodes each) so that the node side
does not starve: their CPU is not counted. Open file limits: 10,000 nodes need about 10,000
descriptors in the fleets and as many across the instances (``ulimit -n``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.registry import InstanceSnapshot, NodeEntry
from protocol import Assign
from tools.bench import _profile
from tools.bench._harness import (
    BenchError,
    Coordinator,
    Harness,
    Proc,
    cores,
    cpu_seconds,
    exit_code_for,
    header_line,
    install_signal_handlers,
    percentile,
    wait_until,
    write_json,
)

INSTANCES = 3
MODEL = "echo"
REQUEST_TIMEOUT_S = 15.0


# -- placement, in process --------------------------------------------------------------------


def placement_times(nodes: int, placements: int = 2000) -> dict[str, float]:
    """Median and p99 (µs) of one placement among ``nodes`` nodes held by two peers."""
    machine = InstanceMachine("I0", forward_grace_s=1.0, rng=random.Random(1))
    peers = []
    for peer in ("I1", "I2"):
        entries = [
            NodeEntry(
                node_id=f"{peer}-n{i}",
                conn_id=f"{peer}-c{i}",
                models=[MODEL],
                max_parallel=4,
                in_flight=i % 3,
            )
            for i in range(nodes // 2)
        ]
        peers.append(InstanceSnapshot(instance_id=peer, in_flight=0, nodes=entries))
    machine.set_peers(peers)
    times = []
    requester = machine.requester
    for i in range(placements):
        task_id = f"t{i}"
        started = time.perf_counter()
        requester.submit(Assign(task_id=task_id, model=MODEL, prompt="x"), deadline=1e9)
        candidates = requester.candidates(task_id, 1)
        times.append(time.perf_counter() - started)
        assert candidates
    return {"p50_us": percentile(times, 50) * 1e6, "p99_us": percentile(times, 99) * 1e6}


# -- Redis traffic ------------------------------------------------------------------------------


def redis_net_bytes(url: str) -> int:
    """Bytes in + out of the Redis server so far (INFO stats)."""
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        sock.sendall(b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n")
        data = b""
        while not data.endswith(b"\r\n") or data.count(b"\r\n") < 2:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        header, _, body = data.partition(b"\r\n")
        size = int(header[1:])
        while len(body) < size:
            body += sock.recv(65536)
    stats = dict(line.split(":", 1) for line in body.decode().splitlines() if ":" in line)
    return int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])


# -- one node count -----------------------------------------------------------------------------


def start_fleets(
    harness: Harness, coords: list[Coordinator], nodes: int, per_fleet: int
) -> list[Proc]:
    node_ids = [f"node-{i:05d}" for i in range(nodes)]
    tokens = harness.enroll_many(node_ids)
    fleets: list[Proc] = []
    for index, coord in enumerate(coords):
        mine = node_ids[index::INSTANCES]
        for start in range(0, len(mine), per_fleet):
            chunk = mine[start : start + per_fleet]
            spec_path = harness.dir / f"fleet-{index}-{start}.json"
            spec_path.touch(mode=0o600)
            spec_path.write_text(json.dumps({
                "url": coord.url, "models": [MODEL], "max_parallel": 4,
                "connect_concurrency": 50,
                "nodes": [{"node_id": n, "token": tokens[n]} for n in chunk],
            }))  # fmt: skip
            args = [sys.executable, "-m", "tools.bench.scale_fleet", str(spec_path)]
            fleets.append(harness.spawn(f"fleet-{index}-{start}", args))

    def all_connected() -> bool:
        done = 0
        for fleet in fleets:
            text = fleet.log_path.read_text(errors="replace")
            if "refused" in text:
                raise BenchError(f"{fleet.name}: nodes refused: {fleet.log_tail(500)}")
            fleet.check_alive()
            done += "connected" in text
        return done == len(fleets)

    wait_until(all_connected, f"{nodes} nodes to connect", timeout_s=60 + nodes / 50)
    return fleets


def connect_retries(fleet_log: str) -> int:
    """The 1013 "try again later" answers a fleet's nodes got before all were welcomed."""
    match = re.search(r"connected \d+ retries (\d+)", fleet_log)
    return int(match.group(1)) if match else 0


async def open_loop(
    urls: list[str], key: str, rate: float, duration_s: float
) -> tuple[list[float], dict[str, int]]:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    clients = [
        httpx.AsyncClient(base_url=u, limits=limits, timeout=REQUEST_TIMEOUT_S) for u in urls
    ]

    async def one(i: int, scheduled: float) -> None:
        prompt = f"scale {i}"
        try:
            response = await clients[i % len(clients)].post(
                "/api/v1/request",
                json={"model": MODEL, "prompt": prompt},
                headers={"Authorization": f"Bearer {key}"},
            )
        except httpx.HTTPError as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            return
        if response.status_code == 200 and response.json().get("output") == prompt:
            latencies.append(trio.current_time() - scheduled)
        else:
            label = f"{response.status_code}"
            errors[label] = errors.get(label, 0) + 1

    try:
        start = trio.current_time() + 0.05
        async with trio.open_nursery() as nursery:
            for i in range(max(1, int(rate * duration_s))):
                scheduled = start + i / rate
                await trio.sleep_until(scheduled)
                nursery.start_soon(one, i, scheduled)
    finally:
        for client in clients:
            await client.aclose()
    return latencies, errors


def profile(
    args: argparse.Namespace, pids: list[int], label: str, seconds: float
) -> list[subprocess.Popen[bytes]]:
    """With ``--py-spy``, one profiler per instance over the next ``seconds`` (files
    ``<label><instance>.txt``); wait for them after the window."""
    if not args.py_spy:
        return []
    return _profile.record({f"{label}{i}": pid for i, pid in enumerate(pids)}, seconds, args.py_spy)


def measure_count(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    with Harness(keep=args.keep, GEMMANET_RATE_LIMIT="1000000/minute") as harness:
        if args.keep:
            print(f"logs in {harness.dir}", file=sys.stderr)
        redis_url = harness.redis()
        harness.env.update(GEMMANET_REDIS_URL=redis_url, GEMMANET_MULTI_INSTANCE="1",
                           GEMMANET_KEY_PREFIX=f"scale{os.getpid()}")  # fmt: skip
        key = harness.create_key("scale")
        if args.heartbeat is not None:
            harness.env["GEMMANET_HEARTBEAT_S"] = f"{args.heartbeat:g}"
        coords = [
            harness.coordinator(f"instance-{i}", GEMMANET_INSTANCE_ID=f"I{i}")
            for i in range(INSTANCES)
        ]
        wait_until(lambda: all(c.status()["instances"] == INSTANCES for c in coords),
                   "the instances to see each other")  # fmt: skip
        connect_started = time.monotonic()
        fleets = start_fleets(harness, coords, nodes, args.per_fleet)
        wait_until(lambda: all(c.status()["online_nodes"] == nodes for c in coords),
                   f"every instance to count {nodes} nodes", timeout_s=180)  # fmt: skip
        connect_s = time.monotonic() - connect_started
        retries = sum(
            connect_retries(fleet.log_path.read_text(errors="replace")) for fleet in fleets
        )
        time.sleep(args.settle)
        pids = [c.proc.popen.pid for c in coords]
        cpu_before = [cpu_seconds(pid) for pid in pids]
        bytes_before = redis_net_bytes(redis_url)
        profilers = profile(args, pids, f"{nodes}-I", args.idle)
        started = time.monotonic()
        time.sleep(args.idle)
        elapsed = time.monotonic() - started
        for profiler in profilers:
            profiler.wait(timeout=30)
        idle_cpu = [(cpu_seconds(pid) - before) / elapsed for pid, before in zip(pids, cpu_before)]
        redis_bps = (redis_net_bytes(redis_url) - bytes_before) / elapsed
        # The request window is profiled apart from the idle one (R: requests, I: idle).
        profilers = profile(args, pids, f"{nodes}-R", args.duration)
        latencies, errors = trio.run(
            open_loop, [c.url for c in coords], key, args.rate, args.duration
        )
        for profiler in profilers:
            profiler.wait(timeout=30)
        for proc in [*fleets, *(c.proc for c in coords)]:
            proc.check_alive()
        statuses = [c.status() for c in coords]
        if any(s["online_nodes"] != nodes for s in statuses):
            raise BenchError(f"nodes lost during the run: {[s['online_nodes'] for s in statuses]}")
    return {
        "nodes": nodes,
        "connect_s": connect_s,
        "connect_retries": retries,
        "idle_cpu_per_instance": idle_cpu,
        "redis_bytes_per_s": redis_bps,
        "requests": len(latencies) + sum(errors.values()),
        "errors": errors,
        "latency_ms": {
            q: percentile(latencies, p) * 1000 if latencies else math.nan
            for q, p in (("p50", 50), ("p99", 99))
        },
        "placement": placement_times(nodes),
    }


def print_report(rows: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    print(header_line())
    print(f"scale: {INSTANCES} instances, idle {settings['idle_s']} s, "
          f"{settings['rate']} req/s for {settings['duration_s']} s, "
          f"node heartbeat {settings['heartbeat_s']:g} s")  # fmt: skip
    print(f"{'nodes':>7} {'idle CPU per instance (% core)':>32} {'Redis B/s':>11} "
          f"{'req p50':>8} {'req p99':>8} {'place p50':>10} {'place p99':>10} "
          f"{'connect':>8} {'1013s':>6} errors")  # fmt: skip
    for row in rows:
        cpu = " ".join(f"{100 * c:5.1f}" for c in row["idle_cpu_per_instance"])
        lat, place = row["latency_ms"], row["placement"]
        print(f"{row['nodes']:>7} {cpu:>32} {row['redis_bytes_per_s']:>11,.0f} "
              f"{lat['p50']:>6.1f}ms {lat['p99']:>6.1f}ms {place['p50_us']:>8.0f}us "
              f"{place['p99_us']:>8.0f}us {row['connect_s']:>7.1f}s {row['connect_retries']:>6} "
              f"{row['errors'] or '-'}")  # fmt: skip
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print(
            f"{last['nodes']} vs {first['nodes']} nodes: idle CPU x"
            f"{max(last['idle_cpu_per_instance']) / max(max(first['idle_cpu_per_instance']), 1e-9):.1f}, "
            f"Redis B/s x{last['redis_bytes_per_s'] / max(first['redis_bytes_per_s'], 1):.1f}, "
            f"request p50 x{last['latency_ms']['p50'] / first['latency_ms']['p50']:.2f} "
            f"p99 x{last['latency_ms']['p99'] / first['latency_ms']['p99']:.2f}, "
            f"placement p50 x{last['placement']['p50_us'] / first['placement']['p50_us']:.1f}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.scale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", default=None, help="node counts, comma-separated "
                        "(default 200,2000,10000; --quick 50,200)")  # fmt: skip
    parser.add_argument("--idle", type=float, default=None, help="idle window s (default 15)")
    parser.add_argument("--settle", type=float, default=3.0, help="wait before measuring (s)")
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s (default 20)")
    parser.add_argument("--duration", type=float, default=None, help="request s (default 15)")
    parser.add_argument("--heartbeat", type=float, default=None,
                        help="GEMMANET_HEARTBEAT_S of the instances (default: theirs, 2 s)")  # fmt: skip
    parser.add_argument("--per-fleet", type=int, default=1700, help="nodes per fleet process")
    parser.add_argument("--json", metavar="FILE", default=None, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs with the logs")
    parser.add_argument("--py-spy", metavar="DIR", type=Path, default=None,
                        help="profile each instance with py-spy over the idle window and over "
                        "the request window: raw stacks and a summary per instance and window "
                        "in DIR")  # fmt: skip
    args = parser.parse_args(argv)
    args.nodes = [
        int(n) for n in (args.nodes or ("50,200" if args.quick else "200,2000,10000")).split(",")
    ]
    args.idle = args.idle if args.idle is not None else (2.0 if args.quick else 15.0)
    args.duration = args.duration if args.duration is not None else (2.0 if args.quick else 15.0)
    if args.quick:
        args.settle = min(args.settle, 1.0)
    if min(args.nodes) < INSTANCES or args.per_fleet < 1 or args.rate <= 0:
        parser.error(f"--nodes must be >= {INSTANCES}, --per-fleet and --rate positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    settings = {"idle_s": args.idle, "rate": args.rate, "duration_s": args.duration,
                "heartbeat_s": args.heartbeat or 2.0}  # fmt: skip
    rows = []
    try:
        for nodes in args.nodes:
            print(f"... {nodes} nodes", file=sys.stderr, flush=True)
            rows.append(measure_count(nodes, args))
    except BaseException as exc:  # noqa: BLE001 - exit_code_for raises again what is not a failure or an interrupt
        return exit_code_for("scale", exc)
    print_report(rows, settings)
    if args.py_spy:
        for raw in sorted(args.py_spy.glob("*-[IR]*.txt")):
            (args.py_spy / f"{raw.stem}.summary").write_text(_profile.summary(raw) + "\n")
        print(f"profiles (py-spy) in {args.py_spy}: *-I*.summary idle, *-R*.summary under "
              "requests", file=sys.stderr)  # fmt: skip
    write_json(
        args.json, {"benchmark": "scale", "cores": cores(), "settings": settings, "rows": rows}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
