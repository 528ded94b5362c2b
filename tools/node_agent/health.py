"""Whether the node's model backend answers, as the agent tells its coordinator.

The backend is checked (``Backend.check``: Ollama ``GET /api/tags``, an OpenAI-compatible
server ``GET /v1/models``, the echo backend always answers) before the first hello, then every
``check_s`` seconds while it answers, at once (but at most once a second) after a task failed
on it, and while it does not, again and again with exponential backoff and full jitter, at
most ``check_s`` apart. Each check is bounded by ``timeout_s``. A task that could not even
connect to the backend counts as a failed check.

``problem`` is None while the backend answers, else one line saying which URL and what failed.
The agent sends it in its hello and in every heartbeat (``backend_down``): the coordinator
places nothing on the node meanwhile, and the agent refuses what still arrives
(``backend_unavailable``, so the coordinator places it elsewhere). Each change of the state is
logged once, as one line, and wakes ``changed``, whose waiter sends a heartbeat at once.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Final

import trio

from tools.node_agent.backends import Backend, BackendError, BackendUnreachable
from tools.node_agent.config import backoff_delay
from tools.node_agent.task_run import short

__all__ = ["BackendHealth"]

log = logging.getLogger("gemmanet.node")

#: a task's failure asks for a check at once, but never sooner than this after the last one
MIN_GAP_S: Final = 1.0
#: the first retry of a backend that does not answer comes within this (then doubling)
FIRST_RETRY_S: Final = 0.5


class BackendHealth:
    def __init__(
        self,
        backend: Backend,
        models: Sequence[str],
        *,
        check_s: float,
        timeout_s: float,
        rng: random.Random,
    ) -> None:
        self._backend = backend
        self._models = tuple(models)
        self.check_s = check_s
        self.timeout_s = timeout_s
        self._rng = rng
        #: why the backend cannot serve now; None while it answers
        self.problem: str | None = None
        #: set (and replaced) at every change of ``problem`` between None and not None
        self.changed = trio.Event()
        self._asked = trio.Event()
        self._last_check = -float("inf")
        #: checks made (tests)
        self.checks = 0

    @property
    def where(self) -> str:
        url = getattr(self._backend, "base_url", None)
        return f"{self._backend.name} at {url}" if url else self._backend.name

    async def check_now(self) -> None:
        """Ask the backend once, within ``timeout_s``, and take what it says."""
        self.checks += 1
        self._last_check = trio.current_time()
        check = getattr(self._backend, "check", None)
        listed: list[str] | None = None
        problem: str | None = f"{self.where}: no answer within {self.timeout_s:g} s"
        with trio.move_on_after(self.timeout_s):
            try:
                listed = await check() if check is not None else None
                problem = None
            except BackendError as exc:
                problem = self._said(exc)
            except Exception as exc:  # a backend's bug: it cannot serve either
                log.exception("checking the backend failed unexpectedly")
                problem = short(f"{self.where}: {type(exc).__name__}: {exc}")
        self._take(problem, listed, first=self.checks == 1)

    def _said(self, exc: Exception) -> str:
        # Never empty: the field it travels in is 1-512 characters (short() keeps 200).
        return short(str(exc)) or f"{self.where}: {type(exc).__name__}"

    def _take(self, problem: str | None, listed: list[str] | None, *, first: bool) -> None:
        was, self.problem = self.problem, problem
        if (was is None) == (problem is None) and not first:
            return
        if problem is not None:
            log.warning(
                "backend unreachable: %s; not serving %s until it answers (checking again"
                " with backoff, at most %g s apart)",
                problem,
                ", ".join(self._models),
                self.check_s,
            )
        elif first:
            log.info("backend %s answers", self.where)
        else:
            log.info("backend %s answers again: serving %s", self.where, ", ".join(self._models))
        if problem is None and listed is not None:
            self._warn_unlisted(listed)
        if (was is None) != (problem is None):
            self.changed.set()
            self.changed = trio.Event()

    def _warn_unlisted(self, listed: list[str]) -> None:
        # Ollama lists "llama3:latest" for a model asked for as "llama3".
        names = set(listed) | {n.removesuffix(":latest") for n in listed}
        missing = [m for m in self._models if m not in names]
        if missing:
            log.warning(
                "backend %s does not list %s (it lists: %s); tasks for those will fail",
                self.where,
                ", ".join(missing),
                short(", ".join(sorted(listed)) or "nothing"),
            )

    def task_failed(self, exc: Exception | None) -> None:
        """A task failed on the backend (``exc``; None: it timed out): check it now, at most
        once a second. A task that could not even connect says the backend is down now."""
        if isinstance(exc, BackendUnreachable) and self.problem is None:
            self._last_check = trio.current_time()
            self._take(self._said(exc), None, first=False)
        self._asked.set()

    async def watch(self) -> None:
        """Check the backend for as long as the agent runs (``check_now`` must have run)."""
        failures = 0
        while True:
            if self.problem is None:
                failures = 0
                wait = self.check_s
            else:
                wait = backoff_delay(
                    failures,
                    self._rng,
                    initial_s=min(FIRST_RETRY_S, self.check_s),
                    max_s=self.check_s,
                )
                failures += 1
            with trio.move_on_after(wait):
                await self._asked.wait()
                await trio.sleep_until(self._last_check + min(MIN_GAP_S, self.check_s))
            self._asked = trio.Event()
            await self.check_now()
