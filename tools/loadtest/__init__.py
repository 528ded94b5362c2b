"""``gemmanet loadtest``: the load profile of seed 000 §4.1 against real coordinator processes.

Phases of 1 (the baseline), 2 and 3 coordinator instances (2 and 3 share a private
``redis-server``); simulated echo nodes (real node agents, many per helper process) spread evenly
over the instances; a closed-loop ramp to the target concurrency, then a steady open-loop rate
with streams alongside; ``kill -9`` of one instance after the steady phase of a multi-instance
phase. Writes ``report.json`` (every figure, and each criterion with its threshold and verdict)
and PNG plots into ``--out``; exits 0 only when every criterion holds.

    gemmanet loadtest [--quick | --smoke] [--duration S] [--out DIR]
    python -m tools.loadtest ...            # the same, without the gemmanet entry point

* ``profile`` - the seed's profile, the ``--quick`` and ``--smoke`` scales, the thresholds.
* ``nodes`` - the helper process hosting many node agents (``python -m tools.loadtest.nodes``).
* ``load`` - the load generator of one phase (trio + httpx).
* ``sampler`` - CPU and RSS of every process from /proc, once a second.
* ``analysis`` - the figures of a phase; ``verdicts`` - the criteria over all phases (and our
  aims, reported beside them without a say in the exit code).
* ``speed`` - the machine's speed (coordinator CPU per ``GET /healthz``, measured before each
  phase's load) and each phase's CPU peak as a share of the seed's bound.
* ``plots`` - the PNGs (matplotlib, imported lazily).
* ``runner`` - processes of each phase (through ``tools.bench._harness``), report, summary.

runner.py    runs the phases, writes report.json and the plots, prints the summary
profile.py   the load profile and its scaled-down variants, and the pass thresholds
load.py      the load of one phase: ramp, steady rate, streams, the kill
nodes.py     many simulated nodes (real node agents, echo backend) in one helper process
journal.py   reading the node helpers' journals, incrementally
sampler.py   CPU and RSS of named processes, sampled from /proc by a background thread
analysis.py  the figures of one phase
verdicts.py  the pass/fail criteria over all phases, each with its threshold and measure
speed.py     the machine's speed before the load, and the CPU peak against the seed's bound
plots.py     PNG plots of a report (matplotlib, imported only when plotting)
progress.py  what the load test shows while it runs
__main__.py  ``python -m tools.loadtest``
"""

from __future__ import annotations

import argparse

__all__ = ["add_loadtest_arguments", "run_loadtest"]

DEFAULT_OUT = "./loadtest-results/"


def _instances(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a list like 1,2,3, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one instance count")
    return values


def add_loadtest_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``gemmanet loadtest`` flags on ``parser``."""
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument(
        "--quick",
        action="store_true",
        help="half the seed's scale (100 nodes, 50 req/s, 100 concurrent, 25 streams) and 45 s "
        "of steady load per phase: about five minutes in all",
    )
    scale.add_argument(
        "--smoke",
        action="store_true",
        help="tiny scale, every mechanism once: about a minute (used by the test suite)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="seconds of steady open-loop load per phase (default 600, the seed's 10 minutes; "
        "--quick 45, --smoke 5)",
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"where report.json, the PNG plots and the process logs go (default {DEFAULT_OUT})",
    )
    tuning = parser.add_argument_group("overrides of the chosen profile")
    tuning.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="simulated nodes (default: the chosen profile's)",
    )
    tuning.add_argument(
        "--rate",
        type=float,
        default=None,
        metavar="R",
        help="steady req/s (default: the chosen profile's)",
    )
    tuning.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="concurrent requests of the ramp (default: the chosen profile's)",
    )
    tuning.add_argument(
        "--streams",
        type=int,
        default=None,
        metavar="N",
        help="concurrent streams (default: the chosen profile's)",
    )
    tuning.add_argument(
        "--fault-s",
        type=float,
        default=None,
        metavar="S",
        help="seconds of load after the kill (0: no kill) (default: the chosen profile's)",
    )
    tuning.add_argument(
        "--instances",
        type=_instances,
        default=None,
        metavar="LIST",
        help="instance counts of the phases, in order (default 1,2,3; 1 is the baseline)",
    )
    tuning.add_argument(
        "--node-procs",
        type=int,
        default=None,
        metavar="N",
        help="processes hosting the node agents (default one per 100 nodes)",
    )
    tuning.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="store of the coordinators (default: a fresh SQLite file per phase); e.g. a "
        "PostgreSQL URL, as the seed's deployments share one",
    )
    tuning.add_argument(
        "--seed", type=int, default=0, help="seed of the nodes' echo latency (default 0)"
    )
    tuning.add_argument(
        "--keep",
        action="store_true",
        help="keep each phase's temp dir (logs, journals; default: removed)",
    )


def run_loadtest(args: argparse.Namespace) -> int:
    """Blocking entry point of ``gemmanet loadtest``; returns the process exit code."""
    from tools.loadtest.runner import run

    return run(args)
