"""Reading this instance's inbox for as long as the instance runs."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.bus.base import Bus
from coordinator.errors import CoordinationTimeout, StartupRefused

log = logging.getLogger("gemmanet.bus")

BACKOFF_S = (0.1, 2.0)  # first and longest wait before listening again


async def read_inbox(
    bus: Bus,
    instance_id: str,
    on_payload: Callable[[bytes], None],
    on_lost: Callable[[], None],
    task_status: trio.TaskStatus[None],
) -> None:
    """Feed every envelope of our inbox to ``on_payload``. Failing to listen at start refuses
    the start.

    A lost inbox is listened to again. On a bus that can resume (streams, within
    ``bus.resume_window_s``) a re-listen that resumed with nothing missing goes on as if nothing
    happened; otherwise ``on_lost`` is called — answers from peers may have been lost — on every
    failed attempt, and once more if the inbox came back with a gap, and listening is retried
    with backoff. The window counts only time in which Redis answered, as liveness does: a
    listen lost to a read that timed out, or an attempt that timed out, starts it again. A
    silent Redis lapses every presence at once, and a sender that saw it silent refuses
    nothing for a lapsed one (bus/streams.py), so the re-listen after it still resumes; whether
    anything was refused meanwhile is what ``resumed`` says."""
    backoff, started = BACKOFF_S[0], False
    lost_since: float | None = None  # when the inbox was lost, until it is back
    gave_up = False  # the loss could not be resumed: on_lost was called
    while True:
        try:
            async with bus.listen(instance_id) as inbox:
                if not started:
                    task_status.started()
                    started = True
                elif gave_up:
                    log.info("instance bus re-established")
                elif lost_since is not None and inbox.resumed:
                    log.info("instance bus resumed after the last envelope read; nothing lost")
                elif lost_since is not None:
                    log.warning(
                        "instance bus back with a gap; failing tasks whose answers were lost"
                    )
                    on_lost()
                lost_since, gave_up, backoff = None, False, BACKOFF_S[0]
                async for payload in inbox:
                    on_payload(payload)
        except CoordinationUnavailable as exc:
            if not started:
                raise StartupRefused(f"cannot subscribe to the instance bus: {exc}") from None
            now = trio.current_time()
            if lost_since is None and bus.resume_window_s > 0:
                log.warning("instance bus lost (%s); listening again to resume", exc)
            if lost_since is None or (isinstance(exc, CoordinationTimeout) and not gave_up):
                lost_since = now  # Redis silent: the window counts answered time only
            if not gave_up and now - lost_since < bus.resume_window_s:
                await trio.sleep(BACKOFF_S[0])
                continue
            if not gave_up:
                log.warning("instance bus lost (%s); failing tasks whose answers may be lost", exc)
                gave_up = True
            on_lost()
            await trio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_S[1])
