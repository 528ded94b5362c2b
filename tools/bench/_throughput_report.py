"""The figures of ``throughput.py``: each kind's rounds aggregated (CPU per answer of every
process, latencies, req/s), the ratios against ``/healthz`` (or, with ``--stream``, the CPU of
one more chunk against a non-streamed request), the printed report, and the py-spy split of the
coordinator's CPU by category.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from tools.bench import _profile
from tools.bench._closed_loop import RoundResult, median, ratio
from tools.bench._harness import cores, fmt_ms, header_line, now_text, summary_ms


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
            "throughput_median_of_rounds": median(paired),
            "p50": ratio(req["p50_ms"], hz["p50_ms"]),
            "p95": ratio(req["p95_ms"], hz["p95_ms"]),
            "p99": ratio(req["p99_ms"], hz["p99_ms"]),
            # the aim: at most 1.3
            "coordinator_cpu_per_request": ratio(coord["request"], coord["healthz"]),
            "coordinator_cpu_per_request_per_round": [round(x, 3) for x in paired_cpu],
            "coordinator_cpu_per_request_median_of_rounds": median(paired_cpu),
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
        "coordinator_cpu_per_chunk_vs_request_median_of_rounds": median(per_round),
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
