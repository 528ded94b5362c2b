"""Which /proc samples the load test's steady-phase CPU and RSS figures count: only those taken
wholly inside the steady phase, after the ramp's last request was answered (a sample straddling
the hold's end measures the closed loop at full concurrency, not the steady rate)."""

from __future__ import annotations

import math

from tools.loadtest import analysis
from tools.loadtest import profile as prof
from tools.loadtest.load import Load, Rec
from tools.loadtest.sampler import Series


def _load(hold_end: float, ramp_done: list[float]) -> Load:
    load = Load(prof.SMOKE, ["http://127.0.0.1:1"], [], [], None, [], kill=False)  # type: ignore[arg-type]
    load.hold_end, load.steady_end = hold_end, hold_end + 30.0
    for i, done in enumerate(ramp_done):
        load.records.append(Rec(tag=f"r{i}", kind="ramp", inst=0, sched=0.0, done=done))
    load.records.append(Rec(tag="q", kind="steady", inst=0, sched=hold_end, done=hold_end + 9.0))
    return load


def test_a_sample_counts_only_when_its_whole_second_is_in_the_window() -> None:
    t = [9.5, 10.5, 11.5, 12.5, 13.5]
    # 10.5 covers 9.5-10.5, mostly before 10.0: out; 11.5 (10.5-11.5) is the first in.
    assert analysis.in_window(t, 10.0, 13.5) == [2, 3, 4]
    assert analysis.in_window(t, 9.5, 12.5) == [1, 2, 3]
    assert analysis.in_window(t, 20.0, 30.0) == []


def test_the_steady_figures_start_once_the_ramp_has_drained() -> None:
    assert analysis.steady_state_from(_load(40.0, [39.0, 40.6, math.nan])) == 40.6
    assert analysis.steady_state_from(_load(40.0, [38.0])) == 40.0  # drained before the end
    assert analysis.steady_state_from(_load(40.0, [])) == 40.0
    # A ramp request answered very late (a 30 s timeout) keeps only RAMP_DRAIN_MAX_S out.
    late = analysis.steady_state_from(_load(40.0, [70.0]))
    assert late == 40.0 + analysis.RAMP_DRAIN_MAX_S


def test_the_hold_second_does_not_set_the_cpu_peak() -> None:
    # One-second samples: the hold at 60 %, the steady phase at 30 %; the sample at 40.9
    # covers 39.9-40.9, nine tenths of it hold.
    t = [36.9 + i for i in range(15)]
    cpu = [60.0 if x <= 40.9 else 30.0 for x in t]
    series = Series(t=t, cpu_pct=cpu, rss_mb=[100.0] * len(t))
    start = analysis.steady_state_from(_load(40.0, [40.3]))
    figures = analysis.resource_figures(series, start, 51.0)
    key = f"cpu_max_{prof.CPU_WINDOW_SAMPLES}s_pct"
    assert figures[key] == 30.0
    assert figures["cpu_max_pct"] == 30.0
    assert figures["samples"] == 10  # the samples at 41.9 .. 50.9
