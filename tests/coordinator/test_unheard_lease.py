"""A lease granted to an ask whose answer was lost is given back when the request gives up,
not held until its TTL: every ask of the request is carried out by the store and its answer
lost (a store slow past the admission timeout), the request fails after the store outage
bound, and at that moment the node has no lease left (without ``MayHold.nodes`` it kept one
for ``GEMMANET_LEASE_TTL_S``, 30 s, turning others away from a free slot)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from coordinator.coordination.bus.base import PubSubBus
from coordinator.coordination.leases import Admission, AdmissionRules, LeaseAsk
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.errors import CoordinationDown, CoordinationTimeout
from coordinator.runtime.instance import Instance
from coordinator.settings import Settings
from sim.stand_ins import SimStore
from tests.coordinator.test_instance_dispatch import announce_peer


class AnswersLost:
    """The Leases role whose admissions are carried out and their answers lost."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.asks: list[LeaseAsk] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        self.asks.append(ask)
        await self._inner.admit(ask, rules)
        raise CoordinationTimeout("no answer within 1 s (the answer was lost)")


class PeerListens(PubSubBus):
    async def is_listening(self, instance_id: str) -> bool:
        return instance_id == "B"  # the peer listens; our own id is free


async def keep_peer_alive(coordination: MemoryCoordination) -> None:
    while True:
        await announce_peer(coordination, "B", "n1")
        await trio.sleep(0.25)


async def test_a_lease_granted_unheard_is_given_back_when_the_request_gives_up(
    autojump_clock: object,
) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            coordination = MemoryCoordination(trio.current_time)
            inner = coordination.leases
            lost = AnswersLost(inner)
            coordination.leases = lost  # type: ignore[assignment]
            settings = Settings(instance_id="A", multi_instance=True, redis_url="memory://")
            bus = PeerListens(coordination.pubsub)
            instance = Instance(settings, SimStore(), coordination, bus, rng=random.Random(1))  # type: ignore[arg-type]
            nursery.start_soon(keep_peer_alive, coordination)
            await nursery.start(instance.run)
            await trio.sleep(1.0)  # a beat: B's node is known
            with pytest.raises(CoordinationDown):
                await instance.requests.start(
                    key_id="k", model="m", prompt="p", stream=False, timeout_s=10
                )
            assert len(lost.asks) >= 2 and all(a.again for a in lost.asks[1:])
            # The store granted the first ask; the lease is there until the request gives up.
            await trio.sleep(0.1)  # the release runs in the background
            assert (await inner.lease_usage(["n1"]))["n1"].leases == 0
            nursery.cancel_scope.cancel()
