"""The per-API-key rate limit on ``POST /api/v1/request``, exact across instances (the
sliding-window log lives in the coordination backend: one Lua script on Redis).

A check that times out (the store is slow, not known down) is made again after a backoff
(``core/retries.py``, ``store_retry_in``) until the store has answered nothing for
``store_outage_s`` (``core/liveness.py``) or the request's ``budget_s`` since its first call
is spent; only then, or at once when the store refused or closed the connection, the request
fails closed with ``503 coordination_unavailable``."""

from __future__ import annotations

import logging
import secrets

import trio

from coordinator.coordination import CoordinationUnavailable, RateLimits
from coordinator.coordination.keys import rate_limit_key
from coordinator.core.retries import TimeoutRetries
from coordinator.errors import (
    COORDINATION_DOWN_MESSAGE,
    CoordinationDown,
    CoordinationTimeout,
    RateLimited,
)

log = logging.getLogger("gemmanet.rate_limit")


async def check_rate_limit(
    coordination: RateLimits,
    rate: tuple[int, float],
    key_id: str,
    *,
    store_outage_s: float = 0.0,
    budget_s: float = 0.0,
) -> None:
    """Count one request of ``key_id``; raises RateLimited (429) past ``rate`` (limit, period
    in seconds), CoordinationDown (503) when the store cannot tell: it refused or closed the
    connection, or timed out and has answered nothing for ``store_outage_s``, or the checks
    took ``budget_s`` (a timeout before that is made again)."""
    limit, period = rate
    salt = secrets.token_hex(8)  # this request's token, and the seed of its backoff jitter
    first_at = trio.current_time()
    retries = TimeoutRetries(store_outage_s=store_outage_s, deadline=first_at + budget_s, salt=salt)
    while True:
        asked_at = trio.current_time()
        try:
            # One token for every ask of this request: a timed-out ask that was counted after
            # all is not counted again by the next one.
            decision = await coordination.rate_limit(
                rate_limit_key(key_id), limit=limit, period_s=period, token=salt
            )
            break
        except CoordinationTimeout as exc:
            now = trio.current_time()
            delay = retries.after_timeout(asked_at, now, exc.silent_for_s)
            if delay is None:
                log.warning("rate limit check failed for %.1f s: %s", now - first_at, exc)
                raise CoordinationDown(COORDINATION_DOWN_MESSAGE) from None
            log.info("rate limit check timed out, asking again: %s", exc)
            await trio.sleep(delay)
        except CoordinationUnavailable as exc:
            log.warning("rate limit check failed: %s", exc)
            raise CoordinationDown(COORDINATION_DOWN_MESSAGE) from None
    if not decision.allowed:
        raise RateLimited(
            f"rate limit of {limit} requests per {period:g} s exceeded for this API key",
            retry_after_s=decision.retry_after_s,
        )
