"""What a ``StreamsBus`` has seen of its own presence calls, and so whether it may believe that
a missing presence key is a gone listener (bus/streams.py, "Stall evidence"). Pure: the bus
passes the time of each event (its trio clock).

The rule of ``core/liveness.py``: silence counts over responsive time only. With presence TTL
T and refresh period r (1 s and 0.25 s by default), and the stall allowance s = (T - 2r) / 2
(0.25 s):

* A live listener refreshes r after its previous refresh answered, so its key survives as long
  as its lateness (how far behind its timer its loop ran the refresh) plus the round trip stays
  under T - r = 0.75 s.
* A stall (Redis paused, or the box descheduling everyone) that begins at P and ends D later:
  the listener's last refresh before P ran at most r + its lateness earlier, so its key lapses
  in the stall only if D > T - r - lateness. Ours: its last refresh answered by P, so by the
  end no refresh of ours has answered for D; that is late (``refresh_late``, and the gap rule
  of ``refresh_done`` once it answers) when D > r + s = 0.5 s, whatever the phase of our loop.
* So a live listener's key lapses unseen only if T - r - lateness < D <= r + s, i.e. only if
  the listener was itself more than T - 2r - s = s late: a stall of its own, on top of the
  shared one, which no sender can tell from a kill.

A call of ours (refresh, read, send) slower than s is a stall too. Absence is believed again
once our refreshes have been prompt for a whole T; a stall's only cost is that latency.
"""

from __future__ import annotations

import math

__all__ = ["StallWatch"]


class StallWatch:
    """The presence evidence of one bus (one process): its refreshes, its listens lost to a
    read that timed out, and the time its presence calls took."""

    def __init__(self, *, presence_ttl_s: float, refresh_s: float) -> None:
        self.presence_ttl_s = presence_ttl_s
        self.refresh_s = refresh_s
        #: a call slower than this, or a refresh this much later than due, is a stall
        self.stall_s = (presence_ttl_s - 2 * refresh_s) / 2
        #: since when Redis was seen responsive without a stall (None: trouble right now;
        #: -inf: no stall seen yet, so what is read is believed)
        self.responsive_since: float | None = -math.inf
        self.last_refresh_at: float | None = None
        #: when the refresh now outstanding was sent (None: none is)
        self.refresh_sent_at: float | None = None
        #: a listen keeps its presence fresh (its refreshes are due every ``refresh_s``)
        self.keeping_present = False

    def believed(self, now: float) -> bool:
        """Whether a missing presence key, read just now, means its listener is gone: no
        stall seen, or Redis responsive for a whole TTL since the last one, and no refresh of
        ours late right now (a stall under way shows in a refresh's timing only once it ends)."""
        if self.refresh_late(now):
            return False
        since = self.responsive_since
        return since is not None and now - since >= self.presence_ttl_s

    def refresh_late(self, now: float) -> bool:
        """Our refresh is late right now: one is outstanding for longer than the allowance,
        or (while a listen keeps its presence) none has answered for ``refresh_s`` + the
        allowance, whether the next is still to be sent or already on its way."""
        sent, last = self.refresh_sent_at, self.last_refresh_at
        if sent is not None and now - sent > self.stall_s:
            return True
        due_by = None if last is None else last + self.refresh_s + self.stall_s
        return self.keeping_present and due_by is not None and now > due_by

    def answered(self, sent: float, now: float) -> bool:
        """A presence call sent at ``sent`` answered at ``now``: whether promptly. A slow answer
        is a stall seen, as a slow refresh is."""
        if now - sent <= self.stall_s:
            return True
        if self.responsive_since is not None:
            self.responsive_since = now
        return False

    def refresh_sent(self, now: float) -> None:
        self.refresh_sent_at = now

    def refresh_done(self, now: float) -> None:
        """The refresh sent at ``refresh_sent_at`` succeeded: prompt if it took at most the
        allowance and came at most ``refresh_s`` + the allowance after the previous one."""
        sent, previous = self.refresh_sent_at, self.last_refresh_at
        self.refresh_sent_at, self.last_refresh_at = None, now
        prompt = (
            sent is not None
            and now - sent <= self.stall_s
            and (previous is None or now - previous <= self.refresh_s + self.stall_s)
        )
        if not prompt or self.responsive_since is None:
            self.responsive_since = now

    def refresh_failed(self) -> None:
        """Redis did not answer the refresh: a stall right now, counted again from the next
        refresh that succeeds."""
        self.refresh_sent_at = None
        self.responsive_since = self.last_refresh_at = None

    def refresh_cancelled(self, now: float) -> None:
        """The refresh was cancelled (its listen ended): a stall only if it had waited longer
        than the allowance."""
        sent, self.refresh_sent_at = self.refresh_sent_at, None
        if sent is not None and now - sent > self.stall_s:
            self.responsive_since = self.last_refresh_at = None

    def read_timed_out(self) -> None:
        """A listen was lost to a read that timed out: Redis stalled."""
        self.responsive_since = None
