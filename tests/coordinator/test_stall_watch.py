"""The presence evidence of the streams bus (bus/stall_watch.py), on its own and without a
clock: the arithmetic that makes a late refresh cost latency, not a verdict."""

from __future__ import annotations

import copy

import pytest

from coordinator.coordination.bus.stall_watch import StallWatch
from coordinator.core.liveness import STREAMS_PRESENCE_TTL_S, STREAMS_REFRESH_S

T, R = STREAMS_PRESENCE_TTL_S, STREAMS_REFRESH_S
RTT = 0.002


def watch() -> StallWatch:
    return StallWatch(presence_ttl_s=T, refresh_s=R)


def test_the_default_bounds() -> None:
    w = watch()
    assert (T, R, w.stall_s) == (1.0, 0.25, 0.25)
    # A live listener's key survives a refresh this late (plus its round trip)...
    assert T - R == 0.75
    # ... a stall longer than this is seen whatever the phase of our own refreshes ...
    assert R + w.stall_s == 0.5
    # ... so a key lapses unseen only under a listener more than this late itself.
    assert T - 2 * R - w.stall_s == w.stall_s


def listening(until: float) -> tuple[StallWatch, float]:
    """A bus whose listen refreshed promptly every R from 0 to ``until``; its last answer."""
    w, t = watch(), 0.0
    w.keeping_present = True
    while True:
        w.refresh_sent(t)
        w.refresh_done(t + RTT)
        if t + RTT + R > until:
            return w, t + RTT
        t += RTT + R


def refresh_promptly(w: StallWatch, after: float, until: float) -> float:
    """Prompt refreshes every R from ``after`` on, up to ``until``; the last answer."""
    t = after
    while t + R + RTT <= until:
        w.refresh_sent(t + R)
        t += R + RTT
        w.refresh_done(t)
    return t


def test_a_bus_that_saw_no_stall_believes_what_it_reads() -> None:
    assert watch().believed(0.0)
    w, last = listening(until=5.0)
    assert w.believed(last + 0.1)


def test_a_slow_refresh_or_a_slow_answer_is_a_stall_for_one_ttl() -> None:
    w, last = listening(until=5.0)
    w.refresh_sent(last + R)
    done = last + R + w.stall_s + 0.01
    w.refresh_done(done)  # took longer than the allowance
    assert not w.believed(done)
    t = refresh_promptly(w, done, done + T - 0.01)
    assert not w.believed(t)
    assert w.believed(refresh_promptly(w, t, done + T + 2 * R))

    w, last = listening(until=5.0)
    assert w.answered(last, last + w.stall_s)  # prompt enough
    slow = last + w.stall_s + 0.01
    assert not w.answered(last, slow)
    t = refresh_promptly(w, last, slow + T - 0.01)
    assert not w.believed(t)
    assert w.believed(refresh_promptly(w, t, slow + T + 2 * R))


def test_a_refresh_outstanding_or_overdue_means_a_stall_under_way() -> None:
    w, last = listening(until=5.0)
    w.refresh_sent(last + R)
    assert w.believed(last + R + w.stall_s)
    assert not w.believed(last + R + w.stall_s + 0.01)  # still no answer
    w, last = listening(until=5.0)
    assert w.believed(last + R + w.stall_s)  # the loop is late sending it, within the allowance
    assert not w.believed(last + R + w.stall_s + 0.01)
    w.keeping_present = False  # not listening: no refresh is due
    assert w.believed(last + 10.0)


def test_a_failed_refresh_stops_belief_until_a_ttl_of_prompt_ones() -> None:
    w, last = listening(until=5.0)
    w.refresh_sent(last + R)
    w.refresh_failed()
    assert not w.believed(last + R + 0.01)
    back = last + 2 * R + RTT
    w.refresh_sent(back - RTT)
    w.refresh_done(back)
    t = refresh_promptly(w, back, back + T - 0.01)
    assert not w.believed(t)
    assert w.believed(refresh_promptly(w, t, back + T + 2 * R))
    w.read_timed_out()  # a listen lost to a read that timed out
    assert not w.believed(back + T + R)


@pytest.mark.parametrize("late", [0.0, 0.1, 0.2])
@pytest.mark.parametrize("stall_s", [0.51, 0.6, 0.75, 1.0, 2.5])
@pytest.mark.parametrize("phase", [i / 20 * (R + RTT) for i in range(20)])
def test_a_stall_that_can_lapse_a_live_key_is_seen_by_every_read_after_it(
    stall_s: float, phase: float, late: float
) -> None:
    """Redis stops ``phase`` after our last refresh answered, for ``stall_s`` (more than R + s:
    long enough to lapse a listener late by s or less), and our loop sends its next refresh
    ``late`` (less than s: not a stall of ours). Every presence read answered after the stall
    (sent any time from just before it) sees a stall, until one TTL after its end; then
    absence is believed again. Checked with our refresh's answer handled before the read's,
    and, for reads answered with it, after."""
    w, last = listening(until=10.0)
    paused, resumed = last + phase, last + phase + stall_s
    due = last + R + late
    sent = due if due < resumed else None
    if sent is not None:
        w.refresh_sent(sent)  # on its way in the stall: answered once it ends
    ends = resumed + RTT
    for read_sent in [paused - 0.05, paused, paused + 0.2, resumed - 0.01, resumed + 0.01]:
        for extra in [0.0, 0.02, 0.3, T / 2, T - 0.05]:
            answer = max(read_sent, resumed) + RTT + extra
            if answer <= ends + 0.05:  # the read's answer handled before our refresh's
                early = copy.deepcopy(w)
                assert not (early.answered(read_sent, answer) and early.believed(answer))
            later = copy.deepcopy(w)
            if sent is not None:
                later.refresh_done(ends)
            refresh_promptly(later, ends, answer)  # ours, after the stall
            if answer < ends + T:
                assert not (later.answered(read_sent, answer) and later.believed(answer)), (
                    read_sent,
                    answer,
                )
    # One TTL of prompt refreshes after the stall, absences are believed again.
    if sent is not None:
        w.refresh_done(ends)
    assert w.believed(refresh_promptly(w, ends, ends + T + 2 * R))
