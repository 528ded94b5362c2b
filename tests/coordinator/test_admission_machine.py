"""The admission machine (coordinator/core/admission/machine.py) on its own: events in with plain
numbers for ``now``, decisions out. No trio, no store: the test plays the store's answers."""

from __future__ import annotations

import pytest

from coordinator.coordination.leases import Admission
from coordinator.core.admission.machine import (
    GONE_GIVE_UP_S,
    GONE_RETRY_S,
    POLL_S,
    AdmissionMachine,
    AskStore,
    Decision,
    Failed,
    Granted,
    Left,
    MayHold,
    Queued,
    WaitUntil,
    WakeLocal,
    WakePeer,
    step_of,
)
from coordinator.core.admission.retries import (
    RELEASE_GIVE_UP_S,
    STORE_RETRY_FIRST_S,
    STORE_RETRY_MAX_S,
    release_retry_in,
    store_retry_in,
)
from coordinator.core.liveness import (
    FAILOVER_PROMISE_S,
    store_outage_bound_s,
    store_outage_problem,
)
from coordinator.core.placement.choose import NodeView
from coordinator.errors import AllNodesBusy, CoordinationDown, NoNodeForModel, TooManyActive
from coordinator.settings import Settings

QUEUE_TIMEOUT_S = 30.0
STORE_OUTAGE_S = 2.9
N1 = NodeView("n1", "B", "c1", frozenset({"m"}), max_parallel=1, in_flight=0)
N2 = NodeView("n2", "C", "c2", frozenset({"m"}), max_parallel=1, in_flight=0)
T1, T2, T3 = ("t1", 1), ("t2", 1), ("t3", 1)


def machine(queue_timeout_s: float = QUEUE_TIMEOUT_S) -> AdmissionMachine:
    return AdmissionMachine(
        "A",
        queue_timeout_s=queue_timeout_s,
        queue_max=7,
        max_active_per_key=3,
        store_outage_s=STORE_OUTAGE_S,
    )


def granted(view: NodeView = N1, next_in_queue: str = "") -> Admission:
    return Admission("granted", view.node_id, view.conn_id, "lease-1", next_in_queue=next_in_queue)


def queued(position: int = 0) -> Admission:
    return Admission("queued", position=position)


def gone() -> Admission:
    return Admission("refused", refusals={"n1": "gone", "n2": "gone"})


def only(decisions: list[Decision], kind: type) -> list[Decision]:
    return [d for d in decisions if isinstance(d, kind)]


def queue(m: AdmissionMachine, *tickets: tuple[str, int], now: float = 0.0) -> None:
    """Start each ticket and have the store queue it, in order."""
    for position, ticket in enumerate(tickets):
        assert step_of(m.start(ticket, "m", [N1], now)) == AskStore(ticket, "m", (N1,))
        m.answer(ticket, queued(position), now)


# -- granted ----------------------------------------------------------------------------------


def test_granted_at_once_takes_the_lease_and_leaves_the_local_queue() -> None:
    m = machine()
    assert m.start(T1, "m", [N1, N2], 0.0) == [AskStore(T1, "m", (N1, N2))]
    assert m.queued() == {"m": 1}
    decisions = m.answer(T1, granted(N2), 0.2)
    assert decisions == [Granted(T1, N2, "lease-1"), Left(T1, None)]
    assert m.queued() == {} and m.waiting() == []


def test_a_grant_with_others_queued_wakes_the_next_in_line_here_or_at_its_peer() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    assert m.answer(T1, granted(next_in_queue="C"), 0.0)[0] == WakePeer("C", "m")
    queue(m, T2)
    m.start(T3, "m", [N1], 0.0)
    # The next in line is this instance's: its first local waiter is woken.
    assert m.answer(T3, granted(next_in_queue="A"), 0.0)[0] == WakeLocal(T2)


def test_queued_then_woken_then_granted() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    decisions = m.answer(T1, queued(0), 0.125)
    assert decisions == [Queued(T1, 0), WaitUntil(T1, 0.125 + POLL_S, "poll")]
    assert m.waiting() == [WaitUntil(T1, 0.125 + POLL_S, "poll")]
    assert m.wake_local("m") == [WakeLocal(T1)]
    assert m.waited(T1, [N2], 0.5) == [AskStore(T1, "m", (N2,))]  # candidates read again
    decisions = m.answer(T1, granted(N2), 0.625)
    assert decisions == [Granted(T1, N2, "lease-1"), Left(T1, 0.5)]  # queued at 0.125


def test_a_wake_while_asking_counts_for_the_next_wait() -> None:
    m = machine()
    queue(m, T1, T2)
    m.waited(T1, [N1], POLL_S)  # T1 asks again after a poll...
    assert m.wake_local("m") == [WakeLocal(T1)]  # ...and a wake comes meanwhile
    assert only(m.answer(T1, queued(1), 1.1), WakeLocal) == []  # not asked after a wake
    # The wake is kept (the shell's wait on it returns at once): the ask that follows counts
    # as woken, and queued behind a peer's request it passes the wake on.
    m.waited(T1, [N1], 1.1)
    assert only(m.answer(T1, queued(1), 1.2), WakeLocal) == [WakeLocal(T2)]


# -- polling and waking -----------------------------------------------------------------------


def test_only_the_first_local_waiter_polls_the_others_wait_for_a_wake() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    m.start(T2, "m", [N1], 0.0)
    assert step_of(m.answer(T1, queued(0), 0.0)) == WaitUntil(T1, POLL_S, "poll")
    assert step_of(m.answer(T2, queued(1), 0.0)) == WaitUntil(T2, QUEUE_TIMEOUT_S, "queue_deadline")
    # A poll comes back queued: it polls again.
    m.waited(T1, [N1], POLL_S)
    assert step_of(m.answer(T1, queued(0), POLL_S)) == WaitUntil(T1, 2 * POLL_S, "poll")


def test_the_first_waiter_near_its_deadline_waits_for_the_deadline_not_past_it() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    m.answer(T1, queued(0), 0.0)
    now = QUEUE_TIMEOUT_S - POLL_S / 2
    m.waited(T1, [N1], now)
    assert step_of(m.answer(T1, queued(0), now)) == WaitUntil(T1, QUEUE_TIMEOUT_S, "queue_deadline")


def test_waiters_of_other_models_each_have_their_own_first() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    m.start(T2, "x", [N1], 0.0)
    assert step_of(m.answer(T1, queued(0), 0.0)) == WaitUntil(T1, POLL_S, "poll")
    assert step_of(m.answer(T2, queued(3), 0.0)) == WaitUntil(T2, POLL_S, "poll")
    assert m.queued() == {"m": 1, "x": 1}
    assert m.wake_local("x") == [WakeLocal(T2)] and m.wake_local("y") == []


def test_woken_but_not_first_in_the_shared_queue_passes_the_wake_to_the_next_local_waiter() -> None:
    m = machine()
    queue(m, T1, T2, T3)
    m.wake_local("m")
    m.waited(T1, [N1], 0.5)
    decisions = m.answer(T1, queued(1), 0.5)  # a peer's request is ahead of it after all
    assert decisions == [Queued(T1, 1), WakeLocal(T2), WaitUntil(T1, 0.5 + POLL_S, "poll")]


def test_a_poll_that_is_not_first_passes_no_wake_nor_does_a_woken_waiter_that_is_first() -> None:
    m = machine()
    queue(m, T1, T2)
    m.waited(T1, [N1], POLL_S)  # its poll, no wake
    assert only(m.answer(T1, queued(1), POLL_S), WakeLocal) == []
    m.wake_local("m")
    m.waited(T1, [N1], 1.5)
    assert only(m.answer(T1, queued(0), 1.5), WakeLocal) == []


def test_the_last_local_waiter_passes_no_wake() -> None:
    m = machine()
    queue(m, T1)
    m.wake_local("m")
    m.waited(T1, [N1], 0.5)
    assert only(m.answer(T1, queued(2), 0.5), WakeLocal) == []


def test_the_first_local_waiter_leaving_wakes_the_next_others_leaving_wake_nobody() -> None:
    m = machine()
    queue(m, T1, T2, T3)
    assert m.ended(T2, 1.0) == [Left(T2, 1.0)]
    assert m.ended(T1, 2.0) == [Left(T1, 2.0), WakeLocal(T3)]
    assert m.queued() == {"m": 1}
    assert m.ended(T1, 2.0) == []  # once only


def test_wake_names_this_instance_or_a_peer() -> None:
    m = machine()
    assert m.wake("m", "B") == [WakePeer("B", "m")]
    assert m.wake("m", "A") == []  # nobody waits here
    queue(m, T1)
    assert m.wake("m", "A") == [WakeLocal(T1)]


# -- every candidate gone ---------------------------------------------------------------------


def test_every_candidate_gone_looks_again_every_gone_retry_s_then_fails_with_facts_missing() -> (
    None
):
    m = machine()
    m.start(T1, "m", [N1, N2], 0.0)
    now, asks = 0.0, 0
    while True:
        decisions = m.answer(T1, gone(), now)
        step = step_of(decisions)
        if isinstance(step, Failed):
            break
        assert step == WaitUntil(T1, now + GONE_RETRY_S, "gone_retry") and not step.wakeable
        now = step.at
        assert step_of(m.waited(T1, [N1, N2], now)) == AskStore(T1, "m", (N1, N2))
        asks += 1
    assert now == pytest.approx(GONE_GIVE_UP_S)
    assert asks == round(GONE_GIVE_UP_S / GONE_RETRY_S)
    assert step.reason == "facts_missing" and isinstance(step.error, CoordinationDown)
    assert step.error.message == (
        "the shared store has no current facts for the nodes serving model 'm' "
        "(it may have restarted; their instances are writing them again)"
    )
    assert decisions[-1] == Left(T1, None)


def test_the_gone_give_up_bound_holds_across_a_spell_in_the_queue() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    m.answer(T1, gone(), 0.0)  # the bound starts here
    m.waited(T1, [N1], 0.25)
    m.answer(T1, queued(0), 0.25)
    m.waited(T1, [N1], GONE_GIVE_UP_S)
    step = step_of(m.answer(T1, gone(), GONE_GIVE_UP_S))
    assert isinstance(step, Failed) and step.reason == "facts_missing"


def test_a_wake_during_a_gone_retry_does_not_cut_it_short_but_is_kept() -> None:
    m = machine()
    queue(m, T1)
    m.waited(T1, [N1], POLL_S)
    assert step_of(m.answer(T1, gone(), POLL_S)).why == "gone_retry"  # type: ignore[union-attr]
    assert m.wake_local("m") == [WakeLocal(T1)]
    m.waited(T1, [N1], POLL_S + GONE_RETRY_S)  # its time came: the wake is not consumed...
    m.start(T2, "m", [N1], 1.3)
    m.answer(T2, queued(1), 1.3)
    # ...so the next wakeable wait of T1 counts as woken: queued behind a peer, it passes the
    # wake on to T2.
    m.answer(T1, queued(0), 1.3)
    m.waited(T1, [N1], 1.3)
    assert only(m.answer(T1, queued(1), 1.3), WakeLocal) == [WakeLocal(T2)]


def test_the_queue_timeout_also_ends_a_request_whose_candidates_are_gone() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    m.answer(T1, queued(0), 0.0)
    m.waited(T1, [N1], QUEUE_TIMEOUT_S)
    step = step_of(m.answer(T1, gone(), QUEUE_TIMEOUT_S))
    assert isinstance(step, Failed) and step.reason == "queue_timeout"


# -- failing at once --------------------------------------------------------------------------


def test_stale_facts_fail_at_once_naming_the_stale_nodes() -> None:
    m = machine()
    m.start(T1, "m", [N1, N2], 0.0)
    answer = Admission("refused", refusals={"n2": "stale", "n1": "gone", "n0": "stale"})
    decisions = m.answer(T1, answer, 0.0)
    step = step_of(decisions)
    assert isinstance(step, Failed) and step.reason == "stale_facts"
    assert isinstance(step.error, CoordinationDown)
    assert step.error.message == (
        "the facts of node(s) n0, n2 are stale (their instance stopped updating them); "
        "nothing is placed on a guess"
    )
    assert decisions[-1] == Left(T1, None) and m.queued() == {}


def test_the_key_limit_fails_at_once_with_429() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    step = step_of(m.answer(T1, Admission("key_limit"), 0.0))
    assert isinstance(step, Failed) and step.reason == "key_limit"
    assert isinstance(step.error, TooManyActive) and step.error.retry_after_s == 1
    assert step.error.message == (
        "this API key already has 3 request(s) running or queued (GEMMANET_MAX_ACTIVE_PER_KEY)"
    )


def test_a_full_queue_fails_at_once_with_503() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    step = step_of(m.answer(T1, Admission("queue_full"), 0.0))
    assert isinstance(step, Failed) and step.reason == "queue_full"
    assert isinstance(step.error, AllNodesBusy) and step.error.retry_after_s == 5
    assert step.error.message == "7 request(s) already wait for model 'm' (GEMMANET_QUEUE_MAX)"


def test_a_store_that_cannot_be_reached_fails_closed() -> None:
    m = machine()
    queue(m, T1, T2)
    m.waited(T1, [N1], POLL_S)
    decisions = m.unreachable(T1, 1.5)
    step = step_of(decisions)
    assert isinstance(step, Failed) and step.reason == "coordination_unavailable"
    assert isinstance(step.error, CoordinationDown)
    assert step.error.message == (
        "capacity cannot be reserved while the coordination store is unreachable; "
        "retry after the Retry-After delay"
    )
    assert decisions[1:] == [Left(T1, 1.5), WakeLocal(T2)]  # it was first: the next goes on


def test_the_queue_timeout_fails_with_503_and_a_retry_after() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    m.answer(T1, queued(0), 0.0)
    m.waited(T1, [N1], QUEUE_TIMEOUT_S)
    decisions = m.answer(T1, queued(0), QUEUE_TIMEOUT_S)
    assert decisions[0] == Queued(T1, 0)  # still counted as a denial for want of room
    step = step_of(decisions)
    assert isinstance(step, Failed) and step.reason == "queue_timeout"
    assert isinstance(step.error, AllNodesBusy) and step.error.retry_after_s == 3
    assert step.error.message == (
        "no node serving model 'm' had room within 30 s (GEMMANET_QUEUE_TIMEOUT_S)"
    )
    assert decisions[-1] == Left(T1, QUEUE_TIMEOUT_S)


def test_the_ask_after_the_queue_deadline_may_still_be_granted() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    m.answer(T1, queued(0), 0.0)
    assert step_of(m.waited(T1, [N1], QUEUE_TIMEOUT_S + 1)) == AskStore(T1, "m", (N1,))
    assert isinstance(step_of(m.answer(T1, granted(), QUEUE_TIMEOUT_S + 1)), Granted)


def test_no_candidate_left_fails_as_no_node_serving_the_model() -> None:
    m = machine()
    step = step_of(m.start(T1, "m", [], 0.0))
    assert isinstance(step, Failed) and step.reason == "no_node"
    assert isinstance(step.error, NoNodeForModel)
    queue(m, T2)
    decisions = m.waited(T2, [], POLL_S)  # its last candidate went away while it waited
    step = step_of(decisions)
    assert isinstance(step, Failed) and step.reason == "no_node"
    assert step.error.message == "no online node serves model 'm'"
    assert decisions[-1] == Left(T2, POLL_S) and m.queued() == {}


# -- a slow store: latency, not errors --------------------------------------------------------


def test_a_timed_out_ask_waits_then_asks_again_and_is_granted() -> None:
    m = machine()
    assert m.start(T1, "m", [N1], 0.0) == [AskStore(T1, "m", (N1,))]
    decisions = m.timed_out(T1, 1.0)  # the store did not answer within its 1 s
    # The request now gives back, when it ends, whatever the unanswered ask left in the store,
    # a lease on the node it named included.
    assert decisions[0] == MayHold(T1, ("n1",))
    step = step_of(decisions)
    assert isinstance(step, WaitUntil) and step.why == "store_retry" and not step.wakeable
    assert 1.0 + STORE_RETRY_FIRST_S / 2 <= step.at <= 1.0 + STORE_RETRY_FIRST_S
    assert m.waiting() == [step]
    # Asked again, marked so: the store looks for a lease the unanswered ask may have got.
    assert m.waited(T1, [N1], step.at) == [AskStore(T1, "m", (N1,), again=True)]
    decisions = m.answer(T1, granted(), step.at + 0.01)
    assert decisions == [Granted(T1, N1, "lease-1"), Left(T1, None)]


def test_timeouts_back_off_doubling_to_half_a_second_with_jitter() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    now, delays, mayhold = 0.0, list[float](), 0
    for _ in range(3):  # the first ask times out after 1 s, each retry after 0.2 s
        now += 1.0 if not delays else 0.2
        decisions = m.timed_out(T1, now)
        mayhold += len(only(decisions, MayHold))
        step = step_of(decisions)
        assert isinstance(step, WaitUntil) and step.why == "store_retry"
        delays.append(step.at - now)
        now = step.at
        assert step_of(m.waited(T1, [N1], now)) == AskStore(T1, "m", (N1,), again=True)
    assert mayhold == 1  # said once (the same node each time)
    for n, delay in enumerate(delays, start=1):
        top = min(STORE_RETRY_FIRST_S * 2 ** (n - 1), STORE_RETRY_MAX_S)
        assert top / 2 <= delay <= top
    longest = store_retry_in(20, 0.0, 1.0, "x")
    assert longest is not None and longest <= STORE_RETRY_MAX_S
    # Jittered: two requests of one outage do not retry in step.
    assert store_retry_in(1, 0.0, 1.0, "t1.1") != store_retry_in(1, 0.0, 1.0, "t2.1")
    assert store_retry_in(1, 1.0, 1.0, "t1.1") is None


def test_a_store_silent_past_the_bound_fails_closed() -> None:
    m = machine()
    queue(m, T1, T2)  # answered at 0: T1 first in line, polling
    m.waited(T1, [N1], POLL_S)  # its poll is sent at 1.0 ...
    now, failed = POLL_S + 1.0, None  # ... and gets no answer, nor does any ask after it
    while failed is None:
        decisions = m.timed_out(T1, now)
        step = step_of(decisions)
        if isinstance(step, Failed):
            failed = step
            break
        assert isinstance(step, WaitUntil)
        m.waited(T1, [N1], step.at)
        now = step.at + 1.0  # each ask again times out after its 1 s
    # Silent since the poll was sent: given up at the first timeout past the bound.
    assert now >= POLL_S + STORE_OUTAGE_S and now - 1.5 < POLL_S + STORE_OUTAGE_S
    assert failed.reason == "coordination_unavailable"
    assert isinstance(failed.error, CoordinationDown) and failed.error.retry_after_s >= 1
    assert failed.error.message.startswith(
        "capacity cannot be reserved: the coordination store did not answer for "
    )
    assert decisions[-2:] == [Left(T1, now), WakeLocal(T2)]  # queued at 0; the next goes on


def test_an_answer_ends_the_outage_so_the_bound_counts_from_the_next_silence() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    step = step_of(m.timed_out(T1, 1.0))
    m.waited(T1, [N1], step.at)  # type: ignore[union-attr]
    m.answer(T1, queued(0), 2.0)  # the store answers: queued
    m.waited(T1, [N1], 2.5)
    # Silent again from 2.5 on: at 2.5 + 2.8 it is not past the bound yet (from 0 it would be).
    step = step_of(m.timed_out(T1, 2.5 + STORE_OUTAGE_S - 0.1))
    assert isinstance(step, WaitUntil) and step.why == "store_retry"


def test_a_store_that_answers_others_is_slow_not_gone_so_the_request_waits_to_its_deadline() -> (
    None
):
    m = machine(queue_timeout_s=10.0)
    m.start(T1, "m", [N1], 0.0)
    now = 1.0
    while True:  # every ask of T1 times out, yet the store answered others 0.2 s before
        step = step_of(m.timed_out(T1, now, silent_for_s=0.2))
        if isinstance(step, Failed):
            break
        assert isinstance(step, WaitUntil)
        m.waited(T1, [N1], step.at)
        now = step.at + 1.0
    assert now >= 10.0 and step.reason == "coordination_unavailable"
    # Silent to everybody: a request that comes late in the outage still waits out the bound
    # counted from its own first ask (never fails sooner), then fails closed.
    m.start(T2, "m", [N1], 20.0)
    step = step_of(m.timed_out(T2, 21.0, silent_for_s=STORE_OUTAGE_S + 1.0))
    assert isinstance(step, WaitUntil)
    m.waited(T2, [N1], step.at)
    step = step_of(m.timed_out(T2, 20.0 + STORE_OUTAGE_S, silent_for_s=STORE_OUTAGE_S + 3.9))
    assert isinstance(step, Failed) and step.reason == "coordination_unavailable"


def test_a_short_queue_timeout_ends_the_wait_for_a_slow_store_sooner() -> None:
    m = machine(queue_timeout_s=1.5)
    m.start(T1, "m", [N1], 0.0)
    step = step_of(m.timed_out(T1, 1.0))
    assert isinstance(step, WaitUntil)
    m.waited(T1, [N1], step.at)
    step = step_of(m.timed_out(T1, 1.6))  # past the request's own budget
    assert isinstance(step, Failed) and step.reason == "coordination_unavailable"


def test_a_refused_or_closed_connection_still_fails_fast() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    decisions = m.unreachable(T1, 0.01)
    step = step_of(decisions)
    assert isinstance(step, Failed) and step.reason == "coordination_unavailable"
    assert only(decisions, MayHold) == [] and decisions[-1] == Left(T1, None)


def test_a_wake_during_a_store_retry_does_not_cut_it_short_and_counts_for_the_ask_again() -> None:
    m = machine()
    queue(m, T1, T2)
    m.wake_local("m")
    m.waited(T1, [N1], 0.5)  # woken: asks at 0.5...
    m.timed_out(T1, 1.5)  # ...no answer
    assert m.wake_local("m") == [WakeLocal(T1)]  # a wake while it backs off is kept
    m.waited(T1, [N1], 1.6)
    # The ask again still follows the wake: queued behind a peer, it passes the wake on.
    assert only(m.answer(T1, queued(1), 1.7), WakeLocal) == [WakeLocal(T2)]


def test_a_request_that_ended_while_backing_off_only_leaves() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    m.timed_out(T1, 1.0)
    assert m.waited(T1, None, 1.1) == [Left(T1, None)]
    assert m.timed_out(T1, 1.2) == []


def test_the_store_outage_bound_is_the_failover_bound_and_fits_the_queue_timeout() -> None:
    settings = Settings()
    timing = settings.liveness_timing()
    assert settings.store_outage_s == store_outage_bound_s(timing.failover_bound_s)
    assert settings.store_outage_s == pytest.approx(2.9)
    assert settings.store_outage_s <= FAILOVER_PROMISE_S
    # It fits in a request's budget with the defaults; a shorter queue timeout is said at start.
    assert store_outage_problem(settings.store_outage_s, settings.queue_timeout_s) is None
    problem = store_outage_problem(settings.store_outage_s, 1.0)
    assert problem is not None and "shorter than the store outage bound 2.90 s" in problem


# -- the request ended meanwhile --------------------------------------------------------------


def test_a_request_that_ended_before_its_reserve_ran_is_not_registered() -> None:
    m = machine()
    assert m.start(T1, None, None, 0.0) == []
    assert m.start(T1, "m", None, 0.0) == []
    assert m.queued() == {}


def test_a_request_that_ended_while_it_waited_only_leaves_and_wakes_the_next() -> None:
    m = machine()
    queue(m, T1, T2)
    decisions = m.waited(T1, None, POLL_S)
    assert step_of(decisions) is None
    assert decisions == [Left(T1, POLL_S), WakeLocal(T2)]
    assert m.waited(T1, [N1], 2.0) == [] and m.answer(T1, granted(), 2.0) == []
    assert m.unreachable(T1, 2.0) == []


def test_the_same_reserve_started_twice_is_registered_once() -> None:
    m = machine()
    m.start(T1, "m", [N1], 0.0)
    assert m.start(T1, "m", [N1], 0.0) == []
    assert m.queued() == {"m": 1}


# -- releases ---------------------------------------------------------------------------------


def test_a_failed_release_is_retried_with_backoff_until_release_give_up_s() -> None:
    delays, now, failures = [], 0.0, 0
    while True:
        failures += 1
        delay = release_retry_in(failures, 0.0, now)
        if delay is None:
            break
        delays.append(delay)
        now += delay
    assert delays[:7] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert now < RELEASE_GIVE_UP_S <= now + 2.0


# -- the fair order ----------------------------------------------------------------------------


def fair_machine() -> AdmissionMachine:
    return AdmissionMachine(
        "A",
        queue_timeout_s=QUEUE_TIMEOUT_S,
        queue_max=7,
        max_active_per_key=3,
        store_outage_s=STORE_OUTAGE_S,
        fair=True,
    )


def test_fair_a_waiter_told_it_is_not_the_head_wakes_the_head_if_it_waits_here() -> None:
    m = fair_machine()
    T4, T5 = ("t4", 1), ("t5", 1)
    for ticket in (T1, T2, T3):
        m.start(ticket, "m", [N1], 0.0)
        m.answer(ticket, Admission("queued", position=1, head="t9"), 0.0)
    # Woken, the first waiter asks; the store names t3 (another key's turn) as its head: t3
    # is woken at once, not t2 after t1's wake was passed down the line.
    assert m.wake_local("m") == [WakeLocal(T1)]
    m.waited(T1, [N1], 0.1)
    decisions = m.answer(T1, Admission("queued", position=2, head="t3"), 0.1)
    assert only(decisions, WakeLocal) == [WakeLocal(T3)]
    # Under fifo the same answer passes the wake to the next local waiter.
    fifo = machine()
    for ticket in (T1, T2, T3):
        fifo.start(ticket, "m", [N1], 0.0)
        fifo.answer(ticket, queued(1), 0.0)
    fifo.wake_local("m")
    fifo.waited(T1, [N1], 0.1)
    assert only(fifo.answer(T1, queued(2), 0.1), WakeLocal) == [WakeLocal(T2)]
    # A head elsewhere: nothing to wake here.
    m.start(T4, "m", [N1], 0.0)
    assert only(m.answer(T4, Admission("queued", position=2, head="t9"), 0.0), WakeLocal) == []
    # A grant naming this instance as the next head's wakes exactly that one.
    m.start(T5, "m", [N1], 0.0)
    grant = Admission("granted", "n1", "c1", "lease-5", next_in_queue="A", head="t2")
    assert only(m.answer(T5, grant, 0.0), WakeLocal) == [WakeLocal(T2)]


def test_fair_the_head_polls_even_when_it_is_not_the_first_waiter_here() -> None:
    m = fair_machine()
    m.start(T1, "m", [N1], 0.0)
    m.answer(T1, Admission("queued", position=3, head="t2"), 0.0)
    m.start(T2, "m", [N1], 0.0)
    decisions = m.answer(T2, Admission("queued", position=0, head="t2"), 0.0)
    assert step_of(decisions) == WaitUntil(T2, POLL_S, "poll")
    m.start(T3, "m", [N1], 0.0)
    decisions = m.answer(T3, Admission("queued", position=1, head="t2"), 0.0)
    assert step_of(decisions) == WaitUntil(T3, QUEUE_TIMEOUT_S, "queue_deadline")
