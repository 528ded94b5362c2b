"""The types the coordination roles share (``roles.py`` is the interface, ``bundle.py`` the
object that hands the roles out), and ``CoordinationUnavailable``, which every role raises when
its backend cannot be reached."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

# Defined with the coordinator's other errors (HTTP 503, close code 1013); part of this interface.
from coordinator.errors import CoordinationUnavailable

__all__ = [
    "CoordinationUnavailable",
    "OpObserver",
    "PresenceEntry",
    "PresenceView",
    "RateDecision",
    "Subscription",
]

#: told (what, seconds, failed) after each store operation; the Redis backend calls it (the
#: metrics' hook, runtime/metrics.py), the in-process one has no latency worth reporting
OpObserver = Callable[[str, float, bool], None]


@dataclass(frozen=True, slots=True)
class RateDecision:
    """Outcome of one rate-limit check."""

    allowed: bool
    # Seconds until a request would be allowed again (0 when allowed).
    retry_after_s: float
    # Requests still allowed right now after this one (best effort, for headers).
    remaining: int


@dataclass(frozen=True, slots=True)
class PresenceEntry:
    """One member of a presence registry."""

    member: str
    #: backend time of the member's last beat, in seconds (Redis: server TIME)
    last_beat: float
    data: bytes


@dataclass(frozen=True, slots=True)
class PresenceView:
    """A presence registry as one atomic call saw it."""

    #: backend time at which the call ran, in seconds (Redis: server TIME)
    now: float
    #: every member not yet forgotten, sorted by member (stale ones included: the caller judges)
    entries: tuple[PresenceEntry, ...]
    #: ``presence_beat`` only: the member's own previous beat (None: absent or forgotten)
    previous_beat: float | None = None
    #: ``presence_beat`` only: windows ``(start, end)`` after ``previous_beat`` in which no
    #: presence call on this registry ran for longer than ``stall_after_s`` (backend stalled)
    stalls: tuple[tuple[float, float], ...] = ()


class Subscription(abc.ABC):
    """Messages of one channel, in publish order, from the moment of subscribing."""

    #: this listen continues one whose connection was lost, with nothing sent in between
    #: missing (only a bus with a ``resume_window_s`` can say so; see ``Bus``)
    resumed: bool = False

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[bytes]: ...
