"""What `gemmanet loadtest` shows (issue 12 item 8), without running the load: its progress line,
its closing line, and no library chatter."""

from __future__ import annotations

import logging

from tools.loadtest import profile as prof
from tools.loadtest.load import Load, Rec
from tools.loadtest.progress import progress_line, quiet_libraries
from tools.loadtest.runner import closing_line


def test_progress_line_shows_phase_stage_elapsed_requests_and_errors() -> None:
    load = Load(prof.SMOKE, ["http://127.0.0.1:1"], [], [], None, [], kill=False)  # type: ignore[arg-type]
    assert "starting" in progress_line(load, 2, 0.0)
    load.t0, load.hold_end, load.steady_end = 100.0, 110.0, 130.0
    load.records += [
        Rec(tag="a", kind="ramp", inst=0, sched=100.0, outcome="ok"),
        Rec(tag="b", kind="steady", inst=1, sched=111.0, outcome="error"),
        Rec(tag="c", kind="steady", inst=1, sched=112.0),
    ]
    load.in_flight = 1
    line = progress_line(load, 2, 112.4)
    assert line == "2 instance(s) | steady |    12 s | 3 requests, 1 in flight | 1 errors"
    assert "ramp" in progress_line(load, 2, 105.0)
    load.killed = 1
    assert "after the kill" in progress_line(load, 2, 131.0)


def test_closing_line_says_plainly_when_no_plots_were_drawn() -> None:
    report = {"passed": True, "out": "out", "plots": []}
    report["plots_error"] = "matplotlib is needed: pip install -e '.[loadtest]' (No module)"
    line = closing_line(report)
    assert line.endswith(
        "no plots drawn (matplotlib is needed: pip install -e '.[loadtest]' (No module))"
    )
    report = {"passed": False, "out": "out", "plots": ["latency.png", "cpu.png"]}
    assert closing_line(report) == (
        "  NOT all criteria hold; report out/report.json; plots latency.png, cpu.png"
    )


def test_library_request_lines_are_kept_out() -> None:
    logging.getLogger("httpx").setLevel(logging.NOTSET)
    quiet_libraries()
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)


async def test_progress_runs_until_cancelled_then_prints_the_phase_totals(
    autojump_clock, capsys
) -> None:  # type: ignore[no-untyped-def]
    import trio

    from tools.loadtest import progress

    load = Load(prof.SMOKE, ["http://127.0.0.1:1"], [], [], None, [], kill=False)  # type: ignore[arg-type]
    load.records.append(Rec(tag="a", kind="ramp", inst=0, sched=0.0, outcome="error"))
    with trio.move_on_after(12):
        await progress.show_progress(load, 3)
    err = capsys.readouterr().err
    assert err.count("3 instance(s) | ") == 3, err  # at 5 s, at 10 s, and the final line
    assert err.rstrip().endswith(
        "3 instance(s) | done |     0 s | 1 requests, 0 in flight | 1 errors"
    )
