"""The errors a request waiting for a lease fails with (``machine.py`` decides when):
each says what the client can do about it."""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.errors import AllNodesBusy, CoordinationDown, GemmaNetError, TooManyActive

__all__ = ["facts_missing", "refusal", "timed_out"]


def refusal(
    model: str,
    outcome: str,
    refusals: Mapping[str, str],
    *,
    queue_max: int,
    max_active_per_key: int,
) -> GemmaNetError:
    """The store refused the request at once (``key_limit``, ``queue_full``, stale facts)."""
    if outcome == "key_limit":
        return TooManyActive(
            f"this API key already has {max_active_per_key} request(s) running or queued "
            "(GEMMANET_MAX_ACTIVE_PER_KEY)",
            retry_after_s=1,
        )
    if outcome == "queue_full":
        return AllNodesBusy(
            f"{queue_max} request(s) already wait for model {model!r} (GEMMANET_QUEUE_MAX)",
            retry_after_s=5,
        )
    stale = sorted(n for n, reason in refusals.items() if reason == "stale")
    return CoordinationDown(
        f"the facts of node(s) {', '.join(stale)} are stale (their instance stopped "
        "updating them); nothing is placed on a guess",
    )


def facts_missing(model: str) -> CoordinationDown:
    return CoordinationDown(
        f"the shared store has no current facts for the nodes serving model {model!r} "
        "(it may have restarted; their instances are writing them again)"
    )


def timed_out(model: str, queue_timeout_s: float) -> AllNodesBusy:
    return AllNodesBusy(
        f"no node serving model {model!r} had room within {queue_timeout_s:g} s "
        "(GEMMANET_QUEUE_TIMEOUT_S)",
        retry_after_s=max(1, round(queue_timeout_s / 10)),
    )
