"""CPU and RSS of named processes, sampled every second from /proc by a background thread (a
thread, so a busy load generator cannot delay the samples)."""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from tools.bench._harness import cpu_seconds, rss_bytes


def _box_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


@dataclass
class Series:
    t: list[float] = field(default_factory=list)  # monotonic
    cpu_pct: list[float] = field(default_factory=list)  # share of one core, in %
    rss_mb: list[float] = field(default_factory=list)


class Sampler:
    def __init__(self, pids: dict[str, int], interval_s: float = 1.0) -> None:
        self.pids = dict(pids)
        self.interval_s = interval_s
        self.series: dict[str, Series] = {name: Series() for name in pids}
        #: the whole machine: busy share of all cores, in % of one core (200 = 2 cores busy)
        self.box = Series()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadtest-sampler", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        last_t = time.monotonic()
        last_cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        last_box = _box_busy_ticks()
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            elapsed = now - last_t
            if elapsed <= 0:
                continue
            for name, pid in self.pids.items():
                cpu = cpu_seconds(pid)
                rss = rss_bytes(pid)
                series = self.series[name]
                if math.isnan(rss):  # gone (killed, or a zombie not reaped yet)
                    continue
                used = cpu - last_cpu[name]
                series.t.append(now)
                series.cpu_pct.append(100.0 * used / elapsed if used >= 0 else math.nan)
                series.rss_mb.append(rss / 2**20)
                last_cpu[name] = cpu
            box = _box_busy_ticks()
            total = box[1] - last_box[1]
            if total > 0:
                self.box.t.append(now)
                self.box.cpu_pct.append(100.0 * cores * (box[0] - last_box[0]) / total)
            last_box = box
            last_t = now
