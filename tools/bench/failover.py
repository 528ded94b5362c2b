"""How fast a client learns that the instance running its task is gone: ``kill -9`` of the
owner, time until the requester answers 502.

Each round starts a fresh pair of coordinator instances A and B on a private ``redis-server``
(``GEMMANET_MULTI_INSTANCE=1``) and an echo node on A that takes ``--node-latency`` seconds per
task (far longer than the round), sends ``--requests`` requests to B for that node's model,
waits until they are all running on the node, kills A with SIGKILL and times, for each request,
how long after the kill its 502 arrived. The contract (end-to-end tests) is 3 s; this prints
the figure.

    python -m tools.bench.failover [--rounds N] [--requests K] [--json FILE]
    python -m tools.bench.failover --quick      # one round of 2 requests (smoke)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

import httpx
import trio

from tools.bench._harness import (
    BenchError,
    Harness,
    cores,
    exit_code_for,
    header_line,
    install_signal_handlers,
    percentile,
    wait_until,
    write_json,
)

MODEL = "held"
CONTRACT_S = 3.0


async def one_round(harness: Harness, args: argparse.Namespace) -> list[float]:
    """Seconds from the kill to each request's 502."""
    redis_url = harness.redis()
    harness.env.update(GEMMANET_REDIS_URL=redis_url, GEMMANET_MULTI_INSTANCE="1",
                       GEMMANET_KEY_PREFIX=f"fo{os.getpid()}")  # fmt: skip
    key = harness.create_key("failover")
    a = harness.coordinator("instance-a", GEMMANET_INSTANCE_ID="A")
    b = harness.coordinator("instance-b", GEMMANET_INSTANCE_ID="B")
    wait_until(lambda: b.status()["instances"] == 2, "B to see A")
    harness.node(a, "held-node", [MODEL], latency_ms=int(args.node_latency * 1000))
    wait_until(lambda: any(n["node_id"] == "held-node" for n in b.nodes()), "B to see the node")

    answers: list[tuple[float, int]] = []
    killed_at: list[float] = []

    async def request(client: httpx.AsyncClient, i: int) -> None:
        response = await client.post(
            "/api/v1/request",
            json={"model": MODEL, "prompt": f"failover {i}"},
            headers={"Authorization": f"Bearer {key}"},
        )
        answers.append((time.monotonic(), response.status_code))

    client = httpx.AsyncClient(base_url=b.url, timeout=args.node_latency + 30)
    async with client, trio.open_nursery() as nursery:
        for i in range(args.requests):
            nursery.start_soon(request, client, i)

        def all_running() -> bool:
            node = next(n for n in a.nodes() if n["node_id"] == "held-node")
            return bool(node["in_flight"] >= args.requests)

        await trio.to_thread.run_sync(lambda: wait_until(all_running, "tasks running on A"))
        killed_at.append(time.monotonic())
        a.proc.popen.send_signal(signal.SIGKILL)
    codes = sorted({code for _, code in answers})
    if codes != [502]:
        raise BenchError(f"expected only 502 after the kill, got status codes {codes}")
    return [at - killed_at[0] for at, _ in answers]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.failover", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=5, help="fresh clusters (default 5)")
    parser.add_argument("--requests", type=int, default=5, help="in flight per round (5)")
    parser.add_argument("--node-latency", type=float, default=60.0, help="s per task (60)")
    parser.add_argument("--json", metavar="FILE", default=None, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="one round of 2 requests")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests = 1, 2
    if args.rounds < 1 or args.requests < 1:
        parser.error("--rounds and --requests must be positive")
    install_signal_handlers()
    delays: list[float] = []
    try:
        for round_no in range(args.rounds):
            print(f"... round {round_no + 1}/{args.rounds}", file=sys.stderr, flush=True)
            with Harness() as harness:
                delays += trio.run(one_round, harness, args)
    except BaseException as exc:  # noqa: BLE001 - exit_code_for raises again what is not a failure or an interrupt
        return exit_code_for("failover", exc)
    figures: dict[str, Any] = {
        "requests": len(delays),
        "p50_s": percentile(delays, 50),
        "max_s": max(delays),
        "within_contract": max(delays) <= CONTRACT_S,
    }
    print(header_line())
    print(
        f"failover after kill -9 of the owner: {len(delays)} requests in {args.rounds} round(s), "
        f"502 after p50 {figures['p50_s']:.2f} s, max {figures['max_s']:.2f} s "
        f"(contract {CONTRACT_S:g} s: {'met' if figures['within_contract'] else 'MISSED'})"
    )
    write_json(args.json, {"benchmark": "failover", "cores": cores(), **figures})
    return 0 if figures["within_contract"] else 1


if __name__ == "__main__":
    sys.exit(main())
