"""How long to wait before making a store call again, and when to give up: pure, for the
admission machine (``machine.py``) and the shells that call the store (the release of a
lease, the rate limit). No clock is read here; callers pass ``now``."""

from __future__ import annotations

import zlib

__all__ = [
    "RELEASE_FIRST_RETRY_S",
    "RELEASE_GIVE_UP_S",
    "RELEASE_MAX_RETRY_S",
    "STORE_RETRY_FIRST_S",
    "STORE_RETRY_MAX_S",
    "TimeoutRetries",
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


class TimeoutRetries:
    """One call that the store keeps not answering in time (the rate limit of a request, the
    bus send of an assign): after each timeout, how long to wait before making it again, or
    None to give up. It gives up once the store has answered nothing for ``store_outage_s``
    (counted from this call's first unanswered try at the earliest, and from the store's last
    answer to anyone when that is later: a store that answers others is slow, not gone) or at
    ``deadline``, whichever comes first. Pure: callers pass the times."""

    def __init__(self, *, store_outage_s: float, deadline: float, salt: str) -> None:
        self._store_outage_s = store_outage_s
        self._deadline = deadline
        self._salt = salt
        self._silent_since: float | None = None
        self.timeouts = 0
        #: the store's silence when the last retry was refused (for the message)
        self.silent_s = 0.0

    def after_timeout(
        self, asked_at: float, now: float, silent_for_s: float | None
    ) -> float | None:
        """The call made at ``asked_at`` timed out; ``silent_for_s``: how long the store had
        answered nobody (None: not known)."""
        self.timeouts += 1
        if self._silent_since is None:
            self._silent_since = asked_at
        since = self._silent_since
        if silent_for_s is not None:
            since = max(since, now - silent_for_s)
        self.silent_s = now - since
        give_up_at = min(since + self._store_outage_s, self._deadline)
        return store_retry_in(self.timeouts, now, give_up_at, self._salt)
