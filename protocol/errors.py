"""The protocol's error hierarchy.

    ProtocolError            the peer sent something this side refuses (close code 4002)
    ├── MalformedEnvelope    not JSON, not an object, unknown type, wrong field types or limits
    ├── UnsupportedVersion   a version this side does not speak
    ├── EnvelopeTooLarge     over MAX_ENVELOPE_BYTES
    └── UnexpectedEnvelope   a valid envelope the session does not allow now / from that peer

    LocalProtocolError       this side tried to send something the protocol forbids (close 1011)

Decoding never raises anything but ProtocolError, whatever the input. LocalProtocolError is
deliberately *not* a ProtocolError: it is our own bug, and an ``except ProtocolError`` that
closes the socket with 4002 and blames the peer must not swallow it.
"""

from __future__ import annotations

from protocol.codes import CloseCode

# A peer controls the received value; its repr must not blow up a log line or a close reason.
_MAX_REPR = 40


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


class ProtocolError(Exception):
    """The peer sent something this side cannot accept."""

    close_code: int = CloseCode.PROTOCOL_ERROR


class MalformedEnvelope(ProtocolError):
    """Bytes that are not a valid envelope of the expected family."""


class UnsupportedVersion(ProtocolError):
    """A well-formed envelope of a protocol version this side does not speak."""

    def __init__(self, received: object, supported: int) -> None:
        super().__init__(
            f"unsupported protocol version {_short_repr(received)};"
            f" this side speaks versions 1 to {supported}"
        )
        self.received = received
        self.supported = supported


class EnvelopeTooLarge(ProtocolError):
    """An envelope over the size limit, refused before it is parsed."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"envelope of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class UnexpectedEnvelope(ProtocolError):
    """A valid envelope that the peer may not send in the session's current state."""

    def __init__(self, message: str, envelope: object = None) -> None:
        super().__init__(message)
        self.envelope = envelope


class LocalProtocolError(Exception):
    """This side tried to send an envelope the protocol forbids now (or one that is invalid)."""

    close_code: int = CloseCode.INTERNAL_ERROR
