"""Field constraints of the envelopes, as reusable ``Annotated`` types and plain constants.

msgspec checks these while decoding, so garbage from a peer is refused as MalformedEnvelope
before any handler sees it. They are public because other code must respect the same limits
where values enter the system (``nodes enroll --node-id``, ``GEMMANET_INSTANCE_ID``, task
timeouts): a value outside them cannot travel in an envelope at all.

msgspec does *not* check constraints when a Struct is constructed or encoded; only decoding
does. ``NodeSession.send`` re-decodes what it sends for that reason.
"""

from __future__ import annotations

import re
from typing import Annotated

from msgspec import Meta

MAX_IDENTIFIER_LENGTH = 128
# \A and \Z rather than ^ and $: msgspec uses re.search, and $ also matches before a trailing
# newline, which would let "node-1\n" through into logs and Redis keys.
IDENTIFIER_PATTERN = r"\A[A-Za-z0-9._:-]+\Z"
MAX_MODELS = 64
MAX_MODEL_NAME_LENGTH = 200
MAX_PARALLEL = 1024
MAX_TOKEN_LENGTH = 512
MAX_ERROR_CODE_LENGTH = 64
MAX_AGENT_VERSION_LENGTH = 128
# A node's one-line account of why its model backend cannot serve (``backend_down``).
MAX_PROBLEM_LENGTH = 512
# Task timeouts and heartbeat intervals beyond an hour are configuration mistakes; the bound
# also keeps inf out of deadline arithmetic.
MAX_TIMEOUT_S = 3600.0
MAX_HEARTBEAT_INTERVAL_S = 3600.0
# Finite upper bound so inf/1e308 never reaches capacity arithmetic; a petabyte is plenty.
MAX_VRAM_GB = 1_000_000.0
# Counters (seq, chunks, in_flight) stay exact in an IEEE double, so any peer language reads
# them unchanged.
MAX_COUNT = 2**53 - 1
# Protocol versions a hello may list.
MAX_PROTOCOLS = 8

Identifier = Annotated[
    str,
    Meta(min_length=1, max_length=MAX_IDENTIFIER_LENGTH, pattern=IDENTIFIER_PATTERN),
]
# A model name only has to contain something visible: names are matched verbatim and their
# spelling belongs to the backends (``gemma3:4b``, ``org/model@rev``), not to us.
ModelName = Annotated[str, Meta(min_length=1, max_length=MAX_MODEL_NAME_LENGTH, pattern=r"\S")]
ModelList = Annotated[list[ModelName], Meta(min_length=1, max_length=MAX_MODELS)]
#: a list of models that may be empty (the models a node has loaded right now)
ResidentModels = Annotated[list[ModelName], Meta(max_length=MAX_MODELS)]
ParallelSlots = Annotated[int, Meta(ge=1, le=MAX_PARALLEL)]
VramGb = Annotated[float, Meta(ge=0, le=MAX_VRAM_GB)]
Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
TimeoutS = Annotated[float, Meta(gt=0, le=MAX_TIMEOUT_S)]
HeartbeatIntervalS = Annotated[float, Meta(gt=0, le=MAX_HEARTBEAT_INTERVAL_S)]
Token = Annotated[str, Meta(min_length=1, max_length=MAX_TOKEN_LENGTH)]
ErrorCode = Annotated[str, Meta(min_length=1, max_length=MAX_ERROR_CODE_LENGTH)]
AgentVersion = Annotated[str, Meta(max_length=MAX_AGENT_VERSION_LENGTH)]
Problem = Annotated[str, Meta(min_length=1, max_length=MAX_PROBLEM_LENGTH)]

_IDENTIFIER_RE = re.compile(IDENTIFIER_PATTERN)


def is_identifier(value: str) -> bool:
    """Whether ``value`` may be a node_id, task_id, conn_id or instance_id on the wire."""
    return len(value) <= MAX_IDENTIFIER_LENGTH and _IDENTIFIER_RE.search(value) is not None
