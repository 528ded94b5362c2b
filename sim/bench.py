"""Simulator speed: virtual seconds simulated per wall second (3 instances, 50 nodes, steady
traffic, no faults). ``python -m sim.bench [--seeds N] [--traffic-s S]``."""

from __future__ import annotations

import argparse
import logging
import os
import time
from dataclasses import replace

from sim.faults import FaultPlan
from sim.world import SimConfig, World


class _SteadyWorld(World):
    """The same world with an empty fault plan: the figure is about steady-state cost."""

    async def _main(self) -> None:
        original = FaultPlan.draw
        FaultPlan.draw = classmethod(lambda cls, *a, **k: cls())  # type: ignore[method-assign,assignment]
        try:
            await super()._main()
        finally:
            FaultPlan.draw = original  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m sim.bench")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--traffic-s", type=float, default=60.0)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    # Production timings (2 s node heartbeats) and 10 clients at ~1 request/s each.
    config = replace(
        SimConfig(),
        instances=3,
        nodes=50,
        clients=10,
        request_interval_s=1.0,
        traffic_s=args.traffic_s,
        forgers=0,
        heartbeat_s=2.0,
        rate_limit=(1000, 1.0),
    )
    virtual = wall = 0.0
    requests = 0
    for seed in range(1, args.seeds + 1):
        started = time.perf_counter()
        result, _ = _SteadyWorld(seed, config).run()
        wall += time.perf_counter() - started
        virtual += result.virtual_seconds
        requests += result.requests
        assert result.ok, result.violation
    print(
        f"simulator speed: {virtual:.0f} virtual s in {wall:.1f} wall s = {virtual / wall:.1f}x "
        f"(3 instances, 50 nodes, 10 clients at ~1 req/s each, {requests} requests; "
        f"{os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
