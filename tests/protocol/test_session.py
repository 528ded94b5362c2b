"""NodeSession: who may send what, when; refusals name the culprit and leave no half-states."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    Assign,
    BusCancel,
    Cancel,
    Chunk,
    CloseCode,
    Error,
    Heartbeat,
    Hello,
    LocalProtocolError,
    MalformedEnvelope,
    NodeEnvelope,
    NodeSession,
    ProtocolError,
    Result,
    SessionState,
    UnexpectedEnvelope,
    UnsupportedVersion,
    Welcome,
    encode,
)
from tests.protocol.strategies import node_envelopes

HELLO = Hello(node_id="n1", token="secret-token", models=["gemma3:4b"], max_parallel=2)
WELCOME = Welcome(instance_id="i1", conn_id="c1", heartbeat_interval_s=5.0)
ASSIGN = Assign(task_id="t1", model="gemma3:4b", prompt="hi", stream=True)
CHUNK = Chunk(task_id="t1", seq=0, delta="hi")
RESULT = Result(task_id="t1", output="hi", chunks=1)
CANCEL = Cancel(task_id="t1", reason="client left")
HEARTBEAT = Heartbeat(in_flight=1)
ERROR = Error(task_id="t1", code="backend_failed", message="ollama is down")
ALL = [HELLO, WELCOME, ASSIGN, CHUNK, RESULT, CANCEL, HEARTBEAT, ERROR]


def handshake() -> tuple[NodeSession, NodeSession]:
    node, coordinator = NodeSession("node"), NodeSession("coordinator")
    coordinator.receive(node.send(HELLO))
    node.receive(coordinator.send(WELCOME))
    return node, coordinator


def coordinator_in(state: SessionState) -> NodeSession:
    coordinator = NodeSession("coordinator")
    if state is not SessionState.AWAITING_HELLO:
        coordinator.receive(encode(HELLO))
    if state is SessionState.READY:
        coordinator.send(WELCOME)
    assert coordinator.state is state
    return coordinator


def node_in(state: SessionState) -> NodeSession:
    node = NodeSession("node")
    if state is not SessionState.AWAITING_HELLO:
        node.send(HELLO)
    if state is SessionState.READY:
        node.receive(encode(WELCOME))
    assert node.state is state
    return node


OPEN_STATES = [SessionState.AWAITING_HELLO, SessionState.AWAITING_WELCOME, SessionState.READY]


def test_a_whole_conversation() -> None:
    node, coordinator = handshake()
    assert node.state is coordinator.state is SessionState.READY
    assert coordinator.hello == HELLO and node.welcome == WELCOME
    assert node.receive(coordinator.send(ASSIGN)) == ASSIGN
    assert coordinator.receive(node.send(CHUNK)) == CHUNK
    assert coordinator.receive(node.send(HEARTBEAT)) == HEARTBEAT
    assert node.receive(coordinator.send(HEARTBEAT)) == HEARTBEAT
    assert coordinator.receive(node.send(RESULT)) == RESULT
    assert node.receive(coordinator.send(CANCEL)) == CANCEL
    assert coordinator.receive(node.send(ERROR)) == ERROR
    node.close()
    coordinator.close()
    assert {node.state, coordinator.state} == {SessionState.CLOSED}


def test_the_coordinator_refuses_anything_before_hello() -> None:
    for envelope in ALL:
        if envelope is HELLO:
            continue
        coordinator = NodeSession("coordinator")
        with pytest.raises(UnexpectedEnvelope, match="awaiting_hello") as caught:
            coordinator.receive(encode(envelope))
        assert caught.value.envelope == envelope
        assert caught.value.close_code == CloseCode.PROTOCOL_ERROR
        assert coordinator.state is SessionState.CLOSED


@pytest.mark.parametrize("state", OPEN_STATES)
@pytest.mark.parametrize("envelope", [WELCOME, ASSIGN, CANCEL], ids=lambda e: type(e).__name__)
def test_the_coordinator_never_accepts_coordinator_envelopes(
    state: SessionState, envelope: NodeEnvelope
) -> None:
    coordinator = coordinator_in(state)
    with pytest.raises(UnexpectedEnvelope, match="a node may not send"):
        coordinator.receive(encode(envelope))


@pytest.mark.parametrize("state", OPEN_STATES)
@pytest.mark.parametrize("envelope", [HELLO, CHUNK, RESULT], ids=lambda e: type(e).__name__)
def test_the_node_never_accepts_node_envelopes(state: SessionState, envelope: NodeEnvelope) -> None:
    node = node_in(state)
    with pytest.raises(UnexpectedEnvelope, match="a coordinator may not send"):
        node.receive(encode(envelope))
    assert node.state is SessionState.CLOSED


def test_a_second_hello_is_refused() -> None:
    _, coordinator = handshake()
    with pytest.raises(UnexpectedEnvelope):
        coordinator.receive(encode(HELLO))


def test_no_work_before_welcome() -> None:
    node = node_in(SessionState.AWAITING_WELCOME)
    with pytest.raises(UnexpectedEnvelope):
        node.receive(encode(ASSIGN))
    coordinator = coordinator_in(SessionState.AWAITING_WELCOME)
    with pytest.raises(LocalProtocolError):
        coordinator.send(ASSIGN)
    with pytest.raises(UnexpectedEnvelope):
        coordinator.receive(encode(HEARTBEAT))


def test_the_coordinator_may_explain_a_refusal_before_closing() -> None:
    node, coordinator = NodeSession("node"), NodeSession("coordinator")
    coordinator.receive(node.send(HELLO))
    refusal = Error(code="auth_failed", message="unknown token")
    assert node.receive(coordinator.send(refusal)) == refusal
    assert node.state is SessionState.AWAITING_WELCOME


def test_garbage_closes_the_session_with_a_protocol_error() -> None:
    _, coordinator = handshake()
    with pytest.raises(MalformedEnvelope):
        coordinator.receive(b"\xff")
    assert coordinator.state is SessionState.CLOSED
    with pytest.raises(UnexpectedEnvelope, match="closed"):
        coordinator.receive(encode(HEARTBEAT))


@pytest.mark.parametrize(
    ("role", "state", "envelope"),
    [
        ("node", SessionState.AWAITING_HELLO, HEARTBEAT),
        ("node", SessionState.AWAITING_HELLO, ERROR),  # the first envelope is Hello, always
        ("node", SessionState.AWAITING_WELCOME, HELLO),
        ("node", SessionState.READY, ASSIGN),
        ("node", SessionState.READY, WELCOME),
        ("coordinator", SessionState.AWAITING_HELLO, WELCOME),
        ("coordinator", SessionState.AWAITING_WELCOME, HEARTBEAT),
        ("coordinator", SessionState.READY, HELLO),
        ("coordinator", SessionState.READY, RESULT),
    ],
)
def test_sending_out_of_turn_is_a_local_error_that_changes_nothing(
    role: str, state: SessionState, envelope: NodeEnvelope
) -> None:
    session = node_in(state) if role == "node" else coordinator_in(state)
    with pytest.raises(LocalProtocolError, match=f"a {role} may not send") as caught:
        session.send(envelope)
    # Our own bug must not be mistaken for the peer's (which would blame it with 4002).
    assert not isinstance(caught.value, ProtocolError)
    assert caught.value.close_code == 1011
    assert session.state is state


@pytest.mark.parametrize(
    "envelope",
    [
        Hello(node_id="bad id", token="t", models=["m"]),
        Hello(node_id="n1", token="t", models=[]),
        Hello(node_id="n1", token="t", models=["m"], vram_gb=float("nan")),  # would be null
        Hello(node_id="n1", token="t", models=["m"], vram_gb=float("inf")),
        Hello(node_id="n1", token="t", models=["m"], v=3),
        Hello(node_id="n1", token="t\ud800", models=["m"]),
        Hello(node_id="n1", token="t", models=["m"], agent_version="x" * 2_000_000),
        BusCancel(task_id="t1"),
    ],
    ids=repr,
)
def test_sending_an_envelope_the_peer_would_refuse_is_a_local_error(envelope: Any) -> None:
    node = NodeSession("node")
    with pytest.raises(LocalProtocolError):
        node.send(envelope)
    assert node.state is SessionState.AWAITING_HELLO
    assert node.hello is None


def test_a_closed_session_sends_nothing() -> None:
    node, _ = handshake()
    node.close()
    with pytest.raises(LocalProtocolError, match="closed"):
        node.send(HEARTBEAT)


def test_the_role_is_checked() -> None:
    with pytest.raises(ValueError, match="role"):
        NodeSession("client")  # type: ignore[arg-type]


def test_the_token_stays_out_of_reprs() -> None:
    assert "secret-token" not in repr(HELLO)
    assert "node_id='n1'" in repr(HELLO)


# --- the two tables agree, even with envelopes in flight -----------------------------------------

_ACTIONS = st.lists(
    st.tuples(st.sampled_from(["node_sends", "coordinator_sends", "deliver_to_coordinator",
                               "deliver_to_node"]), node_envelopes),
    max_size=40,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(_ACTIONS)
def test_whatever_one_side_may_send_the_other_accepts_on_arrival(
    actions: list[tuple[str, NodeEnvelope]],
) -> None:
    # The sides run concurrently, so envelopes cross on the wire; the session must never refuse
    # something its peer was allowed to send at the time (a spurious 4002 would drop a healthy
    # node). Sends are taken as proposals: out-of-turn ones are refused locally and skipped.
    node, coordinator = NodeSession("node"), NodeSession("coordinator")
    to_coordinator: deque[bytes] = deque()
    to_node: deque[bytes] = deque()
    for action, envelope in actions:
        if action == "node_sends":
            try:
                to_coordinator.append(node.send(envelope))
            except LocalProtocolError:
                pass
        elif action == "coordinator_sends":
            try:
                to_node.append(coordinator.send(envelope))
            except LocalProtocolError:
                pass
        elif action == "deliver_to_coordinator" and to_coordinator:
            coordinator.receive(to_coordinator.popleft())
        elif action == "deliver_to_node" and to_node:
            node.receive(to_node.popleft())
    assert SessionState.CLOSED not in (node.state, coordinator.state)


@settings(max_examples=100, deadline=None)
@given(node_envelopes)
def test_every_valid_envelope_passes_the_send_check_when_in_turn(envelope: NodeEnvelope) -> None:
    node, coordinator = handshake()
    for session in (node, coordinator):
        try:
            data = session.send(envelope)
        except LocalProtocolError as exc:
            assert "may not send" in str(exc)  # out of turn, never "invalid"
        else:
            assert data == encode(envelope)


# --- version negotiation -----------------------------------------------------------------------


def _negotiate(hello: Hello) -> tuple[NodeSession, NodeSession, Welcome]:
    node, coordinator = NodeSession("node"), NodeSession("coordinator")
    coordinator.receive(node.send(hello))
    welcome = node.receive(coordinator.send(WELCOME))
    assert isinstance(welcome, Welcome)
    return node, coordinator, welcome


def test_a_v1_node_is_welcomed_at_v1() -> None:
    # An old node sends no ``protocols``: the coordinator speaks its version back.
    node, coordinator, welcome = _negotiate(HELLO)
    assert (welcome.v, node.version, coordinator.version) == (1, 1, 1)


def test_a_node_offering_v1_and_v2_is_welcomed_at_v2() -> None:
    hello = msgspec.structs.replace(HELLO, protocols=[1, 2])
    node, coordinator, welcome = _negotiate(hello)
    assert (welcome.v, node.version, coordinator.version) == (2, 2, 2)
    # The hello itself stays v1, so that a v1 coordinator can read it.
    assert json.loads(NodeSession("node").send(hello))["v"] == 1


def test_a_v2_node_reads_a_v1_coordinators_welcome() -> None:
    # A v1 coordinator ignores ``protocols`` and answers with a v1 welcome.
    node = NodeSession("node")
    node.send(msgspec.structs.replace(HELLO, protocols=[1, 2]))
    node.receive(encode(WELCOME))
    assert node.version == 1


def test_a_welcome_at_a_version_the_hello_did_not_offer_is_refused() -> None:
    node = NodeSession("node")
    node.send(HELLO)  # offers v1 only
    with pytest.raises(UnexpectedEnvelope, match="chose protocol v2"):
        node.receive(encode(msgspec.structs.replace(WELCOME, v=2)))
    assert node.state is SessionState.CLOSED


def test_a_hello_with_no_version_in_common_is_refused_with_4002() -> None:
    coordinator = NodeSession("coordinator")
    with pytest.raises(UnsupportedVersion) as caught:
        coordinator.receive(encode(msgspec.structs.replace(HELLO, protocols=[7, 9])))
    assert caught.value.close_code == CloseCode.PROTOCOL_ERROR
    assert coordinator.state is SessionState.CLOSED
