"""``gemmanet sim run | replay | sweep``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from coordinator.coordination.factory import BUS_NAMES
from sim.mutations import MUTATIONS
from sim.trace import read_trace_header, write_trace
from sim.world import SimConfig, SimResult, run_seed

DEFAULT_TRACE_DIR = Path("sim-traces")


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sim_command", required=True, metavar="ACTION")
    run = sub.add_parser("run", help="run one seed; prints a digest of the whole event trace")
    run.add_argument("--seed", type=int, required=True, help="the seed of the run")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    _config_flags(run)
    run.set_defaults(sim_handler=_run)

    replay = sub.add_parser(
        "replay", help="re-run the run recorded in a trace file (same config, same bus)"
    )
    replay.add_argument(
        "file", type=Path, help="a trace a failing run wrote, e.g. sim-traces/seed-12.jsonl"
    )
    replay.add_argument("--json", action="store_true", help="print one JSON object")
    replay.set_defaults(sim_handler=_replay)

    sweep = sub.add_parser("sweep", help="run many seeds; list the failing ones")
    sweep.add_argument(
        "--seeds", required=True, metavar="A-B", help="the seeds A to B, inclusive (A <= B)"
    )
    jobs = os.cpu_count() or 1
    sweep.add_argument(
        "--jobs",
        type=int,
        default=jobs,
        metavar="N",
        help=f"seeds run in parallel processes (default: the CPU count, here {jobs})",
    )
    sweep.add_argument(
        "--first-failure",
        action="store_true",
        help="stop at the first failing seed (in seed order): finding a failing run of a "
        "mutation, or checking that one is caught, without sweeping every seed",
    )
    _config_flags(sweep)
    sweep.set_defaults(sim_handler=_sweep)


def _config_flags(parser: argparse.ArgumentParser) -> None:
    defaults = SimConfig()
    parser.add_argument(
        "--instances",
        type=int,
        default=defaults.instances,
        metavar="N",
        help=f"coordinator instances in the run (default {defaults.instances})",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=defaults.nodes,
        metavar="N",
        help=f"simulated nodes (default {defaults.nodes})",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=defaults.clients,
        metavar="N",
        help=f"simulated clients sending requests (default {defaults.clients})",
    )
    parser.add_argument(
        "--traffic-s",
        type=float,
        default=defaults.traffic_s,
        metavar="S",
        help=f"virtual seconds of client traffic (default {defaults.traffic_s:g})",
    )
    parser.add_argument(
        "--heartbeat-rate",
        type=float,
        default=defaults.heartbeat_rate,
        metavar="R",
        help="GEMMANET_HEARTBEAT_RATE of the instances: a low one makes them stretch and "
        f"re-announce the nodes' heartbeat interval (default {defaults.heartbeat_rate:g})",
    )
    parser.add_argument(
        "--monitors",
        type=int,
        default=defaults.monitors,
        metavar="N",
        help="elected residency monitor candidates, with simulated direct hosts and the "
        f"monitor pause fault (default {defaults.monitors}: none)",
    )
    parser.add_argument(
        "--bus",
        choices=BUS_NAMES,
        default=defaults.bus,
        help="instance bus semantics: pubsub (at-most-once) or streams (durable inboxes) "
        f"(default {defaults.bus})",
    )
    parser.add_argument(
        "--queue-policy",
        choices=("fair", "fifo"),
        default=defaults.queue_policy,
        help="GEMMANET_QUEUE_POLICY of the instances: keys take turns (fair) or first come "
        f"first served (fifo) (default {defaults.queue_policy})",
    )
    parser.add_argument(
        "--mutation",
        choices=sorted(MUTATIONS),
        help="run a deliberately broken variant (to show the simulator catches it; default: none)",
    )
    parser.add_argument(
        "--trace-dir",
        type=Path,
        default=DEFAULT_TRACE_DIR,
        metavar="DIR",
        help=f"where failing runs write their traces (default {DEFAULT_TRACE_DIR})",
    )


def _config(args: argparse.Namespace) -> SimConfig:
    if args.monitors < 0:
        raise SystemExit(f"gemmanet: --monitors {args.monitors} must be 0 or more")
    return replace(
        SimConfig(),
        instances=args.instances,
        nodes=args.nodes,
        clients=args.clients,
        traffic_s=args.traffic_s,
        mutation=args.mutation,
        bus=args.bus,
        monitors=args.monitors,
        heartbeat_rate=args.heartbeat_rate,
        queue_policy=args.queue_policy,
    )


def _trace_path(trace_dir: Path, seed: int, config: SimConfig) -> Path:
    suffix = f"-{config.mutation}" if config.mutation else ""
    if config.bus != SimConfig().bus:
        suffix += f"-{config.bus}"
    if config.monitors:
        suffix += f"-monitors{config.monitors}"
    if config.heartbeat_rate != SimConfig().heartbeat_rate:
        suffix += f"-rate{config.heartbeat_rate:g}"
    if config.queue_policy != SimConfig().queue_policy:
        suffix += f"-{config.queue_policy}"
    return trace_dir / f"seed-{seed}{suffix}.jsonl"


def _run_and_record(seed: int, config: SimConfig, trace_dir: Path) -> tuple[SimResult, Path | None]:
    logging.disable(logging.CRITICAL)  # the instances' own logs are noise here; the trace speaks
    result, trace = run_seed(seed, config)
    if result.ok:
        return result, None
    path = _trace_path(trace_dir, seed, config)
    header = {"seed": seed, "config": asdict(config), "result": result.to_json()}
    write_trace(path, header, trace.events)
    return result, path


def _summary(result: SimResult) -> dict[str, object]:
    return {
        "seed": result.seed,
        "digest": result.digest,
        "ok": result.ok,
        "virtual_seconds": result.virtual_seconds,
        "events": result.events,
        "wall_seconds": result.wall_seconds,
        "requests": result.requests,
        "outcomes": result.outcomes,
        "violation": result.violation,
        "faults": result.faults,
        "monitor": result.monitor,
    }


def _print_result(result: SimResult, as_json: bool, trace: Path | None) -> None:
    if as_json:
        print(json.dumps({**_summary(result), "trace": str(trace) if trace else None}))
        return
    state = "ok" if result.ok else "FAILED"
    print(
        f"seed {result.seed}: {state}  digest {result.digest}  {result.virtual_seconds:g} virtual s "
        f"in {result.wall_seconds:g} wall s, {result.events} events, {result.requests} requests"
    )
    if result.violation:
        v = result.violation
        print(f"  invariant {v['invariant']} broken at t={v['t']:.6f}: {v['message']}")
    if trace:
        print(f"  trace written to {trace}; replay with: gemmanet sim replay {trace}")


def _run(args: argparse.Namespace) -> int:
    result, trace = _run_and_record(args.seed, _config(args), args.trace_dir)
    _print_result(result, args.json, trace)
    return 0 if result.ok else 1


def _replay(args: argparse.Namespace) -> int:
    try:
        header = read_trace_header(args.file)
    except OSError as exc:
        raise SystemExit(f"gemmanet: cannot read the trace {args.file}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError):
        raise SystemExit(
            f"gemmanet: {args.file} is not a simulator trace (a file `sim run` or `sim sweep` "
            "wrote for a failing seed)"
        ) from None
    config = SimConfig(**{**header["config"], "rate_limit": tuple(header["config"]["rate_limit"])})
    recorded = header["result"]
    logging.disable(logging.CRITICAL)
    result, _ = run_seed(header["seed"], config)
    same = result.digest == recorded["digest"] and result.violation == recorded["violation"]
    if args.json:
        print(json.dumps({**_summary(result), "reproduced": same}))
    else:
        _print_result(result, False, None)
        print(
            "  reproduced exactly (same digest, same violation, same virtual time)"
            if same
            else f"  DIVERGED from the recording (recorded digest {recorded['digest']})"
        )
    if not same:
        return 3
    return 0 if result.ok else 1


def _parse_range(text: str) -> range:
    low, _, high = text.partition("-")
    try:
        seeds = range(int(low), int(high or low) + 1)
    except ValueError:
        raise SystemExit(f"gemmanet: --seeds {text!r} is not a range like 1-200") from None
    if not seeds:
        raise SystemExit(
            f"gemmanet: --seeds {text!r} is empty: the first seed must not exceed the last"
        )
    return seeds


def _sweep_one(job: tuple[int, SimConfig, Path]) -> tuple[SimResult, Path | None]:
    return _run_and_record(*job)


def _sweep(args: argparse.Namespace) -> int:
    seeds, config = _parse_range(args.seeds), _config(args)
    jobs = [(seed, config, args.trace_dir) for seed in seeds]
    failing: list[tuple[SimResult, Path | None]] = []
    virtual = wall = 0.0
    monitor: dict[str, int] = {}
    swept = 0
    # Seeds are handed out one by one when stopping at the first failure (little is run past
    # it), four at a time otherwise (fewer round trips to the workers).
    chunk = 1 if args.first_failure else 4
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for result, trace in pool.map(_sweep_one, jobs, chunksize=chunk):
            swept += 1
            virtual += result.virtual_seconds
            wall += result.wall_seconds
            for key, count in (result.monitor or {}).items():
                if key != "epoch":
                    monitor[key] = monitor.get(key, 0) + count
            if not result.ok:
                failing.append((result, trace))
                if args.first_failure:
                    pool.shutdown(wait=True, cancel_futures=True)
                    break
    swept_text = f"{swept} of {len(seeds)}" if swept < len(seeds) else f"{len(seeds)}"
    print(
        f"swept {swept_text} seeds ({seeds.start}-{seeds.stop - 1}"
        f", bus {config.bus}"
        f"{', queue ' + config.queue_policy if config.queue_policy != 'fair' else ''}"
        f"{', mutation ' + config.mutation if config.mutation else ''}"
        f"{', stopped at the first failure' if swept < len(seeds) else ''}): "
        f"{len(failing)} failing; {virtual:.0f} virtual s in {wall:.1f} wall s of work"
    )
    if config.monitors:
        print(
            f"  monitors: {monitor.get('elections', 0)} elections, {monitor.get('pauses', 0)} "
            f"pauses, {monitor.get('fenced_rejects', 0)} deposed monitors' writes fenced off"
        )
    for result, trace in failing:
        v = result.violation or {}
        print(f"  seed {result.seed}: {v.get('invariant')} at t={v.get('t')}: {v.get('message')}")
        print(f"    replay: gemmanet sim replay {trace}")
    return 1 if failing else 0


def main(args: argparse.Namespace) -> int:
    return int(args.sim_handler(args))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m sim.cli")
    add_sim_arguments(parser)
    sys.exit(main(parser.parse_args()))
