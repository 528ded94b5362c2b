"""PNG plots of a load-test report (matplotlib, imported only here and only when plotting)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLOTS = ("latency.png", "cpu.png", "rss.png")


def _nan(values: list[Any]) -> list[float]:
    return [float("nan") if v is None else float(v) for v in values]


def _marks(ax: Any, marks: dict[str, Any]) -> None:
    if marks.get("hold_end") is not None:
        ax.axvline(marks["hold_end"], color="0.6", linestyle=":", linewidth=1)
    if marks.get("steady_end") is not None:
        ax.axvline(marks["steady_end"], color="0.6", linestyle=":", linewidth=1)
    if marks.get("kill") is not None:
        ax.axvline(marks["kill"], color="red", linestyle="--", linewidth=1.2, label="kill -9")


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    """latency.png, cpu.png and rss.png in ``out``: one panel per phase, time from the
    start of that phase's load; dotted lines end the ramp and the steady phase, a dashed red
    line is the kill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = [p for p in report["phases"] if "series" in p]
    count = max(1, len(phases))
    written: list[Path] = []

    fig, axes = plt.subplots(count, 1, figsize=(11, 3.2 * count), squeeze=False)
    for ax, phase in zip(axes[:, 0], phases, strict=False):
        lat = phase["series"]["latency"]
        for q, color in (("p50", "tab:blue"), ("p95", "tab:orange"), ("p99", "tab:red")):
            ax.plot(lat["t"], _nan(lat[q]), label=q, color=color, linewidth=1)
        _marks(ax, phase["series"]["marks"])
        errors = [(t, e) for t, e in zip(lat["t"], lat["errors"], strict=True) if e]
        if errors:
            ax2 = ax.twinx()
            ax2.bar(
                [t for t, _ in errors],
                [e for _, e in errors],
                width=0.9,
                alpha=0.3,
                color="black",
                label="errors/s",
            )
            ax2.set_ylabel("errors / s")
        ax.set_title(f"{phase['instances']} instance(s): request latency per second")
        ax.set_ylabel("ms (from scheduled send)")
        ax.set_xlabel("s since load start")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = out / "latency.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)

    for metric, filename, ylabel in (
        ("cpu_pct", "cpu.png", "CPU % of one core"),
        ("rss_mb", "rss.png", "RSS MiB"),
    ):
        fig, axes = plt.subplots(count, 1, figsize=(11, 3.2 * count), squeeze=False)
        for ax, phase in zip(axes[:, 0], phases, strict=False):
            resources = phase["series"]["resources"]
            for name in phase["coordinators"]:
                s = resources.get(name)
                if s:
                    ax.plot(s["t"], _nan(s[metric]), label=name, linewidth=1)
            others = [n for n in resources if n not in phase["coordinators"]]
            for name in others:
                s = resources[name]
                ax.plot(
                    s["t"], _nan(s[metric]), label=name, linewidth=0.8, linestyle="--", alpha=0.6
                )
            if metric == "cpu_pct":
                ax.axhline(70, color="red", linewidth=0.8, alpha=0.5)
            _marks(ax, phase["series"]["marks"])
            ax.set_title(f"{phase['instances']} instance(s): {ylabel} per process")
            ax.set_ylabel(ylabel)
            ax.set_xlabel("s since load start")
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left", fontsize=7, ncol=4)
        fig.tight_layout()
        path = out / filename
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
