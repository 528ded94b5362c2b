"""A task route's rate charge (``runtime/requests/rate_limit.py`` ``RateCharge``), kept with
the HTTP request: ``task_request`` makes it once the key is known, the task's admission ask
counts it (``task_runs`` hands it to ``TaskRequests.start``), and every error handler of the
task routes asks ``rate_first`` what a request refused before that is answered: the rate
limit's 429 when it is over the limit (counted then), else its own error.
"""

from __future__ import annotations

from quart import current_app, g

from coordinator.errors import GemmaNetError
from coordinator.runtime.requests.rate_limit import RateCharge

__all__ = ["new_rate_charge", "rate_charge", "rate_first"]


def new_rate_charge(key_id: str) -> RateCharge:
    charge = g.gemmanet_rate = RateCharge(key_id)
    return charge


def rate_charge() -> RateCharge | None:
    """This request's rate charge (None: not a task route, or refused before its key)."""
    charge: RateCharge | None = g.get("gemmanet_rate")
    return charge


async def rate_first(error: GemmaNetError) -> GemmaNetError:
    """What a task route refused with ``error`` answers: the rate limit's error when the
    request was not counted yet and is over it (or the store cannot tell: 503, as a count on
    arrival would have answered)."""
    charge = rate_charge()
    if charge is None or charge.counted:
        return error
    inst = current_app.config["GEMMANET_INSTANCE"]
    first: GemmaNetError = await inst.requests.charge_first(charge, error)
    return first
