"""Who is dead, decided from what was read: pure, no trio, no Redis, no clock reads.

Every instance beats into a shared registry every ``beat_s``; the backend stamps each beat
with its own clock (Redis: server ``TIME``), so every judge compares beats against one clock.
A requester's judge reads the registry every ``sweep_s`` and declares a peer dead when

* its inbox has no listener (a killed process's socket closes at once), or
* its last beat is older than ``alive_ttl_s`` -- **counted only over time in which Redis and the
  judge were demonstrably responsive.**

Responsive means: the judge's consecutive reads executed on the server no more than
``stall_gap_s = sweep_s + stall_slack_s`` apart, and each read's round trip took no more than
``responsive_rtt_s``. When a read breaks either rule, Redis or the judge itself was stalled (a
SIGSTOPped ``redis-server``, a network hiccup, the judge's process descheduled): nobody could
beat, or the judge could not see it, so every peer gets a fresh TTL counted from that read.
A paused Redis is therefore never a dead instance, while a frozen instance on a healthy Redis
still is, within ``failover_bound_s``.

The instance's own side of the same rule is ``presence_lapsed``: our beats stopped for longer
than the TTL while Redis was serving others (no server-recorded stall covers the gap), so peers
may have declared us dead. And a freeze of our own process must not make our nodes look silent
(``FreezeWatch``): their heartbeats waited in the sockets meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "FAILOVER_PROMISE_S",
    "STREAMS_PRESENCE_TTL_S",
    "STREAMS_REFRESH_S",
    "FreezeWatch",
    "LivenessJudge",
    "LivenessTiming",
    "failover_bound_s",
    "presence_lapsed",
    "store_outage_bound_s",
    "store_outage_problem",
]


#: The product's promise: a dead owner's tasks end with 502 on a peer within this many seconds.
FAILOVER_PROMISE_S = 3.0

#: The streams bus's inbox presence (``coordination/bus/streams.py``, which derives its
#: tolerances from these): the key's TTL and how often a listener refreshes it. A killed
#: listener refreshed last before it died, so its key is gone, and ``send`` to it answers 0, at
#: most the TTL after the kill; a live one keeps it while no refresh comes more than
#: TTL - refresh = 0.75 s late (``coordination/bus/stall_watch.py`` has the rest of the
#: arithmetic: which stalls a sender sees, and what a stall costs).
STREAMS_PRESENCE_TTL_S = 1.0
STREAMS_REFRESH_S = 0.25


def failover_bound_s(
    *,
    alive_ttl_s: float,
    sweep_s: float,
    stall_slack_s: float,
    responsive_rtt_s: float,
    presence_ttl_s: float = 0.0,
) -> float:
    """Worst-case seconds from an owner's death to its tasks' 502 on a peer, Redis responsive.

    Frozen owner (SIGSTOP), died at T. Its last beat was sent before T and, Redis being
    responsive, executed by ``L <= T + rtt``. The judge's reads execute at server times
    ``r_1 < r_2 < ...`` no more than ``stall_gap = sweep_s + stall_slack_s`` apart (a wider gap
    is a stall and restarts the TTL, see the module docstring). The first read with
    ``r > L + alive_ttl_s`` therefore executes by ``L + alive_ttl_s + stall_gap`` and its answer
    arrives within another ``rtt``; the requester fails the tasks at once::

        frozen = rtt + alive_ttl_s + sweep_s + stall_slack_s + rtt

    Killed owner (kill -9): its inbox has no listener from ``T + presence_ttl_s`` on (pub/sub:
    0, its socket closes at once; streams: its presence key, last refreshed before T, is gone
    a TTL later). The next sweep sends its listener check within ``stall_gap`` of that and the
    registry read after it; both answer within ``rtt``::

        killed = presence_ttl_s + sweep_s + stall_slack_s + rtt + rtt

    The bound is the larger: ``frozen`` with the defaults on either bus (killed: 0.9 s on
    pub/sub, 1.9 s on streams, whose TTL is 1 s). Two settings are deliberately absent:
    ``beat_s`` (an owner dying just after a beat is the worst case whatever the interval; the
    beat interval only has to fit inside the TTL, see ``LivenessTiming.problems``) and the Redis
    operation timeout (a read slower than ``responsive_rtt_s`` counts as a stall and ends no
    task, so the timeout only decides how long the judge waits before saying it cannot tell).
    """
    stall_gap = sweep_s + stall_slack_s
    frozen = responsive_rtt_s + alive_ttl_s + stall_gap + responsive_rtt_s
    killed = presence_ttl_s + stall_gap + 2 * responsive_rtt_s
    return max(frozen, killed)


def store_outage_bound_s(failover_bound_s: float) -> float:
    """How long the coordination store may go without answering before a request waiting on
    it (its rate limit, its admission) fails closed with ``503 coordination_unavailable``.

    The failover bound itself: a request waits for a silent store as long as a peer waits for
    a silent owner before failing its tasks, one rule for "silent means gone" across the
    cluster, and like it at most the promised 3 s (``gemmanet serve`` checks both). A store
    stalled for less (a SIGSTOP, a fork, a busy box) costs latency only, as a stall costs
    liveness nothing. The operation timeout is deliberately absent: it only decides how soon a
    call is made again.

    Counted from the sending of the first call that got no answer; the request fails at the
    first timeout at or past the bound, so its client hears the 503 at most one operation
    timeout (1 s) and one backoff (0.5 s) later: 4.4 s with the defaults. A request's own
    budget (its queue timeout) ends the wait sooner if it is shorter."""
    return failover_bound_s


def store_outage_problem(store_outage_s: float, budget_s: float) -> str | None:
    """What is wrong when a request's own budget (its queue timeout, capped by the task
    timeout) is shorter than the store outage bound: such a request rides out a silent store
    only for its budget. None when the bound fits (``gemmanet serve`` says it at start)."""
    if budget_s + 1e-9 >= store_outage_s:
        return None
    return (
        f"GEMMANET_QUEUE_TIMEOUT_S (or GEMMANET_TASK_TIMEOUT_S) {budget_s:g} s is shorter than "
        f"the store outage bound {store_outage_s:.2f} s (the failover bound): a request rides "
        f"out a silent coordination store for {budget_s:g} s only, then gets 503 "
        "coordination_unavailable"
    )


@dataclass(frozen=True, slots=True)
class LivenessTiming:
    """The settings liveness depends on, in one place."""

    beat_s: float
    alive_ttl_s: float
    sweep_s: float
    stall_slack_s: float
    responsive_rtt_s: float
    #: how long a killed instance's inbox still looks listened to (streams: the presence TTL)
    presence_ttl_s: float = 0.0

    @property
    def stall_gap_s(self) -> float:
        """Reads further apart than this (server time) mean Redis or the judge stalled."""
        return self.sweep_s + self.stall_slack_s

    @property
    def failover_bound_s(self) -> float:
        return failover_bound_s(
            alive_ttl_s=self.alive_ttl_s,
            sweep_s=self.sweep_s,
            stall_slack_s=self.stall_slack_s,
            responsive_rtt_s=self.responsive_rtt_s,
            presence_ttl_s=self.presence_ttl_s,
        )

    @property
    def store_outage_s(self) -> float:
        return store_outage_bound_s(self.failover_bound_s)

    def bound_sum(self) -> str:
        """The bound's arithmetic, term by term, for a one-line refusal."""
        t = self
        if t.presence_ttl_s > t.alive_ttl_s:  # the killed term is the larger
            return (
                f"bus presence TTL {t.presence_ttl_s:g} + sweep_s {t.sweep_s:g} + "
                f"stall_slack_s {t.stall_slack_s:g} + 2 x responsive_rtt_s "
                f"{t.responsive_rtt_s:g} = {t.failover_bound_s:.2f} s"
            )
        return (
            f"responsive_rtt_s {t.responsive_rtt_s:g} + alive_ttl_s {t.alive_ttl_s:g} + "
            f"sweep_s {t.sweep_s:g} + stall_slack_s {t.stall_slack_s:g} + "
            f"responsive_rtt_s {t.responsive_rtt_s:g} = {t.failover_bound_s:.2f} s"
        )

    def problems(self) -> list[str]:
        """Why these settings cannot work (empty when they can)."""
        found = []
        if min(self.beat_s, self.alive_ttl_s, self.sweep_s, self.responsive_rtt_s) <= 0:
            found.append("every interval must be positive")
        # A live peer beats every beat_s, each beat taking up to a round trip: its age must stay
        # well inside the TTL, or a live peer looks dead.
        if self.alive_ttl_s < 2 * (self.beat_s + self.responsive_rtt_s):
            found.append(
                f"alive_ttl_s={self.alive_ttl_s:g} must be at least twice beat_s + "
                f"responsive_rtt_s ({self.beat_s:g} + {self.responsive_rtt_s:g})"
            )
        if self.stall_slack_s < self.responsive_rtt_s:
            found.append("stall_slack_s must cover at least one responsive round trip")
        return found


class LivenessJudge:
    """Decides which peers are dead from successive registry reads (see the module docstring).

    Feed it every successful read, in order, through ``judge``. It remembers the server time of
    the previous read (to see stalls), the start of the current responsive stretch, and the last
    beat seen of each peer (a peer missing from a read keeps its remembered beat)."""

    def __init__(self, timing: LivenessTiming) -> None:
        self.timing = timing
        self._last_read: float | None = None
        self._responsive_since: float | None = None
        self._last_beats: dict[str, float] = {}
        #: reads that found Redis or this judge stalled (for diagnostics and tests)
        self.stalls_seen = 0

    def observe(self, *, now: float, round_trip_s: float, beats: Mapping[str, float]) -> None:
        """One successful registry read: server time ``now``, each member's last beat."""
        stalled = (
            self._last_read is None
            or now - self._last_read > self.timing.stall_gap_s
            or round_trip_s > self.timing.responsive_rtt_s
        )
        if stalled:
            if self._last_read is not None:
                self.stalls_seen += 1
            self._responsive_since = now
        self._last_read = now
        for member, beat in beats.items():
            if beat > self._last_beats.get(member, float("-inf")):
                self._last_beats[member] = beat

    def stale(self, instance_id: str) -> bool:
        """Whether ``instance_id``'s last beat is older than the TTL, counting only responsive
        time, as of the last observed read."""
        if self._last_read is None or self._responsive_since is None:
            return False
        beat = self._last_beats.get(instance_id, float("-inf"))
        return self._last_read - max(beat, self._responsive_since) > self.timing.alive_ttl_s

    def dead(self, candidates: Iterable[str], listening: Mapping[str, bool]) -> set[str]:
        """Candidates with no inbox listener, or stale. Candidates missing from ``listening``
        are judged on staleness alone."""
        return {c for c in candidates if listening.get(c) is False or self.stale(c)}

    def judge(
        self,
        *,
        now: float,
        round_trip_s: float,
        beats: Mapping[str, float],
        listening: Mapping[str, bool],
    ) -> set[str]:
        """``observe`` then ``dead`` among the peers in ``listening``."""
        self.observe(now=now, round_trip_s=round_trip_s, beats=beats)
        return self.dead(listening, listening)

    def forget(self, instance_id: str) -> None:
        self._last_beats.pop(instance_id, None)


def presence_lapsed(
    *,
    previous_beat: float | None,
    now: float,
    stalls: Sequence[tuple[float, float]],
    alive_ttl_s: float,
) -> bool:
    """Whether peers may have declared us dead between our previous beat and this one.

    ``stalls`` are the server-recorded windows ``(start, end)`` in which no presence call at all
    ran for longer than the stall gap (Redis paused, or every instance stalled): a judge cannot
    have counted those. We lapsed when some stretch of our silence *outside* those windows was
    longer than the TTL. No previous beat (first start, or forgotten) counts as lapsed."""
    if previous_beat is None:
        return True
    cursor = previous_beat
    for start, end in sorted(stalls):
        if end <= cursor:
            continue
        if start - cursor > alive_ttl_s:
            return True
        cursor = max(cursor, end)
    return now - cursor > alive_ttl_s


class FreezeWatch:
    """When the nodes' silence may be judged, from how late the supervisor's ticks come.

    A tick more than twice the longer of the sweep and the heartbeat interval after the one
    before means this process was frozen (SIGSTOP, swapping, a debugger): the nodes' heartbeats
    are still waiting in the sockets, unread, so every node would look silent. Silence is judged
    again one heartbeat interval after such a tick, once they have been read."""

    def __init__(
        self, *, sweep_s: float, heartbeat_s: float, silence_deadline_s: float, now: float
    ) -> None:
        self._late_after_s = 2 * max(sweep_s, heartbeat_s)
        self._heartbeat_s = heartbeat_s
        self._silence_deadline_s = silence_deadline_s
        self._last_tick = now
        self._judge_from = now

    def tick(self, now: float) -> float | None:
        """A tick at ``now``: the silence deadline to judge the nodes by (None: not at this one)."""
        if now - self._last_tick > self._late_after_s:
            self._judge_from = now + self._heartbeat_s
        self._last_tick = now
        return self._silence_deadline_s if now >= self._judge_from else None
