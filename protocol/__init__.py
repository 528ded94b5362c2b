"""GemmaNet wire protocol, sans-IO.

Envelopes (frozen msgspec Structs, one class per message type) for the node WebSocket protocol
and for the instance bus, their field limits (``constraints``), a versioned codec, the per-
connection state machine ``NodeSession``, the ProtocolError hierarchy, and the codes that travel
on the wire (``codes``: WebSocket close codes, task error codes), and the host telemetry
sample a heartbeat may carry (``telemetry``). Nothing in this
package does I/O or imports an event loop, so the coordinator, the node agent and the simulator
all speak exactly the same bytes.
"""

from protocol.codec import (
    MAX_ENVELOPE_BYTES,
    MAX_FRAME_BYTES,
    MAX_OUTPUT_BYTES,
    MAX_PROMPT_BYTES,
    PROTOCOL_VERSION,
    TASK_FRAMING_BYTES,
    decode_bus,
    decode_node,
    encode,
    text_bytes,
)
from protocol.codes import BUSY_CODES, FINAL_CLOSE_CODES, CloseCode, TaskErrorCode
from protocol.constraints import (
    IDENTIFIER_PATTERN,
    MAX_IDENTIFIER_LENGTH,
    MAX_MODEL_NAME_LENGTH,
    MAX_MODELS,
    MAX_PARALLEL,
    MAX_TIMEOUT_S,
    is_identifier,
)
from protocol.envelopes import (
    Assign,
    BusAccepted,
    BusAssign,
    BusCancel,
    BusChunk,
    BusEnvelope,
    BusNodeGone,
    BusRefused,
    BusReplace,
    BusResult,
    BusWake,
    Cancel,
    Chunk,
    Error,
    Heartbeat,
    Hello,
    NodeEnvelope,
    Result,
    TaskFailure,
    Welcome,
)
from protocol.errors import (
    EnvelopeTooLarge,
    LocalProtocolError,
    MalformedEnvelope,
    ProtocolError,
    UnexpectedEnvelope,
    UnsupportedVersion,
)
from protocol.session import NodeSession, Role, SessionState
from protocol.telemetry import TelemetrySample, encode_sample, parse_sample

__all__ = [
    "BUSY_CODES",
    "FINAL_CLOSE_CODES",
    "IDENTIFIER_PATTERN",
    "MAX_ENVELOPE_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_IDENTIFIER_LENGTH",
    "MAX_MODELS",
    "MAX_MODEL_NAME_LENGTH",
    "MAX_OUTPUT_BYTES",
    "MAX_PARALLEL",
    "MAX_PROMPT_BYTES",
    "MAX_TIMEOUT_S",
    "PROTOCOL_VERSION",
    "TASK_FRAMING_BYTES",
    "Assign",
    "BusAccepted",
    "BusAssign",
    "BusCancel",
    "BusChunk",
    "BusEnvelope",
    "BusNodeGone",
    "BusRefused",
    "BusReplace",
    "BusResult",
    "BusWake",
    "Cancel",
    "Chunk",
    "CloseCode",
    "EnvelopeTooLarge",
    "Error",
    "Heartbeat",
    "Hello",
    "LocalProtocolError",
    "MalformedEnvelope",
    "NodeEnvelope",
    "NodeSession",
    "ProtocolError",
    "Result",
    "Role",
    "SessionState",
    "TaskErrorCode",
    "TaskFailure",
    "TelemetrySample",
    "UnexpectedEnvelope",
    "UnsupportedVersion",
    "Welcome",
    "decode_bus",
    "decode_node",
    "encode",
    "encode_sample",
    "is_identifier",
    "parse_sample",
    "text_bytes",
]
