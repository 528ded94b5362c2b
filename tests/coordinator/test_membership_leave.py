"""A graceful stop leaves the presence registry for good (``runtime/cluster/membership.py``):
a beat still in flight when ``leave`` runs (the store slow to answer it) must not write the
instance's entry back after the removal. On a loaded machine that happened: a restarted
instance then counted its stopped predecessor as a live peer for the registry's TTL.

The memory backend's presence role, with one beat held back until the test lets it go, makes
the interleaving exact."""

from __future__ import annotations

from typing import Any

import trio

from coordinator.coordination import keys
from coordinator.coordination.base import PresenceView
from coordinator.coordination.bus.memory import MemoryBus
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.core.registry import InstanceSnapshot
from coordinator.runtime.cluster.membership import Membership
from coordinator.settings import Settings


class SlowBeats:
    """A presence role whose beats wait for ``release`` (a store slow on exactly those)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.beat_sent = trio.Event()
        self.release = trio.Event()

    async def presence_beat(self, *args: Any, **kwargs: Any) -> PresenceView:
        self.beat_sent.set()
        await self.release.wait()
        return await self._inner.presence_beat(*args, **kwargs)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_beat_in_flight_during_leave_does_not_write_the_entry_back() -> None:
    async with MemoryCoordination(trio.current_time) as coordination:
        presence = SlowBeats(coordination.presence)
        settings = Settings(instance_id="A", multi_instance=True, redis_url="memory://")
        member = Membership(
            coordination.key_value,
            presence,
            MemoryBus(),
            settings,
            snapshot=lambda: InstanceSnapshot(instance_id="A", in_flight=0, nodes=[]),
            clock=trio.current_time,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member._beat)
            await presence.beat_sent.wait()  # the beat is on its way to the store
            nursery.start_soon(member.leave)
            await trio.sleep(0.05)  # leave runs now, while the beat waits
            presence.release.set()
        view = await coordination.presence.presence_read(keys.PRESENCE, stall_after_s=10.0)
        assert [entry.member for entry in view.entries] == []
        # And no later beat writes it either.
        await member._beat()
        view = await coordination.presence.presence_read(keys.PRESENCE, stall_after_s=10.0)
        assert [entry.member for entry in view.entries] == []
