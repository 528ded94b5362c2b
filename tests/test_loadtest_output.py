"""What `gemmanet loadtest` shows (issue 12 item 8), without running the load: its progress line,
its closing line, the CPU peak as a share of the seed's bound beside the machine's speed, our CPU
aim (reported, not a criterion), and no library chatter."""

from __future__ import annotations

import logging

from tools.loadtest import profile as prof
from tools.loadtest import speed, verdicts
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


def _phase(instances: int, peaks: dict[str, float], healthz_cpu_ms: float) -> dict:  # type: ignore[type-arg]
    phase = {
        "instances": instances,
        "coordinators": list(peaks),
        "resources_steady": {n: {"cpu_max_5s_pct": v} for n, v in peaks.items()},
        "machine_speed": {"instance": "I0", "healthz_cpu_ms": healthz_cpu_ms, "rate_per_s": 600.0},
    }
    phase["cpu_peak"] = speed.cpu_peak(phase)
    return phase


def test_the_cpu_peak_is_shown_as_a_share_of_the_bound_beside_the_machines_speed() -> None:
    phase = _phase(2, {"I0": 30.0, "I1": 41.0}, 0.81)
    assert phase["cpu_peak"] == {
        "instance": "I1", "pct": 41.0, "bound_pct": 70.0, "share_of_bound": 41.0 / 70.0
    }  # fmt: skip
    assert speed.phase_line(phase) == (
        "CPU peak 41.0 % = 0.59 x the 70 % bound; machine speed 0.81 ms CPU per /healthz "
        "(peak on I1; /healthz on I0, 600 req/s, before the load)"
    )
    # Not measured (no samples, no answers): said so, not a crash.
    assert speed.peak_and_speed(speed.cpu_peak(_phase(1, {}, 0.5)), {}) == (
        "CPU peak n/a % = n/a x the 70 % bound; machine speed n/a ms CPU per /healthz"
    )


def test_the_single_instance_cpu_aim_is_its_own_entry_and_not_a_criterion() -> None:
    phases = [_phase(1, {"I0": 43.0}, 0.9), _phase(2, {"I0": 20.0, "I1": 20.0}, 0.8)]
    (aim,) = verdicts.aims(phases)
    assert aim["id"] == "cpu_peak_single_instance" and aim["source"] == "ours, aim"
    assert aim["threshold"] == "<= 0.6 x 70% = 42%"
    # The single-instance phase is the one judged (43% > 42%), beside its machine's speed.
    assert aim["met"] is False
    assert aim["measured"]["cpu_peak_pct"] == 43.0
    assert aim["measured"]["machine_speed_healthz_cpu_ms"] == 0.9
    assert verdicts.aims([_phase(1, {"I0": 42.0}, 0.9)])[0]["met"] is True
    assert verdicts.aims(phases[1:])[0]["met"] is None  # no single-instance phase ran


def _judged(ids: tuple[str, ...]) -> list[dict[str, object]]:
    return [{"id": cid, "pass": False} for cid in ids]


ALL_IDS = ("zero_lost_tasks", *verdicts.MULTI_INSTANCE, "cpu_per_instance")


def test_a_criterion_the_chosen_phases_cannot_exercise_is_not_judged_rather_than_failed() -> None:
    # `--instances 1`: no hop and no kill to judge; the others keep their verdict.
    single = verdicts.not_chosen(prof.Profile("t", phases=(1,)), _judged(ALL_IDS))
    by_id = {c["id"]: c for c in single}
    for cid in verdicts.MULTI_INSTANCE:
        assert by_id[cid]["pass"] is None and "--instances" in str(by_id[cid]["not_judged"])
    assert by_id["zero_lost_tasks"]["pass"] is False and by_id["cpu_per_instance"]["pass"] is False
    # `--fault-s 0`: the hop is judged, the kill is not.
    no_kill = verdicts.not_chosen(prof.Profile("t", fault_s=0.0), _judged(ALL_IDS))
    judged = {c["id"] for c in no_kill if c["pass"] is not None}
    assert judged == set(ALL_IDS) - set(verdicts.KILL)
    # The default profile judges every criterion.
    full = verdicts.not_chosen(prof.Profile("t"), _judged(ALL_IDS))
    assert all(c["pass"] is False for c in full)
