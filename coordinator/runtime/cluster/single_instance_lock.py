"""GEMMANET_MULTI_INSTANCE=0 with Redis: exactly one instance may run on that Redis (and key
prefix), and no GEMMANET_MULTI_INSTANCE=1 instance may run beside it, whichever starts first.

The two modes see each other through the lock and the presence registry, into which every
instance beats: a ``=1`` instance beats, then looks for the lock; a ``=0`` instance takes the
lock, beats, then looks for other members. Whichever order the steps interleave in, the one
that starts second sees the other (both may refuse if they start at the same moment).

``refuse_a_running_id``: in every mode, one instance id is one live process.
"""

from __future__ import annotations

import logging

import trio

from coordinator.coordination import CoordinationUnavailable, KeyValue, Presence, keys
from coordinator.coordination.bus.base import Bus
from coordinator.core import registry
from coordinator.errors import StartupRefused
from coordinator.settings import Settings

log = logging.getLogger("gemmanet.lock")

#: how long a graceful stop may spend deleting the lock (one Redis round trip when all is well)
RELEASE_BOUND_S = 2.5


async def hold_single_instance_lock(
    coordination: KeyValue,
    instance_id: str,
    *,
    ttl_s: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A second instance refuses to start; the lock expires ``ttl_s`` after its holder dies
    and is released at once when its holder stops gracefully."""
    key, value = keys.SINGLE_INSTANCE_LOCK, instance_id.encode()
    try:
        acquired = await coordination.set(key, value, ttl_s=ttl_s, only_if_absent=True)
        holder = None if acquired else await coordination.get(key)
    except CoordinationUnavailable as exc:
        raise StartupRefused(f"cannot reach Redis at start: {exc}") from None
    if not acquired and holder != value:
        name = holder.decode(errors="replace") if holder else "another instance"
        raise StartupRefused(
            f"instance {name} holds the single-instance lock in this Redis; set "
            f"GEMMANET_MULTI_INSTANCE=1 to run several instances (a graceful stop releases the "
            f"lock at once; a killed holder's lock expires {ttl_s:g} s after it died)"
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
        # RELEASE_BOUND_S plus app.py's bound on leaving stays inside serve's 6 s stop deadline;
        # 1 s was too tight on a loaded machine (the lock stayed until its TTL).
        with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_BOUND_S):
            try:
                await coordination.compare_and_set(key, value, None)
            except CoordinationUnavailable:
                pass


async def refuse_mixed_modes(key_value: KeyValue, presence: Presence, settings: Settings) -> None:
    """``StartupRefused`` if an instance of the other GEMMANET_MULTI_INSTANCE mode runs on this
    Redis and prefix. Call it after this instance's first beat (and, with ``=0``, after taking
    the lock)."""
    prefix = settings.key_prefix
    try:
        if settings.multi_instance:
            holder = await key_value.get(keys.SINGLE_INSTANCE_LOCK)
            if holder is not None:
                raise StartupRefused(
                    f"instance {holder.decode(errors='replace')} runs alone on this Redis "
                    f"(GEMMANET_MULTI_INSTANCE=0, key prefix {prefix!r}); run every instance "
                    "with GEMMANET_MULTI_INSTANCE=1, or give this one another GEMMANET_KEY_PREFIX"
                )
            return
        view = await presence.presence_read(
            keys.PRESENCE, stall_after_s=settings.liveness_timing().stall_gap_s
        )
    except CoordinationUnavailable as exc:
        raise StartupRefused(f"cannot reach Redis at start: {exc}") from None
    others = registry.recent_members(
        {e.member: e.last_beat for e in view.entries},
        now=view.now,
        alive_ttl_s=settings.alive_ttl_s,
        me=settings.instance_id,
    )
    if others:
        raise StartupRefused(
            f"instance(s) {', '.join(others)} already run on this Redis with "
            f"GEMMANET_MULTI_INSTANCE=1 (key prefix {prefix!r}); set GEMMANET_MULTI_INSTANCE=1 "
            "here too, or give this one another GEMMANET_KEY_PREFIX"
        )


async def refuse_a_running_id(bus: Bus, instance_id: str) -> None:
    """One instance id, one live process: a second process with a running id would share
    its inbox and make cross-instance traffic to that id's nodes fail. The rule is the
    inbox's live listener (``Bus.held_by_live_process``), not the registry's fresh beat: a
    beat stays fresh for the TTL after a kill -9, while a killed listener stops counting
    at once (pub/sub) or as soon as its presence key is seen counting down to nothing
    (streams: at most one presence TTL), so a killed instance can be restarted at once with
    its id. (Two processes starting in the same instant are not caught; this guards against
    operator mistakes, it is no lock.)"""
    try:
        taken = await bus.held_by_live_process(instance_id)
    except CoordinationUnavailable as exc:
        raise StartupRefused(f"cannot reach Redis at start: {exc}") from None
    if taken:
        raise StartupRefused(
            f"instance id {instance_id!r} is already running (a live process listens on "
            "its inbox); stop it or give this one another GEMMANET_INSTANCE_ID"
        )
