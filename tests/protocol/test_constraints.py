"""Field limits: values just inside are accepted, values just outside are MalformedEnvelope."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol import MalformedEnvelope, decode_bus, decode_node, is_identifier

HELLO: dict[str, Any] = {"v": 1, "type": "hello", "node_id": "n1", "token": "t", "models": ["m"]}
WELCOME: dict[str, Any] = {
    "v": 1,
    "type": "welcome",
    "instance_id": "i1",
    "conn_id": "c1",
    "heartbeat_interval_s": 5,
}
ASSIGN: dict[str, Any] = {"v": 1, "type": "assign", "task_id": "t1", "model": "m", "prompt": "p"}
CHUNK: dict[str, Any] = {"v": 1, "type": "chunk", "task_id": "t1", "seq": 0, "delta": "d"}
RESULT: dict[str, Any] = {"v": 1, "type": "result", "task_id": "t1", "output": "o"}
ERROR: dict[str, Any] = {"v": 1, "type": "error", "code": "boom", "message": "m"}
HEARTBEAT: dict[str, Any] = {"v": 1, "type": "heartbeat"}
BUS_RESULT: dict[str, Any] = {"v": 1, "type": "bus.result", "task_id": "t1", "node_id": "n1"}

BAD_IDS = ["", "x" * 129, "a b", "node\n", "\nnode", "nodé", "a/b", "a\x00b", 7, None]
GOOD_IDS = ["x" * 128, "a", "node-1.eu:gpu_0", "A.b:C-d_9"]


def _with(base: dict[str, Any], **fields: Any) -> str:
    return json.dumps({**base, **fields})


REFUSED = [
    *[_with(HELLO, node_id=bad) for bad in BAD_IDS],
    *[_with(ASSIGN, task_id=bad) for bad in BAD_IDS],
    *[_with(CHUNK, task_id=bad) for bad in BAD_IDS],
    *[_with(WELCOME, conn_id=bad) for bad in BAD_IDS],
    *[_with(WELCOME, instance_id=bad) for bad in BAD_IDS],
    _with(ERROR, task_id=""),
    _with(HELLO, models=[]),
    _with(HELLO, models=["m"] * 65),
    _with(HELLO, models=[""]),
    _with(HELLO, models=["   "]),
    _with(HELLO, models=["x" * 201]),
    _with(HELLO, models="m"),
    _with(HELLO, models=[1]),
    _with(HELLO, max_parallel=0),
    _with(HELLO, max_parallel=1025),
    _with(HELLO, max_parallel=True),
    _with(HELLO, max_parallel=1.5),
    _with(HELLO, vram_gb=-0.001),
    _with(HELLO, vram_gb=1e300),
    _with(HELLO, token=""),
    _with(HELLO, token="t" * 513),
    _with(HELLO, agent_version="v" * 129),
    _with(ASSIGN, timeout_s=0),
    _with(ASSIGN, timeout_s=-1),
    _with(ASSIGN, timeout_s=3600.001),
    _with(ASSIGN, model=""),
    _with(WELCOME, heartbeat_interval_s=0),
    _with(WELCOME, heartbeat_interval_s=-5),
    _with(CHUNK, seq=-1),
    _with(CHUNK, seq=2**53),
    _with(RESULT, chunks=-1),
    _with(HEARTBEAT, in_flight=-1),
    _with(ERROR, code=""),
    _with(ERROR, code="c" * 65),
    _with(ERROR, code=None),
]

ACCEPTED = [
    *[_with(HELLO, node_id=good) for good in GOOD_IDS],
    *[_with(ASSIGN, task_id=good) for good in GOOD_IDS],
    _with(HELLO, models=["m"] * 64),
    _with(HELLO, models=["x" * 200, "gemma3:4b", "org/model@rev", " padded "]),
    _with(HELLO, max_parallel=1),
    _with(HELLO, max_parallel=1024),
    _with(HELLO, vram_gb=0),
    _with(HELLO, vram_gb=None),
    _with(HELLO, vram_gb=80),
    _with(HELLO, token="t" * 512),
    _with(ASSIGN, timeout_s=3600),
    _with(ASSIGN, timeout_s=0.001),
    _with(WELCOME, heartbeat_interval_s=0.01),
    _with(CHUNK, seq=2**53 - 1),
    _with(ERROR, code="c" * 64),
    _with(ERROR, task_id=None),
    _with(ERROR, task_id="t1"),
]


@pytest.mark.parametrize("document", REFUSED)
def test_out_of_range_fields_are_malformed(document: str) -> None:
    with pytest.raises(MalformedEnvelope):
        decode_node(document)


@pytest.mark.parametrize("document", ACCEPTED)
def test_fields_at_the_limits_are_accepted(document: str) -> None:
    decode_node(document)


@pytest.mark.parametrize(
    "document",
    [
        _with(BUS_RESULT, node_id="a b"),
        _with(BUS_RESULT, chunks=-1),
        _with(BUS_RESULT, failure={"code": "", "message": "m"}),
        json.dumps(
            {"v": 1, "type": "bus.replace", "node_id": "n", "conn_id": "c", "new_instance": ""}
        ),
    ],
)
def test_bus_envelopes_are_constrained_too(document: str) -> None:
    with pytest.raises(MalformedEnvelope):
        decode_bus(document)


def test_error_message_names_the_offending_field() -> None:
    with pytest.raises(MalformedEnvelope, match=r"\$\.models\[1\]"):
        decode_node(_with(HELLO, models=["ok", ""]))


@pytest.mark.parametrize("value", GOOD_IDS)
def test_is_identifier_accepts_what_the_wire_accepts(value: str) -> None:
    assert is_identifier(value)


@pytest.mark.parametrize("value", [v for v in BAD_IDS if isinstance(v, str)])
def test_is_identifier_refuses_what_the_wire_refuses(value: str) -> None:
    assert not is_identifier(value)
