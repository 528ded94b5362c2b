"""Sampling profiles of running coordinator processes with ``py-spy`` (``pip install py-spy``):
``record`` starts one per process for a window, ``summary`` turns the raw stacks into the top
functions by own and inclusive samples (the table that goes in a performance note)."""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from pathlib import Path


def record(pids: dict[str, int], seconds: float, out_dir: Path) -> list[subprocess.Popen[bytes]]:
    """One ``py-spy record`` per process (name -> pid), raw stacks in ``out_dir/<name>.txt``;
    wait for the returned processes after the window."""
    # Installed beside this Python (a venv not on PATH) or anywhere on PATH.
    exe = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, pid in pids.items():
        # --gil: only samples where Python runs. Without it a thread preempted inside a
        # syscall (a loopback send waking its peer on a busy 2-core box) is counted as busy
        # there, and sends looked like a third of the work when they were a few percent of CPU.
        args = [exe, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", "100",
                "--gil", "-f", "raw", "-o", str(out_dir / f"{name}.txt")]  # fmt: skip
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def summary(raw: Path, top: int = 25) -> str:
    """The ``top`` functions by own samples, then by inclusive samples, as text."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{raw.name}: {total} samples"]
    for title, counter in (("own", own), ("inclusive", inclusive)):
        lines.append(f"-- top {top} by {title} samples")
        lines += [
            f"{100 * n / max(total, 1):5.1f}%  {f[:140]}" for f, n in counter.most_common(top)
        ]
    return "\n".join(lines)
