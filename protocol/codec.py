"""Versioned codec: bytes <-> envelopes. Decoding raises ProtocolError and nothing else."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from protocol.conversation import Message, Options
from protocol.envelopes import VERSION, VERSIONS, BusEnvelope, NodeEnvelope, content_problem
from protocol.errors import EnvelopeTooLarge, MalformedEnvelope, UnsupportedVersion

PROTOCOL_VERSION = VERSION
# The one size limit of the wire: an envelope over it is refused before parsing, on a node
# socket and on the instance bus alike. Every other size limit is derived from it.
MAX_ENVELOPE_BYTES = 1024 * 1024
# The WebSocket libraries' own frame limit (Hypercorn's websocket_max_message_size, trio-websocket's
# max_message_size), both sides. A little above the envelope limit so that an oversized envelope
# is refused by the codec with 4002 and a message saying so, not by the transport with 1009.
MAX_FRAME_BYTES = MAX_ENVELOPE_BYTES + 1024
# Room for everything of a task-carrying envelope except its content (prompt or messages, and
# options), in the worst case: the bus.assign (a superset of assign) with three identifiers and
# reply_to (an instance id) of 128 characters each, a 200-character model name whose every
# character is escaped as \u00XX (1,200 bytes), field names and a float. About 2 KiB;
# tests/protocol/test_codec.py checks it.
TASK_FRAMING_BYTES = 4096
# The largest task content (``task_content_bytes``: a prompt in bytes as encoded in an envelope,
# UTF-8, JSON escapes, no quotes; or the encoded messages; plus the encoded options) that fits
# in an assign and a bus.assign. The HTTP API refuses larger prompts with 413 before they are
# placed, so no client input can make an envelope a node (or a peer instance) refuses.
MAX_PROMPT_BYTES = MAX_ENVELOPE_BYTES - TASK_FRAMING_BYTES
# The same bound on what a node answers: a result's output (the whole output, also of a streamed
# task) and so every chunk. The result's other fields, and those of the bus.result an owner
# relays, fit in the same framing. A node refuses to send more (an error instead), since the
# coordinator would close its connection over an oversized envelope.
MAX_OUTPUT_BYTES = MAX_ENVELOPE_BYTES - TASK_FRAMING_BYTES


class _Header(msgspec.Struct):
    v: Any = msgspec.UNSET
    type: Any = msgspec.UNSET


_encoder = msgspec.json.Encoder()
_header_decoder = msgspec.json.Decoder(_Header)
_node_decoder = msgspec.json.Decoder(NodeEnvelope)
_bus_decoder = msgspec.json.Decoder(BusEnvelope)

T = TypeVar("T")


def encode(envelope: msgspec.Struct) -> bytes:
    """Serialise one envelope to JSON bytes."""
    return _encoder.encode(envelope)


def text_bytes(text: str) -> int:
    """How many bytes ``text`` takes inside an envelope: its JSON-encoded UTF-8, no quotes.
    Compare with MAX_PROMPT_BYTES or MAX_OUTPUT_BYTES. Additive: the size of a concatenation is
    the sum of the sizes (JSON escapes one character at a time)."""
    return len(_encoder.encode(text)) - 2


def task_content_bytes(
    prompt: str | None, messages: list[Message] | None, options: Options | None
) -> int:
    """How many bytes a task's content (its prompt or messages, and its options) takes inside
    an assign: compare with MAX_PROMPT_BYTES. The v1 transcript of the same messages is never
    longer than their encoding (each message's JSON framing outweighs its ``role: `` line), so
    a task that fits, fits for a v1 node too."""
    size = text_bytes(prompt) if prompt is not None else 0
    if messages is not None:
        size += len(_encoder.encode(messages))
    if options is not None:
        size += len(_encoder.encode(options))
    return size


def _as_bytes(data: object) -> bytes:
    if isinstance(data, str):
        # surrogatepass: a str with lone surrogates (e.g. from a lax JSON layer) must become a
        # MalformedEnvelope, not a UnicodeEncodeError; msgspec then rejects the invalid UTF-8.
        return data.encode("utf-8", "surrogatepass")
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        # Copy: len() of a memoryview counts items, not bytes, and the size check must be honest.
        return bytes(data)
    raise MalformedEnvelope(f"an envelope is bytes or str, not {type(data).__name__}")


def _decode(data: bytes | str, decoder: msgspec.json.Decoder[T], limit: int) -> T:
    raw = _as_bytes(data)
    if len(raw) > limit:
        raise EnvelopeTooLarge(len(raw), limit)
    try:
        header = _header_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedEnvelope(f"not an envelope: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - decoding must raise ProtocolError only
        raise MalformedEnvelope(f"not an envelope: {exc!r}") from None
    if header.v is msgspec.UNSET:
        raise MalformedEnvelope("envelope has no version field 'v'")
    if type(header.v) is not int or header.v not in VERSIONS:
        raise UnsupportedVersion(header.v, VERSION)
    try:
        envelope = decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedEnvelope(f"invalid envelope: {exc}") from None
    except Exception as exc:  # noqa: BLE001
        raise MalformedEnvelope(f"invalid envelope: {exc!r}") from None
    problem = content_problem(envelope)  # type: ignore[arg-type]
    if problem is not None:
        raise MalformedEnvelope(f"invalid envelope: {problem}")
    return envelope


def decode_node(data: bytes | str, *, limit: int = MAX_ENVELOPE_BYTES) -> NodeEnvelope:
    """Decode one node-protocol envelope."""
    return _decode(data, _node_decoder, limit)


def decode_bus(data: bytes | str, *, limit: int = MAX_ENVELOPE_BYTES) -> BusEnvelope:
    """Decode one instance-bus envelope."""
    return _decode(data, _bus_decoder, limit)
