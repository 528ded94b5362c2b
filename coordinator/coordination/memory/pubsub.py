"""The memory backend's pub/sub (the ``PubSub`` role) over the state's channel fan-out.

At-most-once like Redis: a subscriber whose buffer is full loses the message (counted in
``dropped``), and ``publish`` never blocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import trio

from coordinator.coordination.base import Subscription
from coordinator.coordination.memory.link import MemoryLink

__all__ = ["DEFAULT_SUBSCRIBER_BUFFER", "MemoryPubSub", "MemorySubscription"]

DEFAULT_SUBSCRIBER_BUFFER = 10_000


class MemorySubscription(Subscription):
    """One subscriber's bounded buffer. Iteration ends when the block or the backend closes."""

    def __init__(self, receive: trio.MemoryReceiveChannel[bytes]) -> None:
        self._receive = receive
        #: messages this subscriber lost because its buffer was full
        self.dropped = 0

    def __aiter__(self) -> MemorySubscription:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None


class MemoryPubSub:
    """``PubSub`` over one link's state; closing the link ends its subscriptions."""

    def __init__(
        self, link: MemoryLink, *, subscriber_buffer: int = DEFAULT_SUBSCRIBER_BUFFER
    ) -> None:
        self._link = link
        self._subscriber_buffer = subscriber_buffer

    async def publish(self, channel: str, payload: bytes) -> int:
        return (await self._link.enter()).publish(channel, payload)

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        return self._subscribe(channel)

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[MemorySubscription]:
        state = await self._link.enter()
        send, receive = trio.open_memory_channel[bytes](self._subscriber_buffer)
        subscription = MemorySubscription(receive)

        def offer(payload: bytes) -> bool:
            try:
                send.send_nowait(payload)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                subscription.dropped += 1
                return False
            return True

        token = state.add_subscriber(channel, offer)
        self._link.subscriptions[send] = (channel, token)
        try:
            yield subscription
        finally:
            state.remove_subscriber(channel, token)
            self._link.subscriptions.pop(send, None)
            send.close()
            receive.close()

    async def subscriber_count(self, channel: str) -> int:
        return (await self._link.enter()).subscriber_count(channel)
