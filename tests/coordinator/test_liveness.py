"""The liveness rule as event sequences: registry reads (server time, each peer's last beat, the
read's round trip) fed to the pure judge. A paused Redis or a stalled judge declares nobody
dead; a frozen owner on a healthy Redis is dead within the bound, a killed one at once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.core.liveness import (
    FAILOVER_PROMISE_S,
    STREAMS_PRESENCE_TTL_S,
    FreezeWatch,
    LivenessJudge,
    LivenessTiming,
    failover_bound_s,
    presence_lapsed,
)
from coordinator.settings import Settings

TIMING = LivenessTiming(
    beat_s=0.5, alive_ttl_s=2.0, sweep_s=0.5, stall_slack_s=0.2, responsive_rtt_s=0.1
)
RTT = 0.002


class EagerJudge(LivenessJudge):
    """A deliberately too-eager variant: counts plain server-time age, ignoring stalls."""

    def stale(self, instance_id: str) -> bool:
        if self._last_read is None:
            return False
        beat = self._last_beats.get(instance_id, float("-inf"))
        return self._last_read - beat > self.timing.alive_ttl_s


def run(judge: LivenessJudge, events: list[tuple[float, dict[str, float], float]]) -> list[float]:
    """Feed reads (now, beats, round trip); return the server times at which "B" was dead."""
    deaths = []
    for now, beats, rtt in events:
        if "B" in judge.judge(now=now, round_trip_s=rtt, beats=beats, listening={"B": True}):
            deaths.append(now)
    return deaths


def healthy(start: float, end: float, *, b_beats_until: float) -> list[tuple[float, dict, float]]:
    """Reads every sweep, B beating every beat (its latest beat at or before each read)."""
    events = []
    t = start
    while t <= end + 1e-9:
        last = min(t, b_beats_until)
        beat = last - (last % TIMING.beat_s)
        events.append((round(t, 3), {"B": round(beat, 3)}, RTT))
        t += TIMING.sweep_s
    return events


@pytest.mark.parametrize("judge_class", [LivenessJudge, EagerJudge])
def test_healthy_peer_is_never_dead(judge_class: type[LivenessJudge]) -> None:
    assert run(judge_class(TIMING), healthy(100.0, 120.0, b_beats_until=1e9)) == []


def redis_paused(pause_s: float) -> list[tuple[float, dict, float]]:
    # Reads until 110, Redis frozen for pause_s (no read or beat executes), then the first read
    # after the resume still sees B's pre-pause beat; B's next beat lands a beat later.
    before = healthy(100.0, 110.0, b_beats_until=1e9)
    resumed = 110.0 + pause_s
    after = [(resumed + 0.01, {"B": 110.0}, RTT), (resumed + 0.3, {"B": resumed + 0.2}, RTT)]
    after += healthy(resumed + 0.8, resumed + 6, b_beats_until=1e9)
    return before + after


@pytest.mark.parametrize("pause_s", [0.8, 2.5, 3.0, 10.0])
def test_paused_redis_declares_nobody_dead(pause_s: float) -> None:
    assert run(LivenessJudge(TIMING), redis_paused(pause_s)) == []


def test_too_eager_judge_fails_the_pause_case() -> None:
    # The scenario can catch a judge that counts a paused Redis as a dead peer.
    assert run(EagerJudge(TIMING), redis_paused(2.5)) != []


def test_slow_reads_count_as_a_stall() -> None:
    # Redis answers, but each read takes 0.9 s: B's beats could not land either.
    events = healthy(100.0, 105.0, b_beats_until=1e9)
    events += [(105.0 + 0.9 * i, {"B": 105.0}, 0.9) for i in range(1, 6)]
    events += healthy(110.0, 115.0, b_beats_until=1e9)
    assert run(LivenessJudge(TIMING), events) == []
    assert run(EagerJudge(TIMING), events) != []


def test_stalled_judge_declares_nobody_dead() -> None:
    # The judge's own process was descheduled for 4 s: its next read comes late, B is fine.
    events = healthy(100.0, 110.0, b_beats_until=1e9)
    events += [(114.0, {"B": 110.0}, RTT)]  # a read queued before the stall, answered late
    events += healthy(114.5, 120.0, b_beats_until=1e9)
    judge = LivenessJudge(TIMING)
    assert run(judge, events) == []
    assert judge.stalls_seen == 1


def test_frozen_owner_is_dead_within_the_bound() -> None:
    frozen_at = 110.0
    deaths = run(LivenessJudge(TIMING), healthy(100.0, 120.0, b_beats_until=frozen_at))
    assert deaths, "a frozen owner was never declared dead"
    assert frozen_at + TIMING.alive_ttl_s < deaths[0] <= frozen_at + TIMING.failover_bound_s


def test_frozen_owner_after_a_pause_still_dies() -> None:
    # A pause grants a fresh TTL, not immunity: an owner that never beats again dies a TTL
    # (plus a sweep) after the resume.
    events = redis_paused(2.5)[:22] + [
        (t, {"B": 110.0}, RTT) for t in (113.0 + 0.5 * i for i in range(12))
    ]
    deaths = run(LivenessJudge(TIMING), sorted(events))
    assert deaths and deaths[0] <= 112.51 + TIMING.failover_bound_s


def test_killed_owner_is_dead_at_once_even_right_after_a_stall() -> None:
    judge = LivenessJudge(TIMING)
    judge.observe(now=100.0, round_trip_s=RTT, beats={"B": 100.0})
    assert judge.judge(now=104.0, round_trip_s=RTT, beats={"B": 100.0}, listening={"B": False})


def test_missing_peer_keeps_its_remembered_beat() -> None:
    judge = LivenessJudge(TIMING)
    judge.observe(now=100.0, round_trip_s=RTT, beats={"B": 100.0})
    for t in (100.5, 101.0, 101.5, 102.0):
        assert not judge.judge(now=t, round_trip_s=RTT, beats={}, listening={"B": True})
    assert judge.judge(now=102.5, round_trip_s=RTT, beats={}, listening={"B": True}) == {"B"}


# -- the bound ----------------------------------------------------------------------------------

BASE = {"alive_ttl_s": 2.0, "sweep_s": 0.5, "stall_slack_s": 0.2, "responsive_rtt_s": 0.1}


def test_bound_of_the_defaults_is_inside_3_s() -> None:
    assert failover_bound_s(**BASE) == pytest.approx(2.9)
    assert Settings().liveness_timing().failover_bound_s == pytest.approx(2.9)
    assert Settings().liveness_timing().problems() == []


@pytest.mark.parametrize(
    ("name", "weight"),
    [("alive_ttl_s", 1), ("sweep_s", 1), ("stall_slack_s", 1), ("responsive_rtt_s", 2)],
)
def test_each_input_moves_the_bound(name: str, weight: int) -> None:
    moved = failover_bound_s(**{**BASE, name: BASE[name] + 0.25})
    assert moved == pytest.approx(failover_bound_s(**BASE) + weight * 0.25)


def test_the_streams_bus_presence_ttl_is_the_killed_terms_first_and_stays_inside_3_s() -> None:
    """A killed owner's inbox looks listened to for the streams presence TTL (1 s) more; with
    the defaults the frozen term still dominates, and a TTL past alive_ttl_s would take over
    (and be named in the refusal's sum)."""
    assert STREAMS_PRESENCE_TTL_S == 1.0
    killed = STREAMS_PRESENCE_TTL_S + BASE["sweep_s"] + BASE["stall_slack_s"] + 2 * 0.1
    assert killed == pytest.approx(1.9)
    assert failover_bound_s(**BASE, presence_ttl_s=STREAMS_PRESENCE_TTL_S) == pytest.approx(2.9)
    streams = Settings(bus="streams").liveness_timing()
    assert streams.presence_ttl_s == STREAMS_PRESENCE_TTL_S
    assert streams.failover_bound_s == pytest.approx(2.9)
    assert streams.failover_bound_s <= FAILOVER_PROMISE_S
    assert Settings().liveness_timing().presence_ttl_s == 0.0  # pub/sub: at once
    slow = replace(streams, presence_ttl_s=2.5)
    assert slow.failover_bound_s == pytest.approx(2.5 + 0.5 + 0.2 + 0.2)
    assert "bus presence TTL 2.5" in slow.bound_sum()


def test_a_ttl_too_short_for_the_beat_is_a_problem() -> None:
    assert replace(TIMING, beat_s=1.0).problems()
    assert replace(TIMING, stall_slack_s=0.05).problems()


# -- our own presence ---------------------------------------------------------------------------


def test_own_presence_lapses_only_outside_server_stalls() -> None:
    ttl = TIMING.alive_ttl_s
    assert presence_lapsed(previous_beat=None, now=5.0, stalls=[], alive_ttl_s=ttl)
    assert not presence_lapsed(previous_beat=100.0, now=100.5, stalls=[], alive_ttl_s=ttl)
    # Our process froze for 4 s while Redis served the others: peers may have judged us.
    assert presence_lapsed(previous_beat=100.0, now=104.0, stalls=[], alive_ttl_s=ttl)
    # Redis itself was paused 100.2 .. 103.2: nobody could have counted that.
    assert not presence_lapsed(
        previous_beat=100.0, now=103.5, stalls=[(100.2, 103.2)], alive_ttl_s=ttl
    )
    # ... but a long silence before the pause still counts.
    assert presence_lapsed(previous_beat=100.0, now=106.5, stalls=[(102.5, 106.0)], alive_ttl_s=ttl)


# -- our own process frozen --------------------------------------------------------------------


def test_a_late_tick_holds_off_the_silence_verdict_for_one_heartbeat() -> None:
    # sweep 0.5 s, heartbeat 1 s: a tick more than 2 s after the last one means a freeze.
    watch = FreezeWatch(sweep_s=0.5, heartbeat_s=1.0, silence_deadline_s=3.0, now=100.0)
    assert watch.tick(100.5) == 3.0
    assert watch.tick(102.5) == 3.0  # 2 s late: slow, not frozen
    # Frozen 102.5 .. 110: the heartbeats of those 7.5 s wait in the sockets, unread.
    assert watch.tick(110.0) is None
    assert watch.tick(110.5) is None
    assert watch.tick(111.0) == 3.0  # a heartbeat interval later they have been read
    # A second freeze while the first is still held off starts the wait again.
    watch = FreezeWatch(sweep_s=0.5, heartbeat_s=1.0, silence_deadline_s=3.0, now=0.0)
    assert watch.tick(5.0) is None
    assert watch.tick(9.0) is None and watch.tick(9.5) is None
    assert watch.tick(10.0) == 3.0


def test_the_freeze_threshold_follows_the_longer_of_sweep_and_heartbeat() -> None:
    watch = FreezeWatch(sweep_s=3.0, heartbeat_s=1.0, silence_deadline_s=3.0, now=0.0)
    assert watch.tick(6.0) == 3.0  # twice the sweep: on the edge, not frozen
    assert watch.tick(12.5) is None
