"""Key lifetimes as people write them (``30d``, ``12h``), and whether a node is still online
by what the store last heard. Pure functions: the CLI and the admin API share them."""

from __future__ import annotations

import math
import re

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
#: the longest lifetime a key may be given (a typo of a few zeros is refused, not stored)
MAX_DURATION_S = 100 * 365 * 86_400.0
#: a node the store says is online, but not written as seen for this long, is reported offline
#: (its instance was killed before it could say the node left); instances write every minute
ONLINE_STALE_S = 150.0


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or several, ``1d12h``) as seconds. Raises
    ValueError with a sentence saying what is accepted."""
    cleaned = text.strip().lower() if isinstance(text, str) else ""
    pos, total = 0, 0.0
    while pos < len(cleaned):
        match = _DURATION.match(cleaned, pos)
        if match is None:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not cleaned or pos != len(cleaned) or not math.isfinite(total):
        raise ValueError(
            f"{text!r} is not a duration; write a number and a unit s, m, h, d or w "
            "(30d, 12h, 1d12h)"
        )
    if not 0 < total <= MAX_DURATION_S:
        raise ValueError(f"{text!r}: a key's lifetime must be more than 0 and at most 100 years")
    return total


def online_on(instance_id: str | None, last_seen_at: float | None, now: float) -> str | None:
    """The instance holding a node's socket by the store's record, unless that record is
    older than ``ONLINE_STALE_S`` (None: not online anywhere the store knows of)."""
    if instance_id is None or last_seen_at is None or now - last_seen_at > ONLINE_STALE_S:
        return None
    return instance_id
