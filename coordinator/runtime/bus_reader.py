"""Reading this instance's inbox for as long as the instance runs."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.bus import Bus
from coordinator.errors import StartupRefused

log = logging.getLogger("gemmanet.bus")

BACKOFF_S = (0.1, 2.0)  # first and longest wait before listening again


async def read_inbox(
    bus: Bus,
    instance_id: str,
    on_payload: Callable[[bytes], None],
    on_lost: Callable[[], None],
    task_status: trio.TaskStatus[None],
) -> None:
    """Feed every envelope of our inbox to ``on_payload``. A lost inbox (a real connection
    loss, not a slow Redis) calls ``on_lost`` — answers from peers may have been lost with it
    — and listens again with backoff. Failing to listen at start refuses the start."""
    backoff, started = BACKOFF_S[0], False
    while True:
        try:
            async with bus.listen(instance_id) as inbox:
                if not started:
                    task_status.started()
                    started = True
                elif backoff > BACKOFF_S[0]:
                    log.info("instance bus re-established")
                backoff = BACKOFF_S[0]
                async for payload in inbox:
                    on_payload(payload)
        except CoordinationUnavailable as exc:
            if not started:
                raise StartupRefused(f"cannot subscribe to the instance bus: {exc}") from None
            log.warning("instance bus lost (%s); failing tasks whose answers may be lost", exc)
            on_lost()
            await trio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_S[1])
