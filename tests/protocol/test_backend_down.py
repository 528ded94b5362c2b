"""``backend_down``: a node's word that its model backend cannot serve, in its hello and its
heartbeats. A v1 field extension (like ``protocols`` and ``telemetry``): absent unless set, so
an old coordinator reads the envelopes it always read and ignores the field, and an old node's
envelopes decode as "the backend answers"."""

from __future__ import annotations

import msgspec
import pytest

from protocol import (
    Heartbeat,
    Hello,
    MalformedEnvelope,
    NodeSession,
    decode_node,
    encode,
    lowest_version,
    stamped,
)
from protocol.constraints import MAX_PROBLEM_LENGTH, ModelList

WHY = "ollama: GET http://127.0.0.1:11434/api/tags: cannot connect"


def hello(**fields: object) -> Hello:
    return Hello(node_id="n1", token="secret", models=["m"], protocols=[1, 2], **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("envelope", [hello(backend_down=WHY), Heartbeat(backend_down=WHY)])
def test_it_travels_in_v1_hellos_and_heartbeats(envelope: Hello | Heartbeat) -> None:
    assert lowest_version(envelope) == 1 and stamped(envelope).v == 1
    decoded = decode_node(encode(envelope))
    assert decoded == envelope and decoded.backend_down == WHY


def test_absent_it_is_not_sent_and_an_old_node_says_nothing_of_it() -> None:
    assert b"backend_down" not in encode(hello()) and b"backend_down" not in encode(Heartbeat())
    old = decode_node(b'{"type": "heartbeat", "v": 1, "in_flight": 0, "resident": null}')
    assert isinstance(old, Heartbeat) and old.backend_down is msgspec.UNSET


class _OldHello(msgspec.Struct, tag="hello", tag_field="type", kw_only=True):
    """The hello as a coordinator that predates the field reads it."""

    v: int
    node_id: str
    token: str
    models: ModelList


def test_an_old_coordinator_reads_the_hello_and_its_models() -> None:
    old = msgspec.json.decode(encode(hello(backend_down=WHY)), type=_OldHello)
    assert (old.v, old.node_id, old.models) == (1, "n1", ["m"])


@pytest.mark.parametrize("bad", ["", "x" * (MAX_PROBLEM_LENGTH + 1), 5, None])
def test_it_is_one_bounded_line_of_text(bad: object) -> None:
    data = msgspec.json.encode({"type": "heartbeat", "v": 1, "backend_down": bad})
    with pytest.raises(MalformedEnvelope):
        decode_node(data)
    assert decode_node(msgspec.json.encode({"type": "heartbeat", "v": 1, "backend_down": "x"}))


def test_the_sessions_let_it_through_and_the_token_stays_out_of_reprs() -> None:
    node, coordinator = NodeSession("node"), NodeSession("coordinator")
    received = coordinator.receive(node.send(hello(backend_down=WHY)))
    assert isinstance(received, Hello) and received.backend_down == WHY
    assert "secret" not in repr(received) and WHY in repr(received)
