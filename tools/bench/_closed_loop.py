"""Closed-loop rounds, what the request-cost benchmarks share (``throughput.py``, and the CPU
rounds of ``cross_instance.py``): ``--concurrency`` workers each send one operation after
another for a round, the CPU of every process over the round from /proc, and the order of the
kinds in each round (every order in turn, so drift on a shared box hits every kind alike).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import httpx
import trio

from tools.bench._harness import cpu_split

# Safety bound on the requests of one round, whatever the duration.
MAX_REQUESTS_PER_ROUND = 200_000
#: CPU of these processes is split into user and system time in the report
SPLIT = ("coordinator",)


class RoundResult:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.elapsed = 0.0
        #: CPU seconds each process spent during the round (and "<name>.sys": its system part)
        self.cpu: dict[str, float] = {}

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed > 0 else 0.0


#: one operation of a kind: (worker, its i-th call) -> None when answered right, else an
#: error label
Call = Callable[[int, int], Awaitable[str | None]]


async def closed_loop_round(
    kind: str, call: Call, concurrency: int, duration_s: float
) -> RoundResult:
    result = RoundResult(kind)
    budget = [MAX_REQUESTS_PER_ROUND]
    started = time.perf_counter()
    deadline = started + duration_s

    async def worker(w: int) -> None:
        i = 0
        while time.perf_counter() < deadline and budget[0] > 0:
            budget[0] -= 1
            i += 1
            t0 = time.perf_counter()
            try:
                error = await call(w, i)
            except httpx.HTTPError as exc:
                result.errors[type(exc).__name__] += 1
                continue
            if error is None:
                result.latencies.append(time.perf_counter() - t0)
            else:
                result.errors[error] += 1

    # Hard bound: a round never outlives its duration by more than the request timeout.
    with trio.move_on_after(duration_s + 15):
        async with trio.open_nursery() as nursery:
            for w in range(concurrency):
                nursery.start_soon(worker, w)
    result.elapsed = time.perf_counter() - started
    return result


def cpu_now(pids: dict[str, int], split: tuple[str, ...] = SPLIT) -> dict[str, float]:
    """CPU seconds so far of the client (this process) and of each of ``pids``; for those
    named in ``split`` also their system part, as ``<name>.sys``."""
    now = {"client": time.process_time()}
    for name, pid in pids.items():
        user, system = cpu_split(pid)
        now[name] = user + system
        if name in split:
            now[f"{name}.sys"] = system
    return now


def cpu_since(
    before: dict[str, float], pids: dict[str, int], split: tuple[str, ...] = SPLIT
) -> dict[str, float]:
    after = cpu_now(pids, split)
    return {name: after[name] - before[name] for name in before}


def round_order(kinds: list[str], r: int) -> list[str]:
    """Round ``r``'s order of the kinds: rotated by r // 2, reversed on odd rounds (2 kinds:
    AB BA BA AB...; 3 kinds: all six orders in six rounds)."""
    shift = (r // 2) % len(kinds)
    order = kinds[shift:] + kinds[:shift]
    return order[::-1] if r % 2 else order


def median(values: list[float]) -> float:
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan
