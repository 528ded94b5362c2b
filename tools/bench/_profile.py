"""Sampling profiles of running coordinator processes with ``py-spy`` (``pip install py-spy``):
``record`` starts one per process for a window, ``summary`` turns the raw stacks into the top
functions by own and inclusive samples (the table that goes in a performance note), and
``categories`` splits the samples by what the coordinator was doing (HTTP, Quart, auth, rate
limit, admission, node websocket, recorder, logging, metrics...), ``category_table`` prints
that split as a share and as CPU milliseconds per operation.

How a sample gets its category: each frame is matched against ``RULES`` (first rule that
matches the frame wins); the sample goes to its *innermost* frame that matched a rule with a
category, so the generic layers under it (the standard library, trio's checkpoints, msgspec,
and the frames of the rules without a category: the store, SQLAlchemy, the embedded
coordination state, the Redis connection code) count for whoever called them: an ``EVAL`` of
the rate-limit script counts as rate limit, one of the lease script as admission, the batch
write of the task records as recorder. A sample with no such frame goes to the first of
``FALLBACKS`` with a frame in it: the Redis clients' own reader and writer tasks, the store
or coordination on their own, then trio's run loop and epoll (``trio scheduler & I/O``); else
to ``other``.

    python -m tools.bench._profile RAW.txt [RAW2.txt] [--top N]   # the tables of saved profiles
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def _any(*patterns: str) -> str:
    return "|".join(patterns)


#: (category, pattern on a frame "function (file:line)"); the first that matches a frame names
#: it; a category of None passes the frame over (it counts for its caller)
RULES: list[tuple[str | None, str]] = [
    ("logging", _any(
        r"\(logging/", r"\(coordinator/logging_setup", r"\(coordinator/log_redaction",
        r"\(coordinator/runtime/log_context", r"\(coordinator/runtime/requests/task_log",
    )),
    ("metrics", _any(
        r"\(prometheus_client/", r"\(coordinator/runtime/metrics\.py",
        r"\(coordinator/api/health/metrics\.py",
    )),
    ("task recorder", _any(r"record_task", r"TaskRecorder", r"task_recorder\.py",
                           r"\bTaskHandle\.record\b")),
    ("rate limit", _any(r"rate_limit", r"RateLimit", r"sliding_window")),
    ("admission/lease", _any(
        r"\(coordinator/runtime/requests/admission\.py",
        r"\(coordinator/core/admission/machine\.py",
        r"\(coordinator/coordination/(memory/|redis/)?leases\.py",
        r"\(coordinator/coordination/redis/lease_scripts\.py",
        r"\b(admit|release|renew_leases) \(coordinator/coordination/",
    )),
    ("auth (API key)", _any(
        r"\bauthenticate", r"_lookup_api_key", r"verify_node_token",
        r"\(coordinator/store/keys/(tokens|cache)\.py",
    )),
    # The generic layers: a frame here counts for whoever called it (the store and the
    # embedded coordination state are only reached through the purposes above, mostly).
    (None, _any(r"\(coordinator/store/", r"\(sqlalchemy/", r"\(coordinator/coordination/memory/",
                r"\(coordinator/coordination/redis/", r"\(coredis/")),
    ("node websocket (frames, envelopes)", _any(
        r"\(wsproto/", r"\(hypercorn/protocol/ws_stream\.py", r"\(coordinator/runtime/nodes/",
        r"\(coordinator/api/node_websocket\.py", r"\(protocol/", r"quart/.*websocket",
    )),
    ("cluster bus & membership", r"\(coordinator/(runtime/cluster/|coordination/bus/)"),
    ("task path (machine, placement, handle)", _any(
        r"\(coordinator/core/", r"\(coordinator/runtime/requests/",
        r"\(coordinator/runtime/instance\.py", r"\(coordinator/api/task_runs\.py",
    )),
    ("route (body, JSON, SSE)", _any(r"\(coordinator/api/", r"\(coordinator/errors\.py")),
    ("quart (+ werkzeug, quart_schema)", r"\((quart/|quart_trio/|quart_schema/|werkzeug/|blinker/)"),
    ("http (hypercorn, h11)", r"\((hypercorn/|h11/|coordinator/server/hypercorn_patches)"),
]  # fmt: skip
#: for a sample none of RULES claims: the first of these with a frame in it
FALLBACKS: list[tuple[str, str]] = [
    # the clients' own reader and writer tasks (their callers are not on these stacks)
    ("redis client (coredis, lean, link)", r"\((coredis/|hiredis|coordinator/coordination/redis/)"),
    (
        "store, coordination (other)",
        _any(
            r"\(coordinator/store/",
            r"\(sqlalchemy/",
            r"\(coordinator/coordination/",
        ),
    ),
    ("trio scheduler & I/O", r"\((trio/|outcome/|sniffio/|anyio/|selectors\.py)"),
]
OTHER = "other"
CATEGORIES = [name for name, _ in (*RULES, *FALLBACKS) if name is not None] + [OTHER]
_COMPILED = [(name, re.compile(pattern)) for name, pattern in RULES]
_FALLBACKS = [(name, re.compile(pattern)) for name, pattern in FALLBACKS]
_LINE = re.compile(r":\d+\)$")


def record(
    pids: dict[str, int], seconds: float, out_dir: Path, *, rate: int = 100
) -> list[subprocess.Popen[bytes]]:
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
        args = [exe, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", str(rate),
                "--gil", "-f", "raw", "-o", str(out_dir / f"{name}.txt")]  # fmt: skip
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def available() -> bool:
    return bool(
        shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    )


def _stacks(raw: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def _function(frame: str) -> str:
    """``func (file:line)`` -> ``func (file)``: samples of one function at any line together."""
    return _LINE.sub(")", frame)


def summary(raw: Path, top: int = 25, roots_at: float = 0.95) -> str:
    """The ``top`` functions by own samples, then by inclusive samples, as text (lines of a
    function counted together). The inclusive table leaves out the functions in at least
    ``roots_at`` of the samples (the run loop and what started it: they say nothing)."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for frames, n in _stacks(raw):
        total += n
        functions = [_function(f) for f in frames]
        own[functions[-1]] += n
        for function in set(functions):
            inclusive[function] += n
    roots = sorted(f for f, n in inclusive.items() if total and n >= roots_at * total)
    for root in roots:
        del inclusive[root]
    lines = [f"{raw.name}: {total} samples"]
    for title, counter in (("own", own), ("inclusive", inclusive)):
        lines.append(f"-- top {top} by {title} samples")
        if title == "inclusive" and roots:
            lines.append(
                f"   (left out, in >= {roots_at:.0%} of the samples: "
                + ", ".join(r.split(" ")[0] for r in roots)
                + ")"
            )
        lines += [
            f"{100 * n / max(total, 1):5.1f}%  {f[:140]}" for f, n in counter.most_common(top)
        ]
    return "\n".join(lines)


def category_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, pattern in _COMPILED:
            if pattern.search(frame):
                if name is None:
                    break  # passed over: try its caller
                return name
    for name, pattern in _FALLBACKS:
        if any(pattern.search(frame) for frame in frames):
            return name
    return OTHER


def categories(raw: Path) -> tuple[int, dict[str, int]]:
    """(samples, samples per category) of one raw profile, every category of ``RULES`` listed."""
    counts: dict[str, int] = {name: 0 for name in CATEGORIES}
    total = 0
    for frames, n in _stacks(raw):
        total += n
        counts[category_of(frames)] += n
    return total, counts


def category_table(
    profiles: Mapping[str, Path], user_ms: Mapping[str, float], sys_ms: Mapping[str, float]
) -> str:
    """Columns side by side, one per profile (e.g. request, healthz): each category's share of
    the samples and that share of the process's user CPU per operation (``user_ms``), then its
    kernel CPU per operation (``sys_ms``: the syscalls, which --gil sampling does not see) and
    the total; with two columns, the difference of the first and the second."""
    names = list(profiles)
    split = {name: categories(path) for name, path in profiles.items()}
    header = f"{'':42}" + "".join(f"{n[:18]:>20}" for n in names)
    if len(names) == 2:
        header += f"{names[0][:9] + ' - ' + names[1][:9]:>24}"
    lines = [header, f"{'':42}" + "".join(f"{'share  ms/op':>20}" for _ in names)]
    cats = CATEGORIES
    for cat in cats:
        cells, ms = [], []
        for name in names:
            total, counts = split[name]
            share = counts[cat] / total if total else 0.0
            ms.append(share * user_ms[name])
            cells.append(f"{share:7.1%} {ms[-1]:8.3f}   ")
        row = f"{cat[:41]:42}" + "".join(f"{c:>20}" for c in cells)
        if len(names) == 2:
            row += f"{ms[0] - ms[1]:+24.3f}"
        lines.append(row)
    for label, values in (
        ("kernel (syscalls; not sampled)", [sys_ms[n] for n in names]),
        ("all (user + kernel)", [user_ms[n] + sys_ms[n] for n in names]),
    ):
        row = f"{label:42}" + "".join(f"{'':8}{v:8.3f}{'':4}" for v in values)
        if len(names) == 2:
            row += f"{values[0] - values[1]:+24.3f}"
        lines.append(row)
    lines.append("samples: " + ", ".join(f"{n} {split[n][0]}" for n in names))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tools.bench._profile",
        description="top functions and CPU by category of saved raw py-spy profiles",
    )
    parser.add_argument("raw", nargs="+", type=Path, help="raw profiles (py-spy -f raw)")
    parser.add_argument("--top", type=int, default=25, help="functions per table (default 25)")
    args = parser.parse_args(argv)
    for raw in args.raw:
        print(summary(raw, top=args.top))
        print()
    # shares only: the CPU per operation is not in a raw profile
    ones = {raw.stem: 1.0 for raw in args.raw}
    zeros = {raw.stem: 0.0 for raw in args.raw}
    print("by category (ms/op column: share of 1 ms)")
    print(category_table({raw.stem: raw for raw in args.raw}, ones, zeros))
    return 0


if __name__ == "__main__":
    sys.exit(main())
