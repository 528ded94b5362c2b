"""The ``RateLimits`` role on Redis: one script (``scripts.py`` RATE_LIMIT) per call, a
sliding-window log in a sorted set scored by server TIME."""

from __future__ import annotations

import secrets

from coordinator.coordination.base import RateDecision
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.scripts import RATE_LIMIT

__all__ = ["RedisRateLimits"]


class RedisRateLimits:
    """``RateLimits`` on the keys of one link's prefix."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link

    async def rate_limit(
        self, key: str, *, limit: int, period_s: float, token: str | None = None
    ) -> RateDecision:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, got {period_s!r}")
        period_us = max(1, round(period_s * 1_000_000))
        link = self._link
        # The member is the call's token: a token already in the window is allowed again,
        # not counted twice. Without one, a random member (128 bits) counts each call.
        member = f"t:{token}" if token is not None else secrets.token_hex(16)
        reply = await link.run_script(RATE_LIMIT, [link.redis_key(key)], [limit, period_us, member])
        allowed, retry_us, remaining = (int(part) for part in reply)
        return RateDecision(
            allowed=bool(allowed),
            retry_after_s=retry_us / 1_000_000,
            remaining=max(0, remaining),
        )
