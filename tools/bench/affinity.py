"""Prefix-affine placement against placement by load alone, side by side in one run: chat
conversations on echo nodes that model a KV cache of recent prefixes.

Each mode (affinity off, then on) starts its own cluster on one private ``redis-server``:
``--instances`` coordinators (``GEMMANET_MULTI_INSTANCE=1``, ``GEMMANET_AFFINITY`` off or on)
and ``--nodes`` echo nodes spread over them, each behind the prefix cache model of
``tools/node_agent/prefix_cache.py`` (the first output comes after ``--ms-per-token`` for every
prompt token not in the node's LRU of its ``--cache-entries`` most recent prompts). Then
``--conversations`` chats of ``--turns`` turns each run at once through the OpenAI API
(streamed), each turn sent to another instance than the last; a turn sends the whole history
back (a shared system prompt, the earlier questions and answers, a new question of
``--words`` words). Printed per mode: time to first token (p50, p95, mean), the prompt tokens
the nodes had to read, the busiest node's share of the requests against an even share, the
CPU per request of the coordinators together and of redis-server (what the lookups and
records cost), and the instances' affinity hit rate.

    python -m tools.bench.affinity [--json FILE]
    python -m tools.bench.affinity --quick      # smoke: 1 instance, 1 node, 2 chats of 2 turns

Each mode runs ``--rounds`` times, alternating (off, on, off, on, …), each round on a fresh
cluster: the times to first token are pooled over a mode's rounds, the tokens summed, and the
busiest node is the worst round's. The box these run on is shared and noisy; the per-token
cost is chosen so the modelled prefill, not the noise, dominates the time to first token.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from tools.bench._harness import (
    CLI,
    LOOPBACK,
    BenchError,
    Coordinator,
    Harness,
    Proc,
    cores,
    cpu_seconds,
    exit_code_for,
    free_port,
    header_line,
    install_signal_handlers,
    percentile,
    wait_until,
    write_json,
)

MODEL = "chat"
MODES = ("off", "on")
ANSWER_TOKENS = 8
#: the aims of docs/affinity.md: mean time to first token at most this share of the
#: affinity-off figure, the busiest node's share at most this many even shares
AIM_TTFT_RATIO = 0.5
AIM_BUSIEST = 1.5


def _words(rng: random.Random, count: int) -> str:
    return " ".join(f"w{rng.randrange(5000)}" for _ in range(count))


def _spawn_node(
    harness: Harness, coord: Coordinator, node_id: str, args: argparse.Namespace, log: Path
) -> Proc:
    token = harness.enroll(node_id)
    env = {
        **harness.env,
        "GEMMANET_NODE_TOKEN": token,
        "GEMMANET_ECHO_PREFIX_CACHE": f"{args.ms_per_token},{args.cache_entries}",
        "GEMMANET_ECHO_PREFIX_CACHE_LOG": str(log),
    }
    argv = [*CLI, "node", "--coordinator", coord.url, "--node-id", node_id, "--backend", "echo",
            "--model", MODEL, "--max-parallel", str(args.max_parallel),
            "--telemetry-interval", "0"]  # fmt: skip
    return harness.spawn(f"node-{node_id}", argv, env)


async def _conversation(
    client: httpx.AsyncClient,
    urls: list[str],
    key: str,
    number: int,
    args: argparse.Namespace,
    system: str,
    ttfts: list[float],
    errors: list[str],
) -> None:
    rng = random.Random(f"{args.seed}:{number}")
    await trio.sleep(rng.uniform(0, args.stagger))
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    headers = {"Authorization": f"Bearer {key}"}
    for turn in range(args.turns):
        messages.append({"role": "user", "content": _words(rng, args.words)})
        url = urls[(number + turn) % len(urls)] + "/v1/chat/completions"
        body = {"model": MODEL, "messages": messages, "stream": True,
                "max_tokens": ANSWER_TOKENS}  # fmt: skip
        began, first, parts = time.perf_counter(), None, []
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                errors.append(f"{response.status_code} {(await response.aread())[:120]!r}")
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0].get("delta", {}).get("content")
                if delta:
                    first = first if first is not None else time.perf_counter()
                    parts.append(delta)
        if first is None:
            errors.append("a stream without content")
            return
        ttfts.append(first - began)
        messages.append({"role": "assistant", "content": "".join(parts)})
        await trio.sleep(rng.uniform(0, args.think))


async def _drive(coords: list[Coordinator], key: str, args: argparse.Namespace) -> dict[str, Any]:
    system = _words(random.Random(f"{args.seed}:system"), args.system_words)
    ttfts: list[float] = []
    errors: list[str] = []
    urls = [c.url for c in coords]
    limits = httpx.Limits(max_connections=args.conversations * 2)
    began = time.perf_counter()
    async with httpx.AsyncClient(timeout=120, limits=limits) as client, trio.open_nursery() as n:
        for number in range(args.conversations):
            n.start_soon(_conversation, client, urls, key, number, args, system, ttfts, errors)
    return {"ttfts": ttfts, "errors": errors, "took_s": time.perf_counter() - began}


def _affinity_counts(coords: list[Coordinator], key: str) -> dict[str, int]:
    totals = {"hits": 0, "misses": 0, "unavailable": 0}
    for coord in coords:
        reply = coord.http.get("/api/v1/cluster", headers={"Authorization": f"Bearer {key}"})
        affinity = reply.json()["affinity"]
        for name in totals:
            totals[name] += int(affinity[name])
    return totals


@dataclass
class Cluster:
    """One mode's processes: coordinators first, nodes once the coordinators answer."""

    name: str
    coords: list[Coordinator]
    logs: dict[str, Path]
    nodes: list[Proc] = field(default_factory=list)


def spawn_cluster(
    harness: Harness, redis_url: str, mode: str, round_no: int, args: argparse.Namespace
) -> Cluster:
    """Start the coordinators of a fresh cluster with affinity ``mode`` (not waited for)."""
    name = f"{mode}{round_no}"
    env = {**harness.env, "GEMMANET_REDIS_URL": redis_url, "GEMMANET_MULTI_INSTANCE": "1",
           "GEMMANET_KEY_PREFIX": f"aff{os.getpid()}{name}", "GEMMANET_AFFINITY": mode,
           "GEMMANET_RATE_LIMIT": "1000000/minute"}  # fmt: skip
    coords = []
    for i in range(args.instances):
        port = free_port()
        argv = [*CLI, "serve", "--host", LOOPBACK, "--port", str(port)]
        proc = harness.spawn(
            f"{name}-instance-{i}", argv, {**env, "GEMMANET_INSTANCE_ID": f"{name}-{i}"}
        )
        coords.append(Coordinator(proc, f"http://{LOOPBACK}:{port}", harness.probe_key))
    harness.coordinators += coords
    logs = {f"{name}-n{i}": harness.dir / f"{name}-n{i}.jsonl" for i in range(args.nodes)}
    return Cluster(name, coords, logs)


def ready_cluster(harness: Harness, cluster: Cluster, args: argparse.Namespace) -> None:
    """Wait for the coordinators to answer and meet, then start the nodes and wait for them."""
    coords = cluster.coords
    for coord in coords:
        wait_until(coord.healthy, f"{coord.proc.name} to answer /healthz")
    wait_until(
        lambda: all(c.status()["instances"] == len(coords) for c in coords), "instances to meet"
    )
    cluster.nodes = [
        _spawn_node(harness, coords[i % len(coords)], node_id, args, log)
        for i, (node_id, log) in enumerate(cluster.logs.items())
    ]


def measure(harness: Harness, cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """The conversations through ``cluster``, then its processes stopped; its figures."""
    coords = cluster.coords
    wait_until(lambda: all(c.status()["online_nodes"] == args.nodes for c in coords), "nodes")
    key = harness.create_key(f"bench-{cluster.name}")
    redis_proc = next(p for p in harness.procs if p.name == "redis")
    watched = [redis_proc.popen.pid, *(c.proc.popen.pid for c in coords)]
    cpu_before = [cpu_seconds(pid) for pid in watched]
    driven = trio.run(_drive, coords, key, args)
    cpu = [cpu_seconds(pid) - before for pid, before in zip(watched, cpu_before, strict=True)]
    answered = max(1, len(driven["ttfts"]))
    affinity = _affinity_counts(coords, key)
    procs = [*cluster.nodes, *(c.proc for c in coords)]
    for proc in procs:  # all at once, then each waited for
        proc.popen.terminate()
    for proc in procs:
        harness.stop(proc)
    per_node: dict[str, int] = {}
    read = prompt = 0
    for node_id, log in cluster.logs.items():
        lines = log.read_text().splitlines() if log.exists() else []
        per_node[node_id] = len(lines)
        for line in lines:
            record = json.loads(line)
            read += record["read_tokens"]
            prompt += record["prompt_tokens"]
    ttfts = driven["ttfts"]
    total = sum(per_node.values())
    busiest = max(per_node.values()) / total if total else float("nan")
    looked = affinity["hits"] + affinity["misses"]
    return {
        "ttfts": ttfts,
        "errors": driven["errors"],
        "took_s": driven["took_s"],
        "prompt_tokens": prompt,
        "read_tokens": read,
        "per_node": per_node,
        "busiest_vs_even": busiest * args.nodes,
        "affinity": affinity,
        "hit_rate": affinity["hits"] / looked if looked else None,
        # CPU per answered request: the coordinators together, and redis-server
        "coordinator_cpu_ms": sum(cpu[1:]) * 1000 / answered,
        "redis_cpu_ms": cpu[0] * 1000 / answered,
    }


def pooled(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """One mode's figures over its rounds: the times to first token pooled, the tokens
    summed, the worst round's busiest node, the median round's CPU."""
    ttfts = [t for run in runs for t in run["ttfts"]]
    hits = [run["hit_rate"] for run in runs if run["hit_rate"] is not None]
    return {
        "rounds": len(runs),
        "requests": len(ttfts),
        "ttft_p50_ms": percentile(ttfts, 50) * 1000,
        "ttft_p95_ms": percentile(ttfts, 95) * 1000,
        "ttft_mean_ms": statistics.fmean(ttfts) * 1000 if ttfts else float("nan"),
        "prompt_tokens": sum(run["prompt_tokens"] for run in runs),
        "read_tokens": sum(run["read_tokens"] for run in runs),
        "coordinator_cpu_ms": statistics.median(run["coordinator_cpu_ms"] for run in runs),
        "redis_cpu_ms": statistics.median(run["redis_cpu_ms"] for run in runs),
        "busiest_vs_even": max(run["busiest_vs_even"] for run in runs),
        "hit_rate": statistics.fmean(hits) if hits else None,
        "per_round": [
            {k: v for k, v in run.items() if k != "ttfts"}
            | {"ttft_mean_ms": statistics.fmean(run["ttfts"]) * 1000}
            for run in runs
        ],
    }


def report(args: argparse.Namespace, off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    ratio = on["ttft_mean_ms"] / off["ttft_mean_ms"]
    print(header_line())
    print(
        f"{args.conversations} conversations x {args.turns} turns on {args.instances} instance(s)"
        f" and {args.nodes} nodes ({args.ms_per_token:g} ms per uncached token, "
        f"{args.cache_entries} cached prefixes per node), {args.rounds} round(s) of each mode"
    )
    print(f"{'':28}{'affinity off':>14}{'affinity on':>14}")
    rows = [
        ("time to first token p50 ms", "ttft_p50_ms", "{:14.1f}"),
        ("time to first token p95 ms", "ttft_p95_ms", "{:14.1f}"),
        ("time to first token mean ms", "ttft_mean_ms", "{:14.1f}"),
        ("prompt tokens sent", "prompt_tokens", "{:14d}"),
        ("prompt tokens read by nodes", "read_tokens", "{:14d}"),
        ("busiest node / even share", "busiest_vs_even", "{:14.2f}"),
        ("coordinator CPU ms / request", "coordinator_cpu_ms", "{:14.2f}"),
        ("redis CPU ms / request", "redis_cpu_ms", "{:14.2f}"),
    ]
    for label, key, fmt in rows:
        print(f"{label:28}" + fmt.format(off[key]) + fmt.format(on[key]))
    hit = on["hit_rate"]
    print(f"{'affinity hit rate':28}{'-':>14}{(f'{hit:.0%}' if hit is not None else 'n/a'):>14}")
    per_round = [
        " / ".join(f"{r['ttft_mean_ms']:.0f}" for r in figures["per_round"])
        for figures in (off, on)
    ]
    print(f"{'mean ms per round':28}{per_round[0]:>14}{per_round[1]:>14}")
    met = ratio <= AIM_TTFT_RATIO and on["busiest_vs_even"] <= AIM_BUSIEST
    verdict = "not judged (smoke size)" if args.quick else "met" if met else "NOT met"
    print(
        f"mean time to first token on / off: {ratio:.2f} (aim <= {AIM_TTFT_RATIO:g}); busiest "
        f"node {on['busiest_vs_even']:.2f} x the even share (aim <= {AIM_BUSIEST:g}): "
        f"{verdict}"
    )
    return {"ttft_mean_on_over_off": ratio, "aims_met": met}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.affinity", description=__doc__.split("\n\n")[0]
    )
    add = parser.add_argument
    add("--instances", type=int, default=3, help="coordinator instances (3)")
    add("--nodes", type=int, default=8, help="echo nodes (8)")
    add("--conversations", type=int, default=40, help="chats run at once (40)")
    add("--turns", type=int, default=6, help="turns per chat (6)")
    add("--words", type=int, default=120, help="words of each new question (120)")
    add("--system-words", type=int, default=60, help="words of the shared system prompt (60)")
    add("--ms-per-token", type=float, default=2.0, help="node cost per uncached token (2)")
    add("--cache-entries", type=int, default=8, help="prefixes each node caches (8)")
    add("--max-parallel", type=int, default=8, help="tasks each node runs at once (8)")
    add("--stagger", type=float, default=1.0, help="chats start within this many s (1)")
    add("--think", type=float, default=1.0, help="most s a chat waits between turns (1)")
    add("--seed", type=int, default=1, help="the conversations' words (1)")
    add("--rounds", type=int, default=2, help="alternating off/on rounds, pooled (2)")
    add("--json", metavar="FILE", default=None, help="write the figures here")
    add("--quick", action="store_true", help="smoke size: 1 instance, 1 node, 2 chats x 2")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.nodes, args.conversations, args.turns, args.rounds = 1, 1, 2, 2, 1
        args.stagger = args.think = 0.05
    if min(args.instances, args.nodes, args.conversations, args.turns, args.words, args.rounds) < 1:
        parser.error(
            "--instances, --nodes, --conversations, --turns, --words and --rounds must be >= 1"
        )
    install_signal_handlers()
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    try:
        with Harness() as harness:
            redis_url = harness.redis()
            for round_no in range(args.rounds):
                # Each mode's cluster is started just before it is measured; a quick run
                # (whose figures are not judged) starts both at once, which is most of its time.
                clusters: dict[str, Cluster] = {}
                for mode in MODES if args.quick else ():
                    clusters[mode] = spawn_cluster(harness, redis_url, mode, round_no, args)
                for cluster in clusters.values():
                    ready_cluster(harness, cluster, args)
                for mode in MODES:
                    print(f"... round {round_no + 1}/{args.rounds}, affinity {mode}",
                          file=sys.stderr, flush=True)  # fmt: skip
                    if mode not in clusters:
                        clusters[mode] = spawn_cluster(harness, redis_url, mode, round_no, args)
                        ready_cluster(harness, clusters[mode], args)
                    figures = measure(harness, clusters[mode], args)
                    if figures["errors"]:
                        raise BenchError(f"affinity {mode}: {figures['errors'][:3]}")
                    runs[mode].append(figures)
    except BaseException as exc:  # noqa: BLE001 - exit_code_for raises again what is not a failure or an interrupt
        return exit_code_for("affinity", exc)
    off, on = pooled(runs["off"], args), pooled(runs["on"], args)
    ratios = report(args, off, on)
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "quick")}
    write_json(
        args.json,
        {"benchmark": "affinity", "cores": cores(), "settings": settings, "off": off, "on": on,
         "ratios": ratios},
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
