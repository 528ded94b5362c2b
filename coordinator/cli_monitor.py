"""The ``gemmanet monitor`` and ``gemmanet prove-takeover`` command lines: their arguments and
handlers, which import the monitor only when run. Standard library only at module level:
``gemmanet --help`` loads nothing else."""

from __future__ import annotations

import argparse

__all__ = ["add_monitor_commands"]


def _monitor(args: argparse.Namespace) -> int:
    from coordinator.monitor.command import run_monitor_command
    from coordinator.settings import Settings

    return run_monitor_command(Settings.from_env(), candidate=args.id, events=args.events)


def _prove_takeover(args: argparse.Namespace) -> int:
    from coordinator.monitor.prove_takeover import run_prove_takeover
    from coordinator.settings import Settings

    return run_prove_takeover(
        Settings.from_env(),
        repeat=args.repeat,
        gate=args.handover_gate,
        against_deployed=args.against_deployed,
        primary=args.primary,
        pid=args.pid,
        timeout_s=args.timeout,
    )


def add_monitor_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    monitor = sub.add_parser(
        "monitor", help="run an elected residency monitor candidate (needs GEMMANET_REDIS_URL)"
    )
    monitor.add_argument("--id", default=None, help="candidate id (default: monitor-<random>)")
    monitor.add_argument(
        "--events", action="store_true", help="print one JSON line per event on stdout"
    )
    monitor.set_defaults(handler=_monitor)
    prove = sub.add_parser(
        "prove-takeover",
        help="pause a primary monitor, check the standby takes over and fencing holds",
    )
    prove.add_argument("--repeat", type=int, default=3, metavar="N", help="runs (default 3)")
    prove.add_argument(
        "--handover-gate",
        choices=("strict",),
        default="strict",
        help="the only gate, and the default: strict = zero owner loss, zero successful "
        "deposed writes, every handover inside GEMMANET_RESIDENCY_STALE_S",
    )
    prove.add_argument(
        "--against-deployed",
        action="store_true",
        help="prove the takeover of the monitors that run under the configured Redis and "
        "prefix, instead of a pair of its own (needs --primary)",
    )
    prove.add_argument(
        "--primary", metavar="ID", help="with --against-deployed: the primary monitor to stop"
    )
    prove.add_argument(
        "--pid",
        type=int,
        metavar="PID",
        help="with --against-deployed: SIGSTOP (then SIGCONT) this local process, the primary; "
        "without it, you stop and resume the primary yourself",
    )
    prove.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="with --against-deployed and no --pid: how long to wait for you (default 300)",
    )
    prove.set_defaults(handler=_prove_takeover)
