"""Fair admission end to end in one process: the production ``Instance`` on the embedded
backend with one simulated node of 2 slots on trio's MockClock (``sim/fairness.py``). One API
key floods 300 requests; another sends one a second. Under ``fair`` its requests wait about
one grant (p95 within 3 slot turnovers); under ``fifo`` each waits for the flood ahead of it
(about 150 turnovers). Either way every request is answered and the node, counting itself,
never runs more than its 2 slots."""

from __future__ import annotations

from sim.fairness import run_fairness


def test_a_flood_of_one_key_does_not_hold_up_another_under_fair() -> None:
    fair = run_fairness("fair", flood=300, slots=2, quiet=20)
    assert fair.answered == fair.sent == 320
    assert fair.peak_running == 2
    assert len(fair.quiet_waits) == 20
    assert fair.quiet_p95 <= 3.0, fair.quiet_waits
    # The flood itself still drains at full speed: its last request waited for the rest of it
    # (300 requests on 2 slots) and the quiet key's 20.
    assert 150 <= fair.flood_max_wait <= 161, fair.flood_max_wait
    # A wake reaches the head the store names: a grant costs a few asks (measured 4.2), not
    # a walk down the flood's local waiters (39 per grant with the wake passed down the line,
    # as under fifo).
    assert fair.asks_per_grant <= 8, fair.asks_per_grant


def test_under_fifo_the_same_key_waits_behind_the_whole_flood() -> None:
    fifo = run_fairness("fifo", flood=300, slots=2, quiet=20)
    assert fifo.answered == fifo.sent == 320
    assert fifo.peak_running == 2
    assert fifo.quiet_p95 >= 140, fifo.quiet_waits
    assert min(fifo.quiet_waits) >= 130, fifo.quiet_waits
