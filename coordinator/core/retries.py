"""How long to wait before making a store call again, and when to give up: pure, for the
admission machine (``core/admission.py``) and the shells that call the store (the release of a
lease, the rate limit). No clock is read here; callers pass ``now``."""

from __future__ import annotations

import zlib

__all__ = [
    "RELEASE_FIRST_RETRY_S",
    "RELEASE_GIVE_UP_S",
    "RELEASE_MAX_RETRY_S",
    "STORE_RETRY_FIRST_S",
    "STORE_RETRY_MAX_S",
    "release_retry_in",
    "store_retry_in",
]

#: how long a failed release is retried (a lease heals by its TTL anyway; an active-set
#: entry of a live instance would not)
RELEASE_GIVE_UP_S = 30.0
RELEASE_FIRST_RETRY_S = 0.1
RELEASE_MAX_RETRY_S = 2.0
#: a store call that timed out is made again after this long, doubling up to
#: STORE_RETRY_MAX_S (each delay drawn from the upper half of its step: jitter)
STORE_RETRY_FIRST_S = 0.05
STORE_RETRY_MAX_S = 0.5


def release_retry_in(failures: int, started_at: float, now: float) -> float | None:
    """After the ``failures``-th failed attempt to release (1 for the first), how long to wait
    before the next one; None: give up (the lease heals by its TTL)."""
    delay = min(RELEASE_FIRST_RETRY_S * 2 ** (failures - 1), RELEASE_MAX_RETRY_S)
    return None if now + delay >= started_at + RELEASE_GIVE_UP_S else delay


def store_retry_in(failures: int, now: float, give_up_at: float, salt: str) -> float | None:
    """After the ``failures``-th store call in a row that timed out (1 for the first), how
    long to wait before making it again; None: give up (``now`` is at or past ``give_up_at``).
    The delay doubles from STORE_RETRY_FIRST_S to STORE_RETRY_MAX_S, drawn from the upper half
    of each step by a hash of ``salt`` and ``failures`` (pure, yet callers of one outage do
    not retry in step)."""
    if now >= give_up_at:
        return None
    step = min(STORE_RETRY_FIRST_S * 2.0 ** (failures - 1), STORE_RETRY_MAX_S)
    spread = zlib.crc32(f"{salt}:{failures}".encode()) / 2**32
    return step * (0.5 + 0.5 * spread)
