"""The per-API-key rate limit on ``POST /api/v1/request``, exact across instances (the
sliding-window log lives in the coordination backend: one Lua script on Redis, which the
admission script runs too, so a request that asks for a lease is counted in that same round
trip: ``RateCharge``).

A check that times out (the store is slow, not known down) is made again after a backoff
(``core/admission/retries.py``, ``store_retry_in``) until the store has answered nothing for
``store_outage_s`` (``core/liveness.py``) or the request's ``budget_s`` since its first call
is spent; only then, or at once when the store refused or closed the connection, the request
fails closed with ``503 coordination_unavailable``."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

import trio

from coordinator.coordination import CoordinationUnavailable, RateLimits
from coordinator.coordination.keys import rate_limit_key
from coordinator.core.admission.retries import TimeoutRetries
from coordinator.errors import (
    COORDINATION_DOWN_MESSAGE,
    CoordinationDown,
    CoordinationTimeout,
    RateLimited,
)

log = logging.getLogger("gemmanet.rate_limit")


@dataclass(slots=True)
class RateCharge:
    """One request's rate limit, counted once: by its first admission ask that the store
    answers (the same script, ``LeaseAsk.rate``: one round trip for both), or on its own
    (``check_rate_limit``, with the same token) when the request ends before it asks, so a
    request refused earlier (a bad body, no node for its model) still counts and is still
    answered 429 when over the limit."""

    key_id: str
    #: the request's token in the window (every ask of it carries the same)
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    counted: bool = False


def rate_limited(limit: int, period: float, retry_after_s: float) -> RateLimited:
    return RateLimited(
        f"rate limit of {limit} requests per {period:g} s exceeded for this API key",
        retry_after_s=retry_after_s,
    )


async def check_rate_limit(
    coordination: RateLimits,
    rate: tuple[int, float],
    key_id: str,
    *,
    store_outage_s: float = 0.0,
    budget_s: float = 0.0,
    token: str | None = None,
) -> None:
    """Count one request of ``key_id``; raises RateLimited (429) past ``rate`` (limit, period
    in seconds), CoordinationDown (503) when the store cannot tell: it refused or closed the
    connection, or timed out and has answered nothing for ``store_outage_s``, or the checks
    took ``budget_s`` (a timeout before that is made again)."""
    limit, period = rate
    # This request's token, and the seed of its backoff jitter.
    salt = token if token is not None else secrets.token_hex(8)
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
        raise rate_limited(limit, period, decision.retry_after_s)
