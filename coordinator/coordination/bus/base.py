"""The instance bus: one inbox per instance, reached by instance id.

``Bus`` is the interface; three implementations honour it, proven by one contract suite
(tests/coordinator/test_bus_contract.py):

* ``PubSubBus`` (here, default) rides on the coordination backend's publish/subscribe: lowest
  latency, at-most-once, and PUBLISH tells the sender how many inboxes received an envelope — a
  sender learns at once that the instance it addresses is gone.
* ``StreamsBus`` (bus/streams.py, ``GEMMANET_BUS=streams``) on Redis Streams survives a
  subscriber reconnect without losing what was sent meanwhile.
* ``MemoryBus`` (bus/memory.py) in one process, for the embedded mode, tests and the simulator;
  either of the two semantics above.
"""

from __future__ import annotations

import abc
from contextlib import AbstractAsyncContextManager

from coordinator.coordination.base import Subscription
from coordinator.coordination.keys import inbox
from coordinator.coordination.roles import PubSub

__all__ = ["Bus", "PubSubBus"]


class Bus(abc.ABC):
    #: how long after losing its connection a listen can still be resumed with nothing lost
    #: (``Subscription.resumed``); 0: never — a lost listen may have lost envelopes (pub/sub)
    resume_window_s: float = 0.0

    @abc.abstractmethod
    async def send(self, instance_id: str, payload: bytes) -> int:
        """Deliver to ``instance_id``'s inbox; how many listeners got it (0: nobody there)."""

    @abc.abstractmethod
    def listen(self, instance_id: str) -> AbstractAsyncContextManager[Subscription]:
        """This instance's inbox, for the duration of the block."""

    @abc.abstractmethod
    async def is_listening(self, instance_id: str) -> bool:
        """Whether ``instance_id`` has its inbox open right now (a kill -9 closes it at once)."""

    async def held_by_live_process(self, instance_id: str) -> bool:
        """Whether a live process listens on ``instance_id``'s inbox (asked once, at start-up,
        before listening there: an instance id may run in one process at a time). A killed
        process must not count, so that it can be restarted at once with its id. Where the
        listener count closes with the process's socket (pub/sub), that is ``is_listening``."""
        return await self.is_listening(instance_id)


class PubSubBus(Bus):
    """``Bus`` over a backend's ``PubSub`` role (Redis pub/sub in production)."""

    def __init__(self, pubsub: PubSub) -> None:
        self._pubsub = pubsub

    def __repr__(self) -> str:
        return f"PubSubBus({self._pubsub!r})"

    async def send(self, instance_id: str, payload: bytes) -> int:
        return await self._pubsub.publish(inbox(instance_id), payload)

    def listen(self, instance_id: str) -> AbstractAsyncContextManager[Subscription]:
        return self._pubsub.subscribe(inbox(instance_id))

    async def is_listening(self, instance_id: str) -> bool:
        return await self._pubsub.subscriber_count(inbox(instance_id)) > 0
