"""GEMMANET_MULTI_INSTANCE=0 with Redis: exactly one instance may run on that Redis."""

from __future__ import annotations

import logging

import trio

from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.core import registry
from coordinator.errors import StartupRefused

log = logging.getLogger("gemmanet.lock")


async def hold_single_instance_lock(
    coordination: Coordination,
    instance_id: str,
    *,
    ttl_s: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A second instance refuses to start; the lock expires ``ttl_s`` after its holder dies
    and is released at once when its holder stops gracefully."""
    key, value = registry.SINGLE_INSTANCE_LOCK, instance_id.encode()
    try:
        acquired = await coordination.set(key, value, ttl_s=ttl_s, only_if_absent=True)
        holder = None if acquired else await coordination.get(key)
    except CoordinationUnavailable as exc:
        raise StartupRefused(f"cannot reach Redis at start: {exc}") from None
    if not acquired and holder != value:
        name = holder.decode(errors="replace") if holder else "another instance"
        raise StartupRefused(
            f"instance {name} holds the single-instance lock in this Redis; set "
            f"GEMMANET_MULTI_INSTANCE=1 to run several instances (the lock expires {ttl_s:g} s "
            "after its holder stops)"
        )
    task_status.started()
    try:
        while True:
            await trio.sleep(ttl_s / 3)
            try:
                if not await coordination.refresh_if(key, value, ttl_s):
                    await coordination.set(key, value, ttl_s=ttl_s, only_if_absent=True)
            except CoordinationUnavailable as exc:
                log.warning("could not refresh the single-instance lock: %s", exc)
    finally:
        # Shielded from the cancellation that stops us, but bounded: the deadline sits inside.
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            try:
                await coordination.compare_and_set(key, value, None)
            except CoordinationUnavailable:
                pass
