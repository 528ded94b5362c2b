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
    MAX_MESSAGES,
    MAX_MODEL_NAME_LENGTH,
    MAX_PROMPT_BYTES,
    PROTOCOL_VERSION,
    TASK_FRAMING_BYTES,
    VERSIONS,
    Assign,
    BusAssign,
    BusEnvelope,
    Chunk,
    EnvelopeTooLarge,
    Heartbeat,
    MalformedEnvelope,
    Message,
    NodeEnvelope,
    Options,
    ProtocolError,
    Result,
    TelemetrySample,
    Timings,
    UnsupportedVersion,
    Usage,
    decode_bus,
    decode_node,
    encode,
    encode_sample,
    parse_sample,
    stamped,
    task_content_bytes,
    text_bytes,
    transcript,
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
        "v": 1,  # nothing of v2 in it: any peer reads it
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
        b'{"v":1,"type":"heartbeat","v":3}',
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
    st.integers().filter(lambda v: v not in VERSIONS)
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
    assert f"versions 1 to {PROTOCOL_VERSION}" in message
    assert repr(version)[:30] in message


def test_unknown_version_of_an_unknown_type_is_still_a_version_error() -> None:
    # A newer peer may add envelope types; the version is what the operator must be told about.
    with pytest.raises(UnsupportedVersion, match=r"version 3; this side speaks versions 1 to 2"):
        decode_node(b'{"v":3,"type":"brand_new"}')


def test_a_peer_controlled_version_cannot_flood_the_error_message() -> None:
    with pytest.raises(UnsupportedVersion) as caught:
        decode_node(json.dumps({"v": "x" * 100_000, "type": "heartbeat"}))
    assert len(str(caught.value)) < 200
    assert str(caught.value).endswith(f"versions 1 to {PROTOCOL_VERSION}")


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


# --- protocol v2: conversations, options, usage -----------------------------------------------


def test_a_v2_assign_carries_messages_and_options_in_a_v2_envelope() -> None:
    assign = stamped(
        Assign(
            task_id="t1",
            model="m",
            messages=[
                Message(role="system", content="be brief"),
                Message(role="user", content="hi"),
            ],
            options=Options(max_tokens=5, temperature=0.2, stop=["\n"], seed=7),
        )
    )
    wire = json.loads(encode(assign))
    assert wire["v"] == 2
    assert wire["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    # Options leave out what the client did not set: the server's default applies.
    assert wire["options"] == {"max_tokens": 5, "temperature": 0.2, "stop": ["\n"], "seed": 7}
    assert "prompt" not in wire or wire["prompt"] is None
    assert decode_node(encode(assign)) == assign


def test_a_prompt_only_assign_stays_v1_for_old_nodes() -> None:
    assign = stamped(Assign(task_id="t1", model="m", prompt="hi"))
    wire = json.loads(encode(assign))
    assert wire["v"] == 1
    assert "messages" not in wire and "options" not in wire


@pytest.mark.parametrize(
    "fields",
    [
        {},  # neither
        {"prompt": "x", "messages": [{"role": "user", "content": "x"}]},  # both
    ],
    ids=["neither", "both"],
)
def test_an_assign_carries_exactly_one_of_prompt_and_messages(fields: dict[str, Any]) -> None:
    doc = {"v": 2, "type": "assign", "task_id": "t", "model": "m", **fields}
    with pytest.raises(MalformedEnvelope, match="exactly one"):
        decode_node(json.dumps(doc))


def test_v2_fields_in_a_v1_envelope_are_refused() -> None:
    # A v1 reader would take the prompt and silently drop the options.
    doc = {"v": 1, "type": "assign", "task_id": "t", "model": "m", "prompt": "x",
           "options": {"max_tokens": 3}}  # fmt: skip
    with pytest.raises(MalformedEnvelope, match="v2"):
        decode_node(json.dumps(doc))
    result = {"v": 1, "type": "result", "task_id": "t", "output": "",
              "usage": {"prompt_tokens": 1, "completion_tokens": 2}}  # fmt: skip
    with pytest.raises(MalformedEnvelope, match="v2"):
        decode_node(json.dumps(result))


@pytest.mark.parametrize(
    "options",
    [
        {"max_tokens": -1},
        {"max_tokens": 0},
        {"temperature": 2.5},
        {"top_p": -0.1},
        {"top_k": 0},
        {"stop": ["x"] * 17},
        {"stop": [""]},
        {"stop": ["x" * 201]},
        {"format": "yaml"},
    ],
    ids=repr,
)
def test_options_out_of_range_are_refused(options: dict[str, Any]) -> None:
    doc = {"v": 2, "type": "assign", "task_id": "t", "model": "m", "prompt": "x",
           "options": options}  # fmt: skip
    with pytest.raises(MalformedEnvelope):
        decode_node(json.dumps(doc))


def test_messages_are_bounded_in_number_and_role() -> None:
    def doc(messages: list[dict[str, str]]) -> str:
        return json.dumps({"v": 2, "type": "assign", "task_id": "t", "model": "m",
                           "messages": messages})  # fmt: skip

    decode_node(doc([{"role": "user", "content": "x"}] * MAX_MESSAGES))
    with pytest.raises(MalformedEnvelope):
        decode_node(doc([{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)))
    with pytest.raises(MalformedEnvelope):
        decode_node(doc([{"role": "wizard", "content": "x"}]))
    with pytest.raises(MalformedEnvelope):
        decode_node(doc([]))


def test_a_result_reports_usage_finish_reason_and_timings() -> None:
    result = stamped(
        Result(
            task_id="t",
            output="a b",
            usage=Usage(prompt_tokens=3, completion_tokens=2),
            finish_reason="length",
            timings=Timings(total_s=0.5, ttft_s=0.1),
        )
    )
    assert result.v == 2
    assert decode_node(encode(result)) == result
    assert result.usage.total_tokens == 5  # type: ignore[union-attr]


def test_the_largest_conversation_fits_the_worst_case_task_envelopes() -> None:
    """MAX_PROMPT_BYTES bounds task_content_bytes (messages and options together), so a
    conversation of exactly that size still fits a worst-case bus.assign."""
    ident = "i" * MAX_IDENTIFIER_LENGTH
    model = "x" + "\x01" * (MAX_MODEL_NAME_LENGTH - 1)
    options = Options(max_tokens=100, stop=["\x01" * 200] * 16, json_schema={"type": "object"})
    one = [Message(role="assistant", content="")]
    padding = MAX_PROMPT_BYTES - task_content_bytes(None, one * 2, options)
    messages = [Message(role="assistant", content="p" * padding), one[0]]
    assert task_content_bytes(None, messages, options) == MAX_PROMPT_BYTES
    bus = stamped(
        BusAssign(task_id=ident, node_id=ident, conn_id=ident, model=model, timeout_s=0.1 + 0.2,
                  reply_to=ident, messages=messages, options=options)
    )  # fmt: skip
    assert decode_bus(encode(bus)) == bus
    # ... and its v1 transcript fits a v1 assign's prompt.
    assert text_bytes(transcript(messages)) <= MAX_PROMPT_BYTES
