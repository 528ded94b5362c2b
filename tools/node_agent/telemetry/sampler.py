"""One telemetry sample of this machine, and a loop that keeps the latest one.

CPU busy is the share of non-idle CPU time between two readings of the kernel's counters
(``psutil.cpu_times``) taken ``interval_s`` apart; the wait is a trio sleep, so sampling never
blocks the event loop. Memory comes from ``psutil.virtual_memory`` (used = total - available,
what the machine could not hand out now). GPUs: AMD from DRM sysfs (``sysfs_gpu``), NVIDIA from
NVML (``nvml_gpu``); several GPUs add up their memory and average their busy figures. The file
reads run in a worker thread (a suspended amdgpu can take a while to answer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import trio

from protocol.telemetry import TelemetrySample
from tools.node_agent.telemetry.nvml_gpu import NvmlGpus
from tools.node_agent.telemetry.sysfs_gpu import GpuReading, read_drm_gpus

__all__ = ["LiveTelemetry", "Sampler", "combine_gpus", "cpu_busy_between"]

GB = 1e9
DEFAULT_INTERVAL_S = 1.0


def cpu_busy_between(before: Sequence[float], after: Sequence[float], idle: float) -> float | None:
    """Busy share of the time between two ``cpu_times`` readings; ``idle`` is the idle time
    elapsed between them. None when no time passed (the counters did not move)."""
    total = sum(after) - sum(before)
    if total <= 0:
        return None
    return min(max(1.0 - idle / total, 0.0), 1.0)


def _idle_of(times: object) -> float:
    # iowait is time waiting with nothing to run: idle for our purpose (Linux only).
    return float(getattr(times, "idle", 0.0)) + float(getattr(times, "iowait", 0.0))


def _gb(value: int | None) -> float | None:
    return None if value is None else value / GB


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def combine_gpus(readings: Sequence[GpuReading]) -> dict[str, float | None]:
    """The sample's GPU fields from every GPU's reading (None where no GPU says)."""
    busy = [r.busy for r in readings if r.busy is not None]
    return {
        "gpu_busy": sum(busy) / len(busy) if busy else None,
        "vram_used_gb": _gb(_sum([r.vram_used for r in readings])),
        "vram_total_gb": _gb(_sum([r.vram_total for r in readings])),
        "gtt_used_gb": _gb(_sum([r.gtt_used for r in readings])),
        "gtt_total_gb": _gb(_sum([r.gtt_total for r in readings])),
    }


class Sampler:
    """Takes samples of this machine. ``sysfs_root`` is ``/sys`` except in tests."""

    def __init__(
        self,
        *,
        sysfs_root: Path = Path("/sys"),
        nvml: NvmlGpus | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sysfs_root = sysfs_root
        self._nvml = nvml if nvml is not None else NvmlGpus()
        self._clock = clock

    def read_gpus(self) -> list[GpuReading]:
        """Blocking: every GPU, AMD then NVIDIA."""
        return [*read_drm_gpus(self.sysfs_root), *self._nvml.read()]

    def _read_blocking(self) -> dict[str, float | None]:
        memory = psutil.virtual_memory()
        return {
            "memory_used_gb": (memory.total - memory.available) / GB,
            "memory_total_gb": memory.total / GB,
            **combine_gpus(self.read_gpus()),
        }

    async def sample(self, interval_s: float = DEFAULT_INTERVAL_S) -> TelemetrySample:
        """A sample whose CPU busy covers the next ``interval_s`` seconds."""
        before = psutil.cpu_times()
        await trio.sleep(interval_s)
        after = psutil.cpu_times()
        idle = _idle_of(after) - _idle_of(before)
        cpu_busy = cpu_busy_between(tuple(before), tuple(after), idle)
        rest = await trio.to_thread.run_sync(self._read_blocking)
        return TelemetrySample(at=self._clock(), cpu_busy=cpu_busy, **rest)


class LiveTelemetry:
    """Keeps ``latest`` fresh: one sample every ``interval_s`` (each covering that interval)."""

    def __init__(self, sampler: Sampler, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.sampler = sampler
        self.interval_s = interval_s
        self.latest: TelemetrySample | None = None
        self._first = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample until cancelled; ``started`` once the first sample exists."""
        self.latest = await self.sampler.sample(self.interval_s)
        self._first.set()
        task_status.started()
        while True:
            self.latest = await self.sampler.sample(self.interval_s)

    async def current(self) -> TelemetrySample:
        """The latest sample, waiting for the first one if there is none yet."""
        await self._first.wait()
        assert self.latest is not None
        return self.latest
