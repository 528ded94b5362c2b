"""The codec: valid envelopes round-trip, anything else is a ProtocolError and only that."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    MAX_ENVELOPE_BYTES,
    MAX_FRAME_BYTES,
    MAX_IDENTIFIER_LENGTH,
    MAX_MODEL_NAME_LENGTH,
    MAX_PROMPT_BYTES,
    PROTOCOL_VERSION,
    TASK_FRAMING_BYTES,
    Assign,
    BusAssign,
    BusEnvelope,
    Chunk,
    EnvelopeTooLarge,
    Heartbeat,
    MalformedEnvelope,
    NodeEnvelope,
    ProtocolError,
    TelemetrySample,
    UnsupportedVersion,
    decode_bus,
    decode_node,
    encode,
    encode_sample,
    parse_sample,
    text_bytes,
)
from tests.protocol.strategies import (
    bus_envelopes,
    dumps,
    hostile_text,
    json_values,
    near_envelopes,
    node_envelopes,
    strict_json_values,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=150, deadline=None)
DECODERS = [decode_node, decode_bus]


def decodes_or_refuses(data: Any) -> None:
    """Decode with both families; anything but success or a ProtocolError fails the test."""
    for decode in DECODERS:
        try:
            decode(data)
        except ProtocolError:
            pass


# --- round trips -------------------------------------------------------------------------------


@ROUND_TRIP
@given(node_envelopes)
def test_node_envelopes_round_trip_as_bytes_and_text(envelope: NodeEnvelope) -> None:
    data = encode(envelope)
    assert decode_node(data) == envelope
    assert decode_node(data.decode()) == envelope


@ROUND_TRIP
@given(bus_envelopes)
def test_bus_envelopes_round_trip_as_bytes_and_text(envelope: BusEnvelope) -> None:
    data = encode(envelope)
    assert decode_bus(data) == envelope
    assert decode_bus(data.decode()) == envelope


def test_encoded_envelopes_carry_type_and_version() -> None:
    assert json.loads(encode(Heartbeat(in_flight=2))) == {
        "type": "heartbeat",
        "v": PROTOCOL_VERSION,
        "in_flight": 2,
        "resident": None,  # a node that does not say which models it has loaded
    }


# --- the heartbeat's optional telemetry field (protocol/telemetry.py) ---------------------------


def test_a_heartbeat_carries_a_telemetry_sample() -> None:
    sample = TelemetrySample(at=1700000000.25, cpu_busy=0.5, vram_total_gb=16.0)
    beat = Heartbeat(in_flight=1, telemetry=msgspec.Raw(encode_sample(sample)))
    decoded = decode_node(encode(beat))
    assert decoded == beat
    assert isinstance(decoded, Heartbeat) and not isinstance(decoded.telemetry, msgspec.UnsetType)
    assert parse_sample(decoded.telemetry) == sample


def test_without_telemetry_a_heartbeat_is_what_old_peers_send() -> None:
    # Not sent at all when unset: an old coordinator sees the heartbeat it always saw, and an
    # old agent's heartbeat (no field) decodes as "no telemetry".
    assert b"telemetry" not in encode(Heartbeat(in_flight=3))
    old = decode_node(b'{"type": "heartbeat", "v": 1, "in_flight": 3, "resident": null}')
    assert isinstance(old, Heartbeat) and old.telemetry is msgspec.UNSET


@pytest.mark.parametrize(
    "junk", [b'"junk"', b"[1, 2]", b'{"at": 1, "cpu_busy": 1e308}', b"null", b"123"]
)
def test_junk_telemetry_does_not_fail_the_heartbeat(junk: bytes) -> None:
    # The envelope stays valid (the heartbeat counts); the coordinator drops the sample.
    data = b'{"type": "heartbeat", "v": 1, "in_flight": 0, "telemetry": ' + junk + b"}"
    beat = decode_node(data)
    assert isinstance(beat, Heartbeat) and not isinstance(beat.telemetry, msgspec.UnsetType)
    assert parse_sample(beat.telemetry) is None


@ROUND_TRIP
@given(node_envelopes | bus_envelopes, st.dictionaries(st.text(), strict_json_values, max_size=4))
def test_unknown_extra_fields_are_ignored(
    envelope: NodeEnvelope | BusEnvelope, extra: dict[str, Any]
) -> None:
    document = msgspec.to_builtins(envelope)
    document.update({f"x-{key}": value for key, value in extra.items()})
    decode = decode_bus if type(envelope).__name__.startswith("Bus") else decode_node
    assert decode(dumps(document)) == envelope


# --- hostile input -----------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_protocol_error_only(data: bytes) -> None:
    decodes_or_refuses(data)


@FUZZ
@given(hostile_text)
def test_arbitrary_text_including_lone_surrogates_raises_protocol_error_only(text: str) -> None:
    decodes_or_refuses(text)


@FUZZ
@given(json_values)
def test_arbitrary_json_values_raise_protocol_error_only(value: Any) -> None:
    decodes_or_refuses(dumps(value))
    decodes_or_refuses(dumps(value).encode("utf-8", "surrogatepass"))


@FUZZ
@given(near_envelopes)
def test_envelope_lookalikes_with_garbage_fields_raise_protocol_error_only(
    document: dict[str, Any],
) -> None:
    decodes_or_refuses(dumps(document).encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe\x00",
        b'{"v":1,"type":"chunk","task_id":"t","seq":0,"delta":"\xed\xa0\x80"}',  # surrogate
        '{"v":1,"type":"chunk","task_id":"t","seq":0,"delta":"\ud800"}',
        '{"v":1,"type":"chunk","task_id":"t","seq":0,"delta":"\\ud800"}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"v":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"v":1,"type":"heartbeat","x":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001,
        b'{"v":1,"type":"heartbeat","in_flight":1e400}',
        b'{"v":1,"type":"heartbeat","in_flight":123456789012345678901234567890}',
        b'{"v":1,"type":"assign","task_id":"t","model":"m","prompt":"p","timeout_s":NaN}',
        b'{"v":1,"type":"assign","task_id":"t","model":"m","prompt":"p","timeout_s":Infinity}',
        b'{"v":1,"type":"assign","task_id":"t","model":"m","prompt":"p","timeout_s":1e400}',
        b'{"v":1,"type":"heartbeat"} trailing',
        b'{"v":1,"type":"heartbeat","v":2}',
        b'{"v":1,"type":"nope"}',
        b'{"v":1}',
        b'{"type":"heartbeat"}',
        b"null",
        b"1",
        b'"hello"',
        bytearray(b'{"v":1,"type":"nope"}'),
        memoryview(b"\x00" * 10),
        None,
        12,
        ["not", "bytes"],
    ],
    # the same id in every process (pytest-xdist workers compare their collections)
    ids=lambda data: f"memoryview({bytes(data)!r})" if isinstance(data, memoryview) else repr(data),
)
def test_hostile_input_raises_protocol_error_only(data: Any) -> None:
    for decode in DECODERS:
        with pytest.raises(ProtocolError):
            decode(data)


def test_missing_version_is_malformed() -> None:
    with pytest.raises(MalformedEnvelope, match="version"):
        decode_node(b'{"type":"heartbeat"}')


# --- versions ----------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.integers().filter(lambda v: v != PROTOCOL_VERSION)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.booleans()
    | st.none(),
    st.sampled_from(DECODERS),
)
def test_unknown_version_names_received_and_supported_versions(version: Any, decode: Any) -> None:
    with pytest.raises(UnsupportedVersion) as caught:
        decode(json.dumps({"v": version, "type": "heartbeat"}))
    assert caught.value.received == version
    assert caught.value.supported == PROTOCOL_VERSION
    message = str(caught.value)
    assert f"version {PROTOCOL_VERSION}" in message
    assert repr(version)[:30] in message


def test_unknown_version_of_an_unknown_type_is_still_a_version_error() -> None:
    # A newer peer may add envelope types; the version is what the operator must be told about.
    with pytest.raises(UnsupportedVersion, match=r"version 2; this side speaks version 1"):
        decode_node(b'{"v":2,"type":"brand_new"}')


def test_a_peer_controlled_version_cannot_flood_the_error_message() -> None:
    with pytest.raises(UnsupportedVersion) as caught:
        decode_node(json.dumps({"v": "x" * 100_000, "type": "heartbeat"}))
    assert len(str(caught.value)) < 200
    assert str(caught.value).endswith(f"version {PROTOCOL_VERSION}")


# --- size limit --------------------------------------------------------------------------------


def _chunk_of_size(size: int) -> bytes:
    """A valid Chunk envelope of exactly ``size`` bytes."""
    frame = encode(Chunk(task_id="t", seq=0, delta=""))
    data = encode(Chunk(task_id="t", seq=0, delta="x" * (size - len(frame))))
    assert len(data) == size
    return data


@pytest.mark.parametrize("limit", [64, 1000, MAX_ENVELOPE_BYTES])
def test_an_envelope_of_exactly_the_limit_is_accepted(limit: int) -> None:
    data = _chunk_of_size(limit)
    assert isinstance(decode_node(data, limit=limit), Chunk)
    assert isinstance(decode_node(data.decode(), limit=limit), Chunk)


@pytest.mark.parametrize("limit", [64, 1000, MAX_ENVELOPE_BYTES])
def test_one_byte_over_the_limit_is_refused(limit: int) -> None:
    with pytest.raises(EnvelopeTooLarge) as caught:
        decode_node(_chunk_of_size(limit + 1), limit=limit)
    assert (caught.value.size, caught.value.limit) == (limit + 1, limit)


def test_the_limit_is_enforced_before_parsing() -> None:
    # Garbage would be MalformedEnvelope if it were parsed at all.
    for decode in DECODERS:
        with pytest.raises(EnvelopeTooLarge):
            decode(b"\xff" * (MAX_ENVELOPE_BYTES + 1))


def test_the_limit_counts_utf8_bytes_not_characters() -> None:
    text = _chunk_of_size(100).decode().replace("xx", "é", 1)  # 99 chars, still 100 bytes
    assert len(text) == 99
    assert isinstance(decode_node(text, limit=100), Chunk)
    with pytest.raises(EnvelopeTooLarge):
        decode_node(text.replace("x", "é", 1), limit=100)


# --- families ----------------------------------------------------------------------------------


@ROUND_TRIP
@given(bus_envelopes)
def test_a_bus_envelope_is_not_a_node_envelope(envelope: BusEnvelope) -> None:
    with pytest.raises(MalformedEnvelope):
        decode_node(encode(envelope))


@ROUND_TRIP
@given(node_envelopes)
def test_a_node_envelope_is_not_a_bus_envelope(envelope: NodeEnvelope) -> None:
    with pytest.raises(MalformedEnvelope):
        decode_bus(encode(envelope))


def test_largest_prompt_fits_the_worst_case_task_envelopes() -> None:
    """MAX_PROMPT_BYTES is derived, not guessed: with every other field at its largest (ids of
    128 characters, a model name of 200 characters each escaped as \\u00XX, the longest float),
    an assign and a bus.assign carrying a prompt of exactly MAX_PROMPT_BYTES still decode."""
    ident = "i" * MAX_IDENTIFIER_LENGTH
    model = "x" + "\x01" * (MAX_MODEL_NAME_LENGTH - 1)
    prompt = "p" * MAX_PROMPT_BYTES
    timeout = 0.1 + 0.2  # 0.30000000000000004: a float with the longest repr in range
    bus = BusAssign(
        task_id=ident, node_id=ident, conn_id=ident, model=model, prompt=prompt,
        stream=False, timeout_s=timeout, reply_to=ident,
    )  # fmt: skip
    node = Assign(task_id=ident, model=model, prompt=prompt, stream=True, timeout_s=timeout)
    assert decode_bus(encode(bus)) == bus
    assert decode_node(encode(node)) == node
    framing = len(encode(bus)) - MAX_PROMPT_BYTES
    assert framing <= TASK_FRAMING_BYTES
    assert MAX_ENVELOPE_BYTES - MAX_PROMPT_BYTES == TASK_FRAMING_BYTES
    assert MAX_FRAME_BYTES > MAX_ENVELOPE_BYTES


def test_text_bytes_counts_the_encoded_prompt() -> None:
    assert text_bytes("abc") == 3
    assert text_bytes("é") == 2
    assert text_bytes('"\n\x01') == 2 + 2 + 6
