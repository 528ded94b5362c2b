"""Per-connection state machine of the node protocol, sans-IO (after h11's ``Connection``).

One ``NodeSession`` per WebSocket, on each side. The shell hands it every frame it receives and
every envelope it wants to send; the session decides whether that is allowed now::

    AWAITING_HELLO --Hello--> AWAITING_WELCOME --Welcome--> READY --close()--> CLOSED

Both roles walk the same states, so one table per direction, keyed by the *local* state, says
what may travel: the node sends Hello and waits for Welcome; the coordinator waits for Hello,
authenticates while in AWAITING_WELCOME, then sends Welcome. Error may travel whenever a peer
needs to explain itself before closing, except as the node's first envelope (that is Hello).

The hello lists the protocol versions the node speaks; the coordinator's session picks the
newest both speak (``version``) and stamps it on the welcome, and the node's session checks the
welcome's version is one it offered. A hello with nothing in common is refused
(``UnsupportedVersion``, close 4002).

Task bookkeeping (which task ids are live, chunk order) stays with the coordinator: after a
Cancel a node may legitimately still deliver a Result, so the session cannot judge that.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Literal

import msgspec

from protocol.codec import MAX_ENVELOPE_BYTES, decode_node, encode
from protocol.envelopes import (
    VERSION,
    VERSIONS,
    Assign,
    Cancel,
    Chunk,
    Error,
    Heartbeat,
    Hello,
    NodeEnvelope,
    Result,
    Welcome,
)
from protocol.errors import (
    LocalProtocolError,
    ProtocolError,
    UnexpectedEnvelope,
    UnsupportedVersion,
)

Role = Literal["coordinator", "node"]


class SessionState(enum.Enum):
    AWAITING_HELLO = "awaiting_hello"
    AWAITING_WELCOME = "awaiting_welcome"
    READY = "ready"
    CLOSED = "closed"


_Allowed = Mapping[SessionState, frozenset[type[msgspec.Struct]]]

# Keyed by the local state of whichever side consults it. Because each table is a superset of
# what the sender may emit in every state the receiver can be in at that moment (the two sides
# are at most one envelope apart), in-flight envelopes are never refused spuriously.
_FROM_NODE: _Allowed = {
    SessionState.AWAITING_HELLO: frozenset({Hello}),
    SessionState.AWAITING_WELCOME: frozenset({Error}),
    SessionState.READY: frozenset({Heartbeat, Chunk, Result, Error}),
}
_FROM_COORDINATOR: _Allowed = {
    # Error before Welcome: "no hello in time" or "authentication failed", then the close.
    SessionState.AWAITING_HELLO: frozenset({Error}),
    SessionState.AWAITING_WELCOME: frozenset({Welcome, Error}),
    SessionState.READY: frozenset({Heartbeat, Assign, Cancel, Error}),
}


def _tag(envelope: object) -> str:
    config = getattr(type(envelope), "__struct_config__", None)
    tag = getattr(config, "tag", None)
    return str(tag) if tag is not None else type(envelope).__name__


class NodeSession:
    """The protocol state of one node connection, seen from ``role``'s side."""

    def __init__(self, role: Role, *, limit: int = MAX_ENVELOPE_BYTES) -> None:
        if role not in ("coordinator", "node"):
            raise ValueError(f"role must be 'coordinator' or 'node', not {role!r}")
        self.role: Role = role
        self.limit = limit
        self.state = SessionState.AWAITING_HELLO
        # Kept because the shell needs them for the whole connection (node_id, models, interval).
        self.hello: Hello | None = None
        self.welcome: Welcome | None = None
        #: the connection's protocol version, once the hello (coordinator) or the welcome
        #: (node) fixed it
        self.version: int | None = None
        self._may_send = _FROM_COORDINATOR if role == "coordinator" else _FROM_NODE
        self._may_receive = _FROM_NODE if role == "coordinator" else _FROM_COORDINATOR

    @property
    def peer_role(self) -> Role:
        return "node" if self.role == "coordinator" else "coordinator"

    def receive(self, data: bytes | str) -> NodeEnvelope:
        """Decode one frame from the peer and advance the state.

        Raises ProtocolError (and nothing else); the session is then CLOSED, because the only
        sane reaction is closing the socket with ``exc.close_code``.
        """
        if self.state is SessionState.CLOSED:
            raise UnexpectedEnvelope(f"{self.role} session is closed; nothing may arrive")
        try:
            envelope = decode_node(data, limit=self.limit)
            if type(envelope) not in self._may_receive[self.state]:
                raise UnexpectedEnvelope(
                    f"a {self.peer_role} may not send {_tag(envelope)!r} while the"
                    f" {self.role} session is {self.state.value}",
                    envelope,
                )
            if isinstance(envelope, Hello):
                self.version = _common_version(envelope)
            elif isinstance(envelope, Welcome):
                self._check_welcome_version(envelope)
        except ProtocolError:
            self.state = SessionState.CLOSED
            raise
        if isinstance(envelope, Hello):
            self.hello = envelope
            self.state = SessionState.AWAITING_WELCOME
        elif isinstance(envelope, Welcome):
            self.welcome = envelope
            self.version = envelope.v
            self.state = SessionState.READY
        return envelope

    def _check_welcome_version(self, welcome: Welcome) -> None:
        offered = self.hello.speaks() if self.hello is not None else frozenset({welcome.v})
        if welcome.v not in offered:
            raise UnexpectedEnvelope(
                f"the coordinator chose protocol v{welcome.v}; the hello offered {sorted(offered)}",
                welcome,
            )

    def send(self, envelope: NodeEnvelope) -> bytes:
        """Check that this side may send ``envelope`` now, encode it and advance the state.

        Raises LocalProtocolError, leaving the state untouched (nothing went out), when the
        envelope is not allowed now or would be refused by the peer's decoder.
        """
        if self.state is SessionState.CLOSED:
            raise LocalProtocolError(f"{self.role} session is closed; nothing may be sent")
        if type(envelope) not in self._may_send[self.state]:
            raise LocalProtocolError(
                f"a {self.role} may not send {_tag(envelope)!r} while its session is"
                f" {self.state.value}"
            )
        if isinstance(envelope, Hello) and not envelope.speaks() & frozenset(VERSIONS):
            raise LocalProtocolError(
                f"a hello offering protocols {sorted(envelope.speaks())} offers none this side"
                f" speaks ({list(VERSIONS)})"
            )
        if isinstance(envelope, Welcome) and self.version is not None:
            # The welcome says which version the connection speaks from now on.
            envelope = msgspec.structs.replace(envelope, v=self.version)
        data = self._encode_checked(envelope)
        if isinstance(envelope, Hello):
            self.hello = envelope
            self.state = SessionState.AWAITING_WELCOME
        elif isinstance(envelope, Welcome):
            self.welcome = envelope
            self.state = SessionState.READY
        return data

    def close(self) -> None:
        """Mark the connection gone; further send/receive calls are errors."""
        self.state = SessionState.CLOSED

    def _encode_checked(self, envelope: NodeEnvelope) -> bytes:
        # msgspec validates constraints only when decoding, so an out-of-range field (an id with
        # a space, timeout_s=0) would otherwise surface as the *peer* closing us with 4002.
        # Decoding our own bytes catches it here, as our bug; comparing the result also catches
        # lossy encodings (msgspec writes NaN and inf as null, so vram_gb=nan would arrive as None).
        try:
            data = encode(envelope)
            if decode_node(data, limit=self.limit) != envelope:
                raise LocalProtocolError(
                    f"{_tag(envelope)!r} would not arrive as sent (a NaN or inf float?)"
                )
        except ProtocolError as exc:
            raise LocalProtocolError(
                f"refusing to send an invalid {_tag(envelope)!r}: {exc}"
            ) from exc
        except (msgspec.EncodeError, TypeError, ValueError) as exc:
            # e.g. a str with lone surrogates, or a field of a type msgspec cannot encode.
            raise LocalProtocolError(f"cannot encode {_tag(envelope)!r}: {exc}") from exc
        return data


def _common_version(hello: Hello) -> int:
    common = hello.speaks() & frozenset(VERSIONS)
    if not common:
        raise UnsupportedVersion(sorted(hello.speaks()), VERSION)
    return max(common)
