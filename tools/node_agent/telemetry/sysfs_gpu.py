"""AMD GPUs as the kernel's DRM driver (amdgpu) describes them in sysfs.

Per card, under ``{root}/class/drm/cardN/device/``: ``gpu_busy_percent`` (0-100),
``mem_info_vram_used``/``mem_info_vram_total`` and ``mem_info_gtt_used``/``mem_info_gtt_total``
(bytes). Each file is read on its own: a card without GTT, or a file the driver does not
offer, leaves that figure unknown (None) and the others intact. ``root`` is ``/sys`` on a real
machine; tests point it at a recorded tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GpuReading", "read_drm_gpus"]

# cardN only: the connector entries beside them (card0-DP-1, …) are not GPUs.
_CARD = re.compile(r"card\d+")
_FILES = (
    "gpu_busy_percent",
    "mem_info_vram_used",
    "mem_info_vram_total",
    "mem_info_gtt_used",
    "mem_info_gtt_total",
)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU now; None where it does not say. Memory in bytes, busy as a fraction."""

    busy: float | None = None
    vram_used: int | None = None
    vram_total: int | None = None
    gtt_used: int | None = None
    gtt_total: int | None = None


def _read_whole_number(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return int(text) if text.isdigit() else None


def read_drm_gpus(root: Path = Path("/sys")) -> list[GpuReading]:
    """Every DRM card offering at least one of the files, in card order."""
    drm = root / "class" / "drm"
    try:
        cards = sorted(
            (p for p in drm.iterdir() if _CARD.fullmatch(p.name)),
            key=lambda p: int(p.name[4:]),
        )
    except OSError:
        return []
    readings = []
    for card in cards:
        values = {name: _read_whole_number(card / "device" / name) for name in _FILES}
        if all(value is None for value in values.values()):
            continue
        busy = values["gpu_busy_percent"]
        readings.append(
            GpuReading(
                busy=None if busy is None else min(busy, 100) / 100.0,
                vram_used=values["mem_info_vram_used"],
                vram_total=values["mem_info_vram_total"],
                gtt_used=values["mem_info_gtt_used"],
                gtt_total=values["mem_info_gtt_total"],
            )
        )
    return readings
