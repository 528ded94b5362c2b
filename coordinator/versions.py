"""The check that a dependency is a release our workarounds were written for.

Where GemmaNet reaches into a library's internals (Hypercorn's HTTP/1.1 server, trio's
scheduler in the simulator), a release that renamed what it touches would be patched wrongly
or silently not at all; such a release is refused at start with one line instead.
"""

from __future__ import annotations

import re
from importlib import metadata

from coordinator.errors import StartupRefused

__all__ = ["require_release"]

Release = tuple[int, int]


def require_release(
    distribution: str, supported: tuple[Release, Release], *, name: str, needed_by: str
) -> None:
    """The installed ``distribution`` is within ``supported`` ((major, minor) from, and
    below), or ``StartupRefused`` naming the range (``name``: how the line spells it,
    ``needed_by``: what depends on it, with its verb: "the simulator's scheduling supports")."""
    try:
        installed: str | None = metadata.version(distribution)
    except metadata.PackageNotFoundError:  # importable, but not installed as a distribution
        installed = None
    # (major, minor) is enough: the ranges are bounded by minor releases, and a pre-release of
    # the upper bound (0.19.0rc1) must be refused like the release itself.
    parsed = re.match(r"(\d+)\.(\d+)", installed or "")
    version = (int(parsed[1]), int(parsed[2])) if parsed else None
    low, high = supported
    if version is None or not low <= version < high:
        wanted = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
        raise StartupRefused(
            f"{name} {installed or '(version unknown)'} is installed, but {needed_by} "
            f"only {distribution}{wanted}: pip install '{distribution}{wanted}'"
        )
