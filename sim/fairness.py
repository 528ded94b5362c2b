"""The fair admission scenario: one API key floods a model's queue while another sends one
request now and then; how long does the second wait, under ``fair`` and under ``fifo``?

One production ``Instance`` on the embedded (memory) backend, one simulated node of ``slots``
parallel slots answering every task after exactly ``latency_s``, all on trio's MockClock: a
slot turnover (every slot busy for one task) is ``latency_s`` of virtual time. The flood's
requests arrive one right after the other (a millisecond apart, each queued before the next);
the quiet key's come every ``quiet_every_s`` once the flood is queued. The node counts,
itself, how many tasks it runs at once.

    python -m sim.fairness [--flood 300] [--slots 2] [--quiet 20] [--keys 1] [--weight 1]
                           [--every 1] [--burst]

prints one JSON line per policy (the figures of docs/fair-queuing.md).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from coordinator.coordination.bus.memory import MemoryBus, MemoryBusHub
from coordinator.coordination.memory.coordination import MemoryCoordination, MemoryState
from coordinator.runtime.instance import Instance
from coordinator.settings import Settings
from sim.actors import InstanceSide, SimNode, SocketPair
from sim.faults import Gate
from sim.stand_ins import SimStore
from sim.trace import Trace
from sim.trio_hook import mock_clock, pin_trio_scheduler

__all__ = ["FairnessResult", "run_fairness"]


@dataclass
class FairnessResult:
    policy: str
    slots: int
    latency_s: float
    flood: int
    #: queue waits of the quiet key's requests, in slot turnovers, in the order sent
    quiet_waits: list[float] = field(default_factory=list)
    #: the same of the flood's requests (its last ones waited for the whole flood)
    flood_max_wait: float = 0.0
    answered: int = 0
    sent: int = 0
    #: the most tasks the node was asked to run at once
    peak_running: int = 0
    #: store asks (grants and "queued" answers) per grant: what a wake costs
    asks_per_grant: float = 0.0

    @property
    def quiet_p95(self) -> float:
        return percentile(self.quiet_waits, 0.95)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "quiet_p95": round(self.quiet_p95, 3)}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q * len(ranked)) - 1)]


def run_fairness(
    policy: str,
    *,
    flood: int = 300,
    slots: int = 2,
    latency_s: float = 1.0,
    quiet: int = 20,
    quiet_every_s: float = 1.0,
    flood_keys: int = 1,
    quiet_weight: int = 1,
    seed: int = 0,
    burst: bool = False,
) -> FairnessResult:
    """Run the scenario once: deterministic, ``seed`` picks the order of tasks woken together."""
    result = FairnessResult(policy, slots, latency_s, flood * flood_keys)
    pin_trio_scheduler(f"fairness:{seed}")  # the same interleaving every run
    trio.run(
        _scenario,
        result,
        flood,
        flood_keys,
        quiet,
        quiet_every_s,
        quiet_weight,
        burst,
        clock=mock_clock(),
    )
    return result


async def _scenario(
    result: FairnessResult,
    flood: int,
    flood_keys: int,
    quiet: int,
    quiet_every_s: float,
    quiet_weight: int,
    burst: bool,
) -> None:
    trace = Trace(trio.current_time, keep_events=False)

    def count(event: dict[str, Any]) -> None:
        if event["kind"] == "node.assign":
            result.peak_running = max(result.peak_running, event["running"])

    trace.listeners.append(count)
    settings = Settings(
        database_url="sim://",
        instance_id="I0",
        rate_limit=(1_000_000, 1.0),
        task_timeout_s=3600.0,
        queue_timeout_s=3600.0,
        queue_max=flood * flood_keys + quiet + 10,
        queue_policy=result.policy,
    )
    store = SimStore()
    coordination = MemoryCoordination(trio.current_time, state=MemoryState(trio.current_time))
    bus = MemoryBus(hub=MemoryBusHub(trio.current_time))
    instance = Instance(
        settings,
        store,  # type: ignore[arg-type]
        coordination,
        bus,
        clock=trio.current_time,
        wall_clock=trio.current_time,
        rng=random.Random("fairness"),
    )
    instance.admissions.note_key("quiet", "quiet", quiet_weight)
    turnover = result.latency_s
    async with trio.open_nursery() as root:
        await root.start(instance.run)

        def connect(pair: SocketPair, preferred: str | None) -> str:
            root.start_soon(instance.serve_node, InstanceSide(pair, Gate()))
            return "I0"

        node = SimNode(
            node_id="N0",
            token=store.enroll("N0"),
            models=["m"],
            max_parallel=result.slots,
            latency=(result.latency_s, result.latency_s),
            rng=random.Random(0),
            trace=trace,
            connect=connect,
        )
        root.start_soon(node.run)
        await trio.sleep(2.0)  # the node registers

        async def one(key: str, waits: list[float] | None) -> None:
            result.sent += 1
            sent = trio.current_time()
            async with instance.requests.open(
                key_id=key, model="m", prompt=key, stream=False, timeout_s=None
            ) as handle:
                placed = trio.current_time()
                wait = (placed - sent) / turnover
                if waits is not None:
                    waits.append(wait)
                else:
                    result.flood_max_wait = max(result.flood_max_wait, wait)
                done = await handle.result()
            assert done.output == key, done
            result.answered += 1

        async with trio.open_nursery() as clients:
            for _ in range(flood):
                for k in range(flood_keys):
                    clients.start_soon(one, f"flood-{k}", None)
                    # One at a time, each queued before the next: the order sent is the
                    # order of arrival (a burst sent at once arrives in the scheduler's order).
                    if not burst:
                        await trio.sleep(0.001)
            if burst:
                await trio.sleep(0.01)  # every flood request is queued
            for _ in range(quiet):
                clients.start_soon(one, "quiet", result.quiet_waits)
                await trio.sleep(quiet_every_s)
        sample = instance.metrics.registry.get_sample_value
        grants = sample("gemmanet_lease_grants_total") or 0.0
        queued = sample("gemmanet_lease_denials_total", {"reason": "no_room"}) or 0.0
        result.asks_per_grant = round((grants + queued) / max(grants, 1.0), 2)
        root.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.fairness", description=__doc__)
    parser.add_argument("--flood", type=int, default=300, help="queued requests per flood key")
    parser.add_argument("--keys", type=int, default=1, help="flooding keys (default 1)")
    parser.add_argument("--slots", type=int, default=2, help="the node's parallel slots")
    parser.add_argument("--quiet", type=int, default=20, help="the quiet key's requests")
    parser.add_argument("--weight", type=int, default=1, help="the quiet key's priority")
    parser.add_argument(
        "--every", type=float, default=1.0, help="seconds between the quiet key's requests"
    )
    parser.add_argument(
        "--burst", action="store_true", help="the flood sent all at once (not one by one)"
    )
    args = parser.parse_args(argv)
    for policy in ("fair", "fifo"):
        result = run_fairness(
            policy,
            flood=args.flood,
            slots=args.slots,
            quiet=args.quiet,
            quiet_every_s=args.every,
            flood_keys=args.keys,
            quiet_weight=args.weight,
            burst=args.burst,
        )
        summary = result.to_json()
        summary["quiet_waits"] = [round(w, 3) for w in result.quiet_waits]
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
