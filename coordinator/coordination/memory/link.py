"""One client's link to a ``MemoryState``: what every memory role object of one bundle shares.

Several links on one state model several instances sharing a backend; each closes on its own
(like a Redis client's connections), so a closed link fails its calls while the state lives on.
"""

from __future__ import annotations

import trio

from coordinator.coordination.base import CoordinationUnavailable
from coordinator.coordination.memory.state import MemoryState

__all__ = ["MemoryLink"]


class MemoryLink:
    """The state, and whether this client closed."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state
        self.closed = False
        # send side of each open subscription -> (channel, token), to unregister on close
        self.subscriptions: dict[trio.MemorySendChannel[bytes], tuple[str, int]] = {}

    async def enter(self) -> MemoryState:
        """How every call begins: one checkpoint, then the state, run synchronously from here
        on (which is what makes the call atomic)."""
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise CoordinationUnavailable("the memory coordination backend is closed")
        return self.state

    def close(self) -> None:
        """Like a closed Redis connection: the subscriptions leave the (possibly shared) state,
        and their iteration ends (shutdown, not an error)."""
        self.closed = True
        for send, (channel, token) in list(self.subscriptions.items()):
            self.state.remove_subscriber(channel, token)
            send.close()
        self.subscriptions.clear()
