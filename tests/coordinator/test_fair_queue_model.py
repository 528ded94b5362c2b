"""A hypothesis stateful test of the ``fair`` queue order against the plain deficit round robin
of the lease model's reference (``test_lease_model.Reference`` and its ``Drr``), on the memory
backend and on a real Redis (the Lua scripts).

The lease model test draws every kind of step (dead instances, expiries, facts coming and
going); there a queue of several keys whose heads are granted is rare. Here every step is about
the queue of one model on one node of one or two slots: requests of four keys with weights 1-3
join, the head asks again (and is granted when a slot is free), others ask again (their
``position`` is checked against the reference serving its copy one grant at a time), requests
give up while queued, running ones finish and wake the head, or give their lease back and ask
again under a new attempt (a placement that failed). Every answer is compared in full
(outcome, lease, position, next_in_queue, head) and so are the queue depths.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from contextlib import AbstractAsyncContextManager

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from coordinator.coordination import Coordination
from coordinator.coordination.leases import AdmissionRules, LeaseAsk, LeaseRelease, NodeFacts
from coordinator.coordination.memory.coordination import MemoryCoordination, MemoryState
from coordinator.coordination.redis.coordination import RedisCoordination
from tests.coordinator.test_lease_model import REGISTRY, Reference, view
from tests.fixtures.coordination_backend import FakeClock
from tests.fixtures.redis_server import RedisServer
from tests.fixtures.trio_portal import Portal

KEYS = ("k1", "k2", "k3", "k4")
RULES = AdmissionRules(REGISTRY, 600.0, 600.0, 600.0, queue_max=12, queue_policy="fair")


class FairQueueMachine(RuleBasedStateMachine):
    open: object
    portal: Portal

    def __init__(self) -> None:
        super().__init__()
        self.coord, self._close = self.portal.hold(self.open)  # type: ignore[arg-type]
        self.model = Reference(RULES, 0.0)
        self.asks: dict[str, LeaseAsk] = {}
        self.running: dict[str, str] = {}  # request id -> lease id
        self.counter = itertools.count()

    def teardown(self) -> None:
        self._close()

    @initialize(slots=st.integers(1, 2))
    def start(self, slots: int) -> None:
        for instance in ("O", "A", "B"):
            self.portal.run(self._beat, instance)
            self.model.beats[instance] = 0.0
        facts = NodeFacts("n1", "x", "O", slots)
        self.portal.run(self.coord.leases.put_node_facts, facts)
        self.model.facts["n1"] = facts

    async def _beat(self, instance: str) -> None:
        await self.coord.presence.presence_beat(
            REGISTRY, instance, b"", stall_after_s=600.0, forget_after_s=600.0
        )

    def admit(self, ask: LeaseAsk) -> None:
        got = view(self.portal.run(self.coord.leases.admit, ask, RULES))
        assert got == self.model.admit(ask), ask
        self.asks[ask.request_id] = ask
        if got[0] == "granted":
            self.running[ask.request_id] = ask.lease_id

    def again(self, request_id: str) -> None:
        ask = dataclasses.replace(self.asks[request_id], lease_id=f"L{next(self.counter)}")
        self.admit(ask)

    def queued(self) -> list[str]:
        return [e.request_id for e in self.model.queues.get("a", [])]

    @rule(
        key=st.sampled_from(KEYS),
        weight=st.sampled_from([1, 1, 2, 3]),
        instance=st.sampled_from("AB"),
    )
    def new_request(self, key: str, weight: int, instance: str) -> None:
        rid = f"r{next(self.counter)}"
        self.admit(
            LeaseAsk(
                rid,
                instance,
                key,
                "a",
                0.0,
                0.0,
                (("n1", "x"),),
                f"L{next(self.counter)}",
                600.0,
                weight=weight,
            )
        )

    @precondition(lambda self: bool(self.queued()))
    @rule()
    def head_asks_again(self) -> None:
        first = self.model.first("a")
        assert first is not None
        self.again(first.request_id)

    @precondition(lambda self: bool(self.queued()))
    @rule(data=st.data())
    def another_asks_again(self, data: st.DataObject) -> None:
        self.again(data.draw(st.sampled_from(self.queued())))

    @precondition(lambda self: bool(self.queued()))
    @rule(data=st.data())
    def one_gives_up(self, data: st.DataObject) -> None:
        self.release(data.draw(st.sampled_from(self.queued())), None)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def one_finishes(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        self.release(rid, ("n1", self.running.pop(rid)))

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def one_is_placed_again(self, data: st.DataObject) -> None:
        """Its placement never reached the node: it gives its lease only back and asks again
        under a new attempt (same request id, new lease id), a new request of its key."""
        rid = data.draw(st.sampled_from(sorted(self.running)))
        lease = ("n1", self.running.pop(rid))
        back = LeaseRelease(request_id=rid, lease=lease, wake_models=["a"])
        got = self.portal.run(self.coord.leases.release, back, RULES)
        assert got == self.model.release(rid, "", "", lease, ["a"])
        self.again(rid)

    def release(self, rid: str, lease: tuple[str, str] | None) -> None:
        key = self.asks[rid].key_id
        done = LeaseRelease(request_id=rid, key_id=key, model="a", lease=lease, wake_models=["a"])
        got = self.portal.run(self.coord.leases.release, done, RULES)
        assert got == self.model.release(rid, key, "a", lease, ["a"])

    @invariant()
    def depths_match(self) -> None:
        depths = self.portal.run(self.coord.leases.queue_depths, ["a"], RULES)
        self.model.head("a")
        assert depths == {"a": len(self.queued())}


def run(portal: Portal, opener: object, examples: int, steps: int) -> None:
    attributes = {"open": staticmethod(opener), "portal": portal}  # type: ignore[arg-type]
    machine = type("Machine", (FairQueueMachine,), attributes)
    run_state_machine_as_test(
        machine, settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None)
    )


def test_fair_queue_model_memory(trio_portal: Portal) -> None:
    def fresh() -> AbstractAsyncContextManager[Coordination]:
        return MemoryCoordination(state=MemoryState(FakeClock()))

    run(trio_portal, fresh, examples=30, steps=40)


@pytest.mark.redis
def test_fair_queue_model_redis(trio_portal: Portal, redis_server_session: RedisServer) -> None:
    def fresh() -> AbstractAsyncContextManager[Coordination]:
        return RedisCoordination(
            redis_server_session.url, key_prefix=f"fq-{uuid.uuid4().hex}", op_timeout_s=10.0
        )

    run(trio_portal, fresh, examples=8, steps=40)
