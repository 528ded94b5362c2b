"""The one place the simulator reaches into trio internals: the scheduler's tie-break between
tasks woken together, pinned to the run's seed, so that a run's interleaving is a function of
the seed alone (exact replay); and the virtual clock, trio's MockClock, taken from where
``trio.testing`` takes it (``mock_clock``).

trio picks the order of such tasks from a private ``random.Random`` (``trio._core._run._r``);
with its deterministic scheduling switched on (``_ALLOW_DETERMINISTIC_SCHEDULING``, what
trio's Hypothesis plugin turns on), it sorts them by creation and shuffles them with that
Random. Private API, so the trio release is checked first (``SUPPORTED_TRIO``): 0.35 is the
one CI runs (constraints.txt); 0.27, pyproject.toml's floor, has the same lines. Outside that
range the simulator refuses in one line rather than run with an unpinned scheduler, whose
replays would diverge. The determinism tests in tests/sim/ fail loudly if a release in the
range changes the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.versions import require_release

if TYPE_CHECKING:
    from trio.testing import MockClock

__all__ = ["SUPPORTED_TRIO", "check_trio_version", "mock_clock", "pin_trio_scheduler"]

#: the trio releases whose scheduler the hook is written for: (major, minor) from, and below
SUPPORTED_TRIO = ((0, 27), (0, 36))


def check_trio_version() -> None:
    """The installed trio is one of ``SUPPORTED_TRIO``, or ``StartupRefused``."""
    require_release(
        "trio",
        SUPPORTED_TRIO,
        name="trio",
        needed_by="the simulator's deterministic scheduling supports",
    )


def pin_trio_scheduler(seed: str) -> None:
    """Make the order of tasks woken together a function of ``seed`` (before ``trio.run``)."""
    check_trio_version()
    from trio._core import _run

    _run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    _run._r.seed(seed)


def mock_clock() -> MockClock:
    """trio's ``MockClock``, jumping to the next deadline whenever every task is blocked."""
    check_trio_version()
    # Not from trio.testing, its public home: that package's __init__ imports pytest (~0.2 s
    # of every simulator process, for its RaisesGroup helpers). trio.testing re-exports this
    # very class from trio._core, which defines it in _mock_clock; tests/sim/test_sim_imports.py
    # fails if that changes.
    from trio._core._mock_clock import MockClock

    return MockClock(autojump_threshold=0)
