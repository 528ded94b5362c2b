"""The load profile of seed 000 §4.1 and its scaled-down variants, and the pass thresholds.

Every number a run uses lives in one :class:`Profile`; ``--quick`` and ``--smoke`` pick a smaller
one, and single flags (``--duration``, ``--nodes`` …) override a field of whichever was picked.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

# Pass thresholds of seed 000 §4.1 (and two of ours, marked as such in the report).
HOP_P95_MS = 20.0
HOP_P99_MS = 50.0
CPU_LIMIT_PCT = 70.0
MEMORY_GROWTH_LIMIT_PCT = 10.0
KILL_FAIL_WITHIN_S = 3.0
# Ours: explicit errors allowed before the kill (share of requests), and how closely the load
# generator must have produced the profile for the figures to mean anything.
ERROR_RATE_LIMIT = 0.001
LOAD_ACHIEVED_MIN = 0.95
# CPU is judged on averages over this many one-second samples: "stays below" should not trip
# on a single garbage-collection second, but a sustained excursion must count.
CPU_WINDOW_SAMPLES = 5
# Ours, an aim and not a criterion (the exit code does not depend on it): the single-instance
# CPU peak at most this share of CPU_LIMIT_PCT, which leaves the seed's bound headroom for a
# slower or busier machine than the one of the run.
CPU_AIM_SHARE = 0.6

MODEL = "loadtest-echo"


@dataclass(frozen=True)
class Profile:
    name: str
    #: coordinator instances of each phase, in order (1 = the single-instance baseline)
    phases: tuple[int, ...] = (1, 2, 3)
    nodes: int = 200
    #: echo latency of every node, "MIN-MAX" milliseconds
    latency_ms: str = "50-500"
    max_parallel: int = 4
    #: concurrent closed-loop requests the ramp reaches ...
    concurrency: int = 200
    ramp_s: float = 30.0
    #: ... and holds for this long before the open-loop steady phase starts
    hold_s: float = 10.0
    #: open-loop requests per second of the steady phase
    rate: float = 100.0
    duration_s: float = 600.0
    #: concurrent streams (closed loop, each ~stream_s long), alongside from the ramp on
    streams: int = 50
    stream_words: int = 20
    stream_s: float = 5.0
    #: after the steady phase, one instance is killed -9 and the load goes on this long
    fault_s: float = 30.0
    #: API keys of the request clients (streams get one key each on top)
    clients: int = 100
    task_timeout_s: float = 30.0
    #: processes hosting the node agents (0: one per 100 nodes)
    node_procs: int = 0
    #: seconds of closed-loop GET /healthz before each phase's load, the machine's speed
    speed_s: float = 5.0

    @property
    def chunk_delay_ms(self) -> int:
        """Pause between streamed words so that one stream lasts about ``stream_s``."""
        return max(1, round(self.stream_s * 1000 / max(1, self.stream_words)))

    @property
    def client_timeout_s(self) -> float:
        """A request without any answer this long after it was sent counts as lost (the
        coordinator owes a 504 at task_timeout_s)."""
        return self.task_timeout_s + 10.0

    @property
    def helper_processes(self) -> int:
        return self.node_procs or max(1, math.ceil(self.nodes / 100))

    def kills(self, instances: int) -> bool:
        """Whether a phase of this many instances ends with the kill -9 of one of them."""
        return instances > 1 and self.fault_s > 0

    @property
    def any_kill(self) -> bool:
        return self.kills(max(self.phases))

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["phases"] = list(self.phases)
        data["chunk_delay_ms"] = self.chunk_delay_ms
        data["client_timeout_s"] = self.client_timeout_s
        data["helper_processes"] = self.helper_processes
        data["any_kill"] = self.any_kill
        return data


FULL = Profile(name="full")
# Half the seed's scale, a minute of steady load per phase: about five minutes in all.
QUICK = Profile(
    name="quick",
    nodes=100,
    concurrency=100,
    ramp_s=10.0,
    hold_s=5.0,
    rate=50.0,
    duration_s=45.0,
    streams=25,
    fault_s=15.0,
    clients=50,
    speed_s=3.0,
)
# Tiny: every mechanism once (ramp, steady, streams, the kill), in about a minute.
SMOKE = Profile(
    name="smoke",
    nodes=6,
    concurrency=12,
    ramp_s=1.5,
    hold_s=1.0,
    rate=8.0,
    duration_s=5.0,
    streams=4,
    stream_words=8,
    stream_s=1.2,
    fault_s=4.0,
    clients=4,
    task_timeout_s=10.0,
    speed_s=1.0,
)


def select(quick: bool, smoke: bool) -> Profile:
    if smoke:
        return SMOKE
    if quick:
        return QUICK
    return FULL


def override(profile: Profile, **changes: Any) -> Profile:
    """``profile`` with the non-None ``changes`` applied."""
    given = {k: v for k, v in changes.items() if v is not None}
    return replace(profile, **given) if given else profile


def check(profile: Profile) -> str | None:
    """Why ``profile`` cannot run (one line), or None."""
    if not profile.phases or any(n < 1 or n > 8 for n in profile.phases):
        return "--instances must list instance counts between 1 and 8, e.g. 1,2,3"
    if profile.nodes < max(profile.phases):
        return "--nodes must be at least the largest instance count"
    positive = {
        "--nodes": profile.nodes,
        "--rate": profile.rate,
        "--duration": profile.duration_s,
        "--concurrency": profile.concurrency,
        "--max-parallel": profile.max_parallel,
        "--clients": profile.clients,
    }
    for flag, value in positive.items():
        if not value > 0:
            return f"{flag} must be positive"
    if profile.streams < 0 or profile.fault_s < 0 or profile.ramp_s < 0 or profile.hold_s < 0:
        return "--streams, --fault-s, --ramp-s and --hold-s must not be negative"
    if profile.rate * (profile.duration_s + profile.fault_s) > 2_000_000:
        return "at most 2000000 open-loop requests per phase (--rate x --duration)"
    if profile.nodes > 2000:
        return "at most 2000 simulated nodes"
    return None
