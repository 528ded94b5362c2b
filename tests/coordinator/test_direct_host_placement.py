"""The placement rule for direct model hosts (``core/hosts/direct_hosts.py``), pure: a host is a
candidate only on facts that exist, say it was reachable, carry the current monitor epoch and
are younger than the staleness window *counting the time since they were read*; it serves
only the models its facts name. Then the machine: an assign to a host is a ``CallHost``, its
answers reach the request like a node's, and whoever ends the task stops the call."""

from __future__ import annotations

import random

import pytest

from coordinator.core import cluster_view
from coordinator.core.effects import (
    CallHost,
    ChunkEvent,
    Deliver,
    DoneEvent,
    FailedEvent,
    ReleaseLease,
    Reserve,
    StopHostCall,
)
from coordinator.core.hosts.direct_hosts import DirectHosts, HostRead, HostTerms, host_state
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.node_table import NodeConnection
from coordinator.errors import NoNodeForModel
from protocol import Assign, BusChunk, BusResult, TaskErrorCode, TaskFailure

STALE_S = 15.0
EPOCH = 7


def read(
    *,
    age_s: float = 1.0,
    read_at: float = 100.0,
    epoch: int = EPOCH,
    reachable: bool = True,
    models: tuple[str, ...] = ("llama3",),
    resident: dict[str, float] | None = None,
) -> HostRead:
    return HostRead(
        reachable=reachable,
        epoch=epoch,
        age_s=age_s,
        read_at=read_at,
        models=frozenset(models),
        resident=resident or {},
    )


def state(facts: HostRead | None, now: float = 100.0, epoch: int | None = EPOCH) -> str:
    return host_state(facts, current_epoch=epoch, stale_s=STALE_S, now=now)


# -- the rule ----------------------------------------------------------------------------------


def test_fresh_facts_of_the_current_epoch_make_a_candidate() -> None:
    assert state(read()) == "ok"


def test_no_facts_fail_closed() -> None:
    assert state(None) == "no_facts"


def test_facts_older_than_the_window_fail_closed() -> None:
    assert state(read(age_s=STALE_S + 0.01)) == "stale"
    assert state(read(age_s=STALE_S)) == "ok"  # the window is inclusive, like the lease script


def test_the_time_since_the_read_counts() -> None:
    facts = read(age_s=10.0, read_at=100.0)
    assert state(facts, now=104.9) == "ok"
    # Fresh when read, stale now: a read that is not renewed (the store went away) expires.
    assert state(facts, now=105.1) == "stale"


@pytest.mark.parametrize("current", [EPOCH + 1, None])
def test_facts_of_another_epoch_fail_closed(current: int | None) -> None:
    # Written by a deposed monitor (an earlier epoch), or no monitor epoch known at all.
    assert state(read(epoch=EPOCH), epoch=current) == "old_epoch"


def test_an_unreachable_host_is_no_candidate() -> None:
    assert state(read(reachable=False)) == "unreachable"


@pytest.mark.parametrize(
    "facts, epoch, state, reason",
    [
        (read(), EPOCH, "ok", None),
        (None, EPOCH, "no_facts", "no facts from a monitor yet (is one running?)"),
        (read(age_s=STALE_S + 1), EPOCH, "stale", "older than GEMMANET_RESIDENCY_STALE_S"),
        (read(), EPOCH + 1, "old_epoch", "an earlier monitor epoch"),
        (
            HostRead(reachable=False, epoch=EPOCH, age_s=1.0, read_at=100.0, error="refused"),
            EPOCH,
            "unreachable",
            "the monitor's last poll failed: refused",
        ),
    ],
)
def test_the_node_list_says_why_a_host_is_no_candidate(facts, epoch, state, reason) -> None:  # type: ignore[no-untyped-def]
    [info] = cluster_view.host_infos(machine(facts, epoch), 100.0).values()
    assert info["host_state"] == state
    assert info["host_reason"] == reason or (reason and reason in str(info["host_reason"]))


def test_the_node_list_says_when_the_gate_keeps_a_fresh_host_unused() -> None:
    gated = machine(read())
    gated.hosts.placement = "off"
    [info] = cluster_view.host_infos(gated, 100.0).values()
    assert (info["host_state"], info["models"]) == ("ok", [])
    assert "placement on direct hosts is off" in str(info["host_reason"])


# -- the machine -------------------------------------------------------------------------------


def machine(facts: HostRead | None = None, epoch: int | None = EPOCH) -> InstanceMachine:
    # The gate open (core/hosts/gate.py, tested in test_host_gate.py): the facts rule alone.
    hosts = DirectHosts("A", {"box": HostTerms("ollama", max_parallel=2)}, STALE_S, placement="on")
    if facts is not None:
        hosts.facts_read({"box": facts}, epoch)
    return InstanceMachine("A", forward_grace_s=5.0, rng=random.Random(0), hosts=hosts)


def submit(m: InstanceMachine, model: str = "llama3", *, now: float = 100.0, stream=False):  # type: ignore[no-untyped-def]
    assign = Assign(task_id="t1", model=model, prompt="p", stream=stream, timeout_s=30.0)
    return m.submit(assign, deadline=now + 30.0, now=now)


def place(m: InstanceMachine, *, stream: bool = False, now: float = 100.0) -> CallHost:
    effects = submit(m, stream=stream, now=now)
    assert effects == [Reserve("t1", 1)]
    [view] = m.requester.candidates("t1", 1, now) or []
    assert (view.node_id, view.conn_id, view.instance_id) == ("box", "direct:box", "A")
    [call] = [e for e in m.reserved("t1", 1, view, "t1.1", now) if isinstance(e, CallHost)]
    return call


@pytest.mark.parametrize(
    "facts, epoch",
    [
        (None, EPOCH),
        (read(age_s=STALE_S + 1), EPOCH),
        (read(epoch=EPOCH - 1), EPOCH),
        (read(reachable=False), EPOCH),
        (read(models=("mistral",)), EPOCH),
    ],
    ids=["no-facts", "stale", "wrong-epoch", "unreachable", "model-missing"],
)
def test_a_host_that_fails_the_rule_is_not_placed_on(facts, epoch) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(NoNodeForModel):
        submit(machine(facts, epoch))


def test_a_model_the_host_has_but_has_not_loaded_is_placed_on_it() -> None:
    assert submit(machine(read(models=("llama3",), resident={}))) == [Reserve("t1", 1)]
    # And one it has loaded only (as /api/ps lists it).
    assert submit(machine(read(models=(), resident={"llama3": 4.0}))) == [Reserve("t1", 1)]


def test_a_host_is_no_candidate_for_a_model_only_a_node_serves() -> None:
    m = machine(read(models=("llama3",)))
    node = NodeConnection(
        conn_id="c-1",
        node_id="n1",
        models=frozenset({"mistral", "llama3"}),
        max_parallel=1,
        vram_gb=None,
        agent_version="test",
        connected_at=0.0,
        last_seen=100.0,
    )
    m.node_connected(node, 100.0)
    submit(m, model="mistral")
    assert [v.node_id for v in m.requester.candidates("t1", 1, 100.0) or []] == ["n1"]
    m.request_ended("t1", "ok", 100.0)
    submit(m, model="llama3")
    assert sorted(v.node_id for v in m.requester.candidates("t1", 1, 100.0) or []) == [
        "box",
        "n1",
    ]


def test_facts_that_age_past_the_window_after_the_read_stop_placement() -> None:
    m = machine(read(age_s=10.0, read_at=100.0))
    assert m.requester.candidates("nope", 1, 100.0) is None
    submit(m, now=104.0)
    assert [v.node_id for v in m.requester.candidates("t1", 1, 104.0) or []] == ["box"]
    assert m.requester.candidates("t1", 1, 105.5) == []


def test_an_assign_to_a_host_is_a_call_whose_chunks_and_result_reach_the_request() -> None:
    m = machine(read())
    call = place(m, stream=True)
    assert call.host_id == "box" and call.deadline == 130.0 and call.envelope.stream
    assert m.hosts.in_flight("box") == 1
    effects = m.host_answer(BusChunk(task_id="t1", conn_id="direct:box", seq=0, delta="hi"), 101)
    assert effects == [Deliver("t1", ChunkEvent("hi"))]
    # An answer naming another connection is not the host's: dropped.
    assert m.host_answer(BusChunk(task_id="t1", conn_id="c-x", seq=1, delta="no"), 101) == []
    done = BusResult(task_id="t1", node_id="box", conn_id="direct:box", output="hi", chunks=1)
    effects = m.host_answer(done, 102.0)
    assert Deliver("t1", DoneEvent("hi")) in effects
    assert [e.lease for e in effects if isinstance(e, ReleaseLease)] == [("box", "t1.1")]
    assert m.hosts.in_flight("box") == 0
    # The request ends afterwards: nothing left to stop.
    assert not [e for e in m.request_ended("t1", "ok", 103.0) if isinstance(e, StopHostCall)]


def test_a_failing_host_fails_the_task_with_502() -> None:
    m = machine(read())
    place(m)
    failure = TaskFailure(code=TaskErrorCode.BACKEND_ERROR, message="direct host box: boom")
    effects = m.host_answer(
        BusResult(task_id="t1", node_id="box", conn_id="direct:box", failure=failure), 101.0
    )
    [event] = [e.event for e in effects if isinstance(e, Deliver)]
    assert isinstance(event, FailedEvent) and event.error.status == 502
    assert event.error.code == "node_error"


def test_a_client_that_leaves_stops_the_call() -> None:
    m = machine(read())
    place(m)
    effects = m.request_ended("t1", "client_gone", 101.0)
    assert StopHostCall("t1") in effects
    assert any(isinstance(e, ReleaseLease) for e in effects)
    assert m.hosts.in_flight("box") == 0


def test_at_its_deadline_the_task_ends_with_504_and_the_call_is_stopped() -> None:
    m = machine(read())
    place(m)
    assert m.tick(129.0, silence_deadline_s=None) == []
    effects = m.tick(130.5, silence_deadline_s=None)
    [event] = [e.event for e in effects if isinstance(e, Deliver)]
    assert isinstance(event, FailedEvent) and event.error.status == 504
    assert StopHostCall("t1") in effects
    assert any(isinstance(e, ReleaseLease) for e in effects)
