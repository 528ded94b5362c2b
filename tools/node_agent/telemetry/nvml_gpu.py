"""NVIDIA GPUs through NVML (``nvidia-ml-py``, the ``nvidia`` extra), when it is installed and
a driver answers. NVML has no GTT: those figures stay None.

The module is imported only on first use, and a machine without it (or without a driver)
simply has no NVIDIA GPUs here; nothing fails.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from tools.node_agent.telemetry.sysfs_gpu import GpuReading

__all__ = ["NvmlGpus"]

log = logging.getLogger("gemmanet.telemetry")


class NvmlGpus:
    """Reads every NVIDIA GPU; NVML is initialised once, on the first read."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._tried = False

    def _library(self) -> Any:
        if not self._tried:
            self._tried = True
            try:
                nvml = importlib.import_module("pynvml")
                nvml.nvmlInit()
            except Exception as exc:  # noqa: BLE001 - no module, no driver, no GPU: all "none"
                log.debug("no NVML: %r", exc)
            else:
                self._nvml = nvml
        return self._nvml

    def read(self) -> list[GpuReading]:
        nvml = self._library()
        if nvml is None:
            return []
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001
            log.debug("NVML device count failed: %r", exc)
            return []
        readings = []
        for index in range(count):
            busy: float | None = None
            used: int | None = None
            total: int | None = None
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:  # noqa: BLE001 - a GPU that fell off the bus
                log.debug("NVML GPU %d: %r", index, exc)
                continue
            try:
                busy = min(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu), 100.0) / 100.0
            except Exception as exc:  # noqa: BLE001 - each figure on its own
                log.debug("NVML GPU %d utilisation: %r", index, exc)
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                used, total = int(memory.used), int(memory.total)
            except Exception as exc:  # noqa: BLE001
                log.debug("NVML GPU %d memory: %r", index, exc)
            readings.append(GpuReading(busy=busy, vram_used=used, vram_total=total))
        return readings
