"""The codes on the wire are the contract: INTERFACE.md fixes 4000-4002, the README documents the
rest. Everything else imports them from ``protocol``, so this is the one place their values are
pinned."""

from __future__ import annotations

from protocol import (
    BUSY_CODES,
    FINAL_CLOSE_CODES,
    CloseCode,
    Error,
    ProtocolError,
    TaskErrorCode,
    decode_node,
    encode,
)


def test_close_codes_keep_their_wire_values() -> None:
    assert {code.name: int(code) for code in CloseCode} == {
        "NORMAL": 1000,
        "GOING_AWAY": 1001,
        "ABNORMAL_CLOSURE": 1006,
        "INTERNAL_ERROR": 1011,
        "TRY_AGAIN_LATER": 1013,
        "REPLACED": 4000,
        "AUTH_FAILED": 4001,
        "PROTOCOL_ERROR": 4002,
        "HEARTBEAT_TIMEOUT": 4003,
        "MOVE": 4004,
    }


def test_an_agent_stops_reconnecting_only_when_replaced_or_refused() -> None:
    assert FINAL_CLOSE_CODES == {4000, 4001}


def test_a_protocol_error_closes_with_4002() -> None:
    assert ProtocolError.close_code == 4002


def test_error_codes_travel_as_plain_strings() -> None:
    for code in TaskErrorCode:
        raw = encode(Error(task_id="t1", code=code, message="m"))
        assert f'"code":"{code.value}"'.encode() in raw
        decoded = decode_node(raw)
        assert isinstance(decoded, Error) and decoded.code == code
        assert type(decoded.code) is str


def test_busy_codes_are_the_ones_that_mean_not_now() -> None:
    # backend_unavailable: the node could not reach its model backend, so the task never ran
    # there; like a full node, it is placed elsewhere or answered 503, not 502.
    assert BUSY_CODES == {"node_busy", "node_draining", "all_nodes_busy", "backend_unavailable"}
    assert TaskErrorCode.BACKEND_ERROR not in BUSY_CODES
    assert TaskErrorCode.NODE_DISCONNECTED not in BUSY_CODES
