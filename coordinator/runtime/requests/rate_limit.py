"""The per-API-key rate limit on ``POST /api/v1/request``, exact across instances (the
sliding-window log lives in the coordination backend: one Lua script on Redis)."""

from __future__ import annotations

import logging

from coordinator.coordination import CoordinationUnavailable, RateLimits
from coordinator.errors import COORDINATION_DOWN_MESSAGE, CoordinationDown, RateLimited

log = logging.getLogger("gemmanet.rate_limit")


async def check_rate_limit(coordination: RateLimits, rate: tuple[int, float], key_id: str) -> None:
    """Count one request of ``key_id``; raises RateLimited (429) past ``rate`` (limit, period
    in seconds), CoordinationDown (503) when the store cannot tell."""
    limit, period = rate
    try:
        decision = await coordination.rate_limit(
            f"ratelimit:{key_id}", limit=limit, period_s=period
        )
    except CoordinationUnavailable as exc:
        log.warning("rate limit check failed: %s", exc)
        raise CoordinationDown(COORDINATION_DOWN_MESSAGE) from None
    if not decision.allowed:
        raise RateLimited(
            f"rate limit of {limit} requests per {period:g} s exceeded for this API key",
            retry_after_s=decision.retry_after_s,
        )
