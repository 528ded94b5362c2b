"""The monitor's timing bound (issue 9 item 3).

After a primary stops, the newest fact it wrote is at most one poll interval plus one poll
timeout old when its lease starts its last TTL; a standby notices the free lease within one
retry interval and writes after one more poll (another poll timeout). So facts are never older
than poll + TTL + retry + 2 x poll timeout while some monitor works, and that sum must fit in
the staleness window placement trusts (GEMMANET_RESIDENCY_STALE_S): otherwise every takeover
would leave a gap in which healthy hosts look stale.
"""

from __future__ import annotations

from coordinator.errors import SettingsError
from coordinator.settings import Settings

__all__ = [
    "check_monitor_bound",
    "monitor_bound_s",
    "monitor_bound_sum",
    "monitor_timing_problems",
]


def monitor_bound_s(settings: Settings) -> float:
    return (
        settings.monitor_poll_s
        + settings.monitor_ttl_s
        + settings.monitor_retry_s
        + 2 * settings.monitor_poll_timeout_s
    )


def monitor_bound_sum(settings: Settings) -> str:
    """The sum written out, e.g. ``poll 2 + TTL 5 + retry 1 + 2 x poll timeout 2 = 12 s``."""
    return (
        f"poll {settings.monitor_poll_s:g} + election TTL {settings.monitor_ttl_s:g} + "
        f"standby retry {settings.monitor_retry_s:g} + 2 x poll timeout "
        f"{settings.monitor_poll_timeout_s:g} = {monitor_bound_s(settings):g} s"
    )


def monitor_timing_problems(settings: Settings) -> list[tuple[str, str]]:
    """What is wrong with the monitor timing, as (code, sentence) pairs: ``bound_exceeded``
    when the staleness window cannot hold the bound, ``lease_shorter_than_tick`` when the lease
    would expire before its holder's next renewal. Empty when the timing is sound."""
    problems = []
    if monitor_bound_s(settings) > settings.residency_stale_s + 1e-9:
        problems.append(
            (
                "bound_exceeded",
                (
                    f"{monitor_bound_sum(settings)} exceeds GEMMANET_RESIDENCY_STALE_S="
                    f"{settings.residency_stale_s:g} (GEMMANET_MONITOR_POLL_S, _TTL_S, _RETRY_S, "
                    "_POLL_TIMEOUT_S)"
                ),
            )
        )
    # A primary renews once per tick, and a tick lasts up to poll interval + poll timeout.
    if settings.monitor_ttl_s <= settings.monitor_poll_s + settings.monitor_poll_timeout_s:
        problems.append(
            (
                "lease_shorter_than_tick",
                (
                    f"election TTL {settings.monitor_ttl_s:g} s must exceed poll "
                    f"{settings.monitor_poll_s:g} + poll timeout "
                    f"{settings.monitor_poll_timeout_s:g} s, or the primary loses its lease "
                    "between two renewals"
                ),
            )
        )
    return problems


def check_monitor_bound(settings: Settings) -> None:
    """Refuse, in one line, monitor timing that the staleness window cannot hold, or a lease
    that would expire before its holder's next renewal."""
    for _, problem in monitor_timing_problems(settings)[:1]:
        raise SettingsError(f"monitor timing refused: {problem}")
