"""The CPU part of ``cross_instance.py``: for the pair of instances, closed-loop rounds
alternating remote and local requests to B (``_closed_loop.py``), the CPU of A and B together
per answered request and the ratio remote/local, printed; with ``--py-spy``, profiles of A and
B over extra rounds, split by category (``_profile.py``).
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio

from tools.bench import _profile
from tools.bench._closed_loop import (
    RoundResult,
    closed_loop_round,
    cpu_now,
    cpu_since,
    median,
    round_order,
)
from tools.bench._cross_latency import CLIENTS, REQUEST_TIMEOUT_S
from tools.bench._harness import error_label, fmt_ms, summary_ms

#: the processes whose CPU is also split into user and system time
SPLIT = ("A", "B")


def pair_pids(pids: dict[str, int], x: str) -> dict[str, int]:
    """The processes of one pair whose CPU is counted, by their name in the report."""
    names = {"A": f"A{x}", "B": f"B{x}", "node_A": f"node_A{x}", "node_B": f"node_B{x}",
             "redis": "redis"}  # fmt: skip
    return {short: pids[name] for short, name in names.items()}


async def cpu_rounds(
    b_urls: dict[str, str],
    keys: list[str],
    pids: dict[str, int],
    args: argparse.Namespace,
) -> tuple[dict[str, Any], dict[str, RoundResult]]:
    """Per pair: an idle window, then alternating closed-loop rounds of remote and local
    requests to B; with ``--py-spy``, profiled rounds of the first pair after them."""
    concurrency = args.concurrency
    round_s = args.cpu_duration / (2 * args.cpu_rounds)
    warmup_s = 0.3 if args.quick else 1.0
    idle_s = 0.5 if args.quick else 2.0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    out: dict[str, Any] = {}
    profiled: dict[str, RoundResult] = {}
    for client in CLIENTS:
        x = "" if client == CLIENTS[0] else "2"
        procs = pair_pids(pids, x)
        async with httpx.AsyncClient(
            base_url=b_urls[client], timeout=REQUEST_TIMEOUT_S, limits=limits
        ) as http:

            def call_for(model: str) -> Any:
                async def call(w: int, i: int) -> str | None:
                    prompt = f"{model} w{w} r{i}"
                    response = await http.post(
                        "/api/v1/request",
                        json={"model": model, "prompt": prompt},
                        headers={"Authorization": f"Bearer {keys[w % len(keys)]}"},
                    )
                    if response.status_code != 200:
                        return error_label(response)
                    return None if response.json().get("output") == prompt else "200 wrong output"

                return call

            calls = {"remote": call_for("remote"), "local": call_for("local")}
            before = cpu_now(procs, SPLIT)
            started = time.perf_counter()
            await trio.sleep(idle_s)
            idle = cpu_since(before, procs, SPLIT)
            idle_elapsed = time.perf_counter() - started
            for kind, warm in calls.items():
                await closed_loop_round(kind, warm, concurrency, warmup_s)
            results: dict[str, list[RoundResult]] = {kind: [] for kind in calls}
            for r in range(args.cpu_rounds):
                for kind in round_order(list(calls), r):
                    before = cpu_now(procs, SPLIT)
                    result = await closed_loop_round(kind, calls[kind], concurrency, round_s)
                    result.cpu = cpu_since(before, procs, SPLIT)
                    results[kind].append(result)
            out[client] = cpu_figures(results, idle, idle_elapsed)
            if args.py_spy and client == CLIENTS[0]:
                seconds = args.py_spy_seconds
                for kind, names in (("remote", ("A", "B")), ("local", ("B",))):
                    spies = _profile.record(
                        {f"{name}-{kind}": procs[name] for name in names}, seconds, args.py_spy,
                        rate=args.py_spy_rate,
                    )  # fmt: skip
                    before = cpu_now(procs, SPLIT)
                    result = await closed_loop_round(
                        kind, calls[kind], concurrency, round(seconds) + 1.0
                    )
                    result.cpu = cpu_since(before, procs, SPLIT)
                    profiled[kind] = result
                    for spy in spies:
                        await trio.to_thread.run_sync(spy.wait)
    return out, profiled


def _per_request(result: RoundResult, name: str) -> float:
    ok = len(result.latencies)
    return result.cpu[name] * 1000 / ok if ok else math.nan


def cpu_figures(
    results: dict[str, list[RoundResult]], idle: dict[str, float], idle_elapsed: float
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "idle_cpu_utilisation": {
            name: seconds / idle_elapsed for name, seconds in idle.items() if "." not in name
        }
    }
    for kind, rounds in results.items():
        ok = sum(len(r.latencies) for r in rounds)
        elapsed = sum(r.elapsed for r in rounds)
        errors: Counter[str] = Counter()
        for r in rounds:
            errors.update(r.errors)
        cpu = {name: sum(r.cpu[name] for r in rounds) for name in rounds[0].cpu}
        cpu["instances"] = cpu["A"] + cpu["B"]
        data[kind] = {
            "ok": ok,
            "errors": dict(errors),
            "throughput_rps": ok / elapsed if elapsed > 0 else 0.0,
            "cpu_ms_per_request": {
                name: (seconds * 1000 / ok if ok else math.nan)
                for name, seconds in cpu.items()
                if "." not in name
            },
            "cpu_sys_ms_per_request": {
                name.split(".")[0]: (seconds * 1000 / ok if ok else math.nan)
                for name, seconds in cpu.items()
                if "." in name
            },
            "rounds_instances_cpu_ms": [
                round(_per_request(r, "A") + _per_request(r, "B"), 4) for r in rounds
            ],
            **summary_ms([x for r in rounds for x in r.latencies]),
        }
    remote, local = data["remote"]["cpu_ms_per_request"], data["local"]["cpu_ms_per_request"]
    per_round = [
        a / b if b > 0 else math.nan
        for a, b in zip(
            data["remote"]["rounds_instances_cpu_ms"],
            data["local"]["rounds_instances_cpu_ms"],
            strict=True,
        )
    ]
    data["ratios"] = {
        # the aim: at most 1.6
        "instances_cpu_remote_vs_local": (
            remote["instances"] / local["instances"] if local["instances"] > 0 else math.nan
        ),
        "instances_cpu_remote_vs_local_per_round": [round(v, 3) for v in per_round],
        "instances_cpu_remote_vs_local_median_of_rounds": median(per_round),
        "B_cpu_remote_vs_local": remote["B"] / local["B"] if local["B"] > 0 else math.nan,
    }
    return data


def print_cpu(data: dict[str, Any]) -> None:
    s = data["settings"]
    print()
    print(
        f"CPU per request, closed loop, concurrency {s['concurrency']}, {s['cpu_rounds']} "
        f"alternating rounds of remote and local of {s['cpu_round_s']:.1f} s each, per pair "
        "(ms per answered request; A+B = the two instances together):"
    )
    for client in CLIENTS:
        d = data["cpu"][client]
        for kind in ("remote", "local"):
            k = d[kind]
            cells = "  ".join(f"{n} {v:.3f}" for n, v in k["cpu_ms_per_request"].items())
            print(
                f"  {client:8}{kind:7} {k['throughput_rps']:7.1f} req/s  p50 {fmt_ms(k['p50_ms'])}"
                f" ms  errors {k['errors'] or '-'}  {cells}"
            )
        r = d["ratios"]
        idle = "  ".join(f"{n} {u:.1%}" for n, u in d["idle_cpu_utilisation"].items())
        print(
            f"  {client:8}A+B CPU per remote request / per local request: "
            f"{r['instances_cpu_remote_vs_local']:.2f}x (per round "
            f"{r['instances_cpu_remote_vs_local_per_round']}, median "
            f"{r['instances_cpu_remote_vs_local_median_of_rounds']:.2f}x; aim <= 1.6x); "
            f"B alone {r['B_cpu_remote_vs_local']:.2f}x"
        )
        print(f"  {client:8}idle CPU (share of one core): {idle}")


def print_profiles(
    data: dict[str, Any], profiled: dict[str, RoundResult], out_dir: Path, top: int
) -> None:
    raws = {
        "B remote": out_dir / "B-remote.txt",
        "A remote": out_dir / "A-remote.txt",
        "B local": out_dir / "B-local.txt",
    }
    missing = [str(p) for p in raws.values() if not p.exists()]
    if missing:
        print(f"py-spy wrote no profile: {missing}")
        return
    for raw in raws.values():
        raw.with_suffix(".summary").write_text(_profile.summary(raw, top=25) + "\n")
    for name in ("B remote", "A remote"):
        print()
        print(
            f"py-spy profile of instance {name[0]} over a remote round (lean pair, --gil; {out_dir}):"
        )
        print(_profile.summary(raws[name], top=top))
    cpu = data["cpu"][CLIENTS[0]]
    user: dict[str, float] = {}
    system: dict[str, float] = {}
    for name in raws:
        instance, kind = name.split()
        total = cpu[kind]["cpu_ms_per_request"][instance]
        system[name] = cpu[kind]["cpu_sys_ms_per_request"][instance]
        user[name] = total - system[name]
    print()
    print(
        "CPU by category (share of the samples; ms per answered request = share x the "
        "instance's user CPU per request of the measured rounds):"
    )
    table = _profile.category_table(raws, user, system)
    print(table)
    (out_dir / "categories.txt").write_text(table + "\n")
    data["profiles"] = {
        name: {"raw": str(raw), "categories": _profile.categories(raw)[1]}
        for name, raw in raws.items()
    }
