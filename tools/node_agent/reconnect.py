"""Where and when a node agent dials next: the coordinators it was given, in turn, and the
wait before each attempt. Pure: the agent asks ``after`` once a connection (or an attempt)
has ended, with what it knows of how it ended, and sleeps for the answer.

* Any loss moves on to the next coordinator (``--coordinator`` given several times; with one,
  a load balancer's address, it is the same one again).
* Told to move (close 4004: its instance drains), it dials the next one at once. Moves in a
  row beyond one round of the list (every instance draining) wait like failures, so a
  cluster that is all going away is not dialled in a tight loop.
* Anything else waits with full jitter: uniform in [0, min(max_s, initial_s * 2**n)], n the
  failures since the last welcome (``config.backoff_delay``), capped by ``--reconnect-max-s``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from protocol import CloseCode
from tools.node_agent.config import backoff_delay

__all__ = ["Reconnects"]


class Reconnects:
    def __init__(
        self, urls: Sequence[str], rng: random.Random, *, initial_s: float, max_s: float
    ) -> None:
        if not urls:
            raise ValueError("a node agent needs at least one coordinator URL")
        self.urls = tuple(urls)
        self._rng = rng
        self._initial_s = initial_s
        self._max_s = max_s
        self.index = 0
        #: failed attempts since the last welcome (the backoff's exponent)
        self.failures = 0
        self._moves = 0

    @property
    def url(self) -> str:
        """The coordinator to dial next."""
        return self.urls[self.index]

    def after(self, *, welcomed: bool, close_code: int | None) -> float:
        """The attempt on ``url`` ended (``welcomed``: it was served; ``close_code``: how the
        coordinator closed it, None when it did not); the wait before the next attempt,
        which goes to the new ``url``."""
        if welcomed:
            self.failures = 0
            self._moves = 0
        self.index = (self.index + 1) % len(self.urls)
        if close_code == CloseCode.MOVE:
            self._moves += 1
            if self._moves <= len(self.urls):
                return 0.0
        else:
            self._moves = 0
        delay = backoff_delay(
            self.failures, self._rng, initial_s=self._initial_s, max_s=self._max_s
        )
        self.failures += 1
        return delay
