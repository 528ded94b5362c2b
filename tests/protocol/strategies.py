"""Hypothesis strategies: valid envelopes (respecting every constraint) and hostile input."""

from __future__ import annotations

import json
import string
from typing import Any

from hypothesis import strategies as st

from protocol import (
    MAX_IDENTIFIER_LENGTH,
    MAX_MODEL_NAME_LENGTH,
    MAX_MODELS,
    MAX_PARALLEL,
    MAX_TIMEOUT_S,
    Assign,
    BusAssign,
    BusCancel,
    BusChunk,
    BusNodeGone,
    BusReplace,
    BusResult,
    BusWake,
    Cancel,
    Chunk,
    Error,
    Heartbeat,
    Hello,
    Result,
    TaskFailure,
    Welcome,
)
from protocol.constraints import MAX_COUNT, MAX_VRAM_GB

identifiers = st.text(
    alphabet=string.ascii_letters + string.digits + "._:-",
    min_size=1,
    max_size=MAX_IDENTIFIER_LENGTH,
)
model_names = st.text(min_size=1, max_size=MAX_MODEL_NAME_LENGTH).filter(lambda s: not s.isspace())
tokens = st.text(min_size=1, max_size=512)
codes = st.text(min_size=1, max_size=64)
counts = st.integers(min_value=0, max_value=MAX_COUNT)
timeouts = st.floats(min_value=0, max_value=MAX_TIMEOUT_S, exclude_min=True)
# Short texts keep the suite fast; size limits are tested separately.
texts = st.text(max_size=50)

hellos = st.builds(
    Hello,
    node_id=identifiers,
    token=tokens,
    models=st.lists(model_names, min_size=1, max_size=MAX_MODELS),
    max_parallel=st.integers(min_value=1, max_value=MAX_PARALLEL),
    vram_gb=st.none() | st.floats(min_value=0, max_value=MAX_VRAM_GB),
    agent_version=st.text(max_size=128),
)
welcomes = st.builds(
    Welcome,
    instance_id=identifiers,
    conn_id=identifiers,
    heartbeat_interval_s=st.floats(min_value=0, max_value=3600, exclude_min=True),
)
heartbeats = st.builds(
    Heartbeat, in_flight=counts, resident=st.none() | st.lists(model_names, max_size=4)
)
assigns = st.builds(
    Assign,
    task_id=identifiers,
    model=model_names,
    prompt=texts,
    stream=st.booleans(),
    timeout_s=timeouts,
)
chunks = st.builds(Chunk, task_id=identifiers, seq=counts, delta=texts)
results = st.builds(Result, task_id=identifiers, output=texts, chunks=counts)
errors = st.builds(Error, task_id=st.none() | identifiers, code=codes, message=texts)
cancels = st.builds(Cancel, task_id=identifiers, reason=texts)

node_envelopes = st.one_of(hellos, welcomes, heartbeats, assigns, chunks, results, errors, cancels)

bus_envelopes = st.one_of(
    st.builds(
        BusAssign,
        task_id=identifiers,
        node_id=identifiers,
        conn_id=identifiers,
        model=model_names,
        prompt=texts,
        stream=st.booleans(),
        timeout_s=timeouts,
        reply_to=identifiers,
    ),
    st.builds(BusChunk, task_id=identifiers, conn_id=identifiers, seq=counts, delta=texts),
    st.builds(
        BusResult,
        task_id=identifiers,
        node_id=identifiers,
        conn_id=identifiers,
        output=st.none() | texts,
        chunks=counts,
        failure=st.none() | st.builds(TaskFailure, code=codes, message=texts),
    ),
    st.builds(
        BusNodeGone, task_id=identifiers, node_id=identifiers, conn_id=identifiers, reason=texts
    ),
    st.builds(BusReplace, node_id=identifiers, conn_id=identifiers, new_instance=identifiers),
    st.builds(BusCancel, task_id=identifiers, reason=texts),
    st.builds(BusWake, model=model_names),
)

# --- hostile input -----------------------------------------------------------------------------

# Text including lone surrogates, which cannot even be encoded as strict UTF-8.
hostile_text = st.text(
    st.characters(codec=None, exclude_categories=())
    | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=())
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: far beyond int64
    | st.floats()  # json.dumps writes NaN / Infinity, which is not JSON
    | st.text()
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)

_TAGS = [
    "hello", "welcome", "heartbeat", "assign", "chunk", "result", "error", "cancel",
    "bus.assign", "bus.chunk", "bus.result", "bus.node_gone", "bus.replace", "bus.cancel",
    "bus.wake",
]  # fmt: skip
_FIELDS = [
    "node_id", "token", "models", "max_parallel", "vram_gb", "agent_version", "instance_id",
    "conn_id", "heartbeat_interval_s", "in_flight", "task_id", "model", "prompt", "stream",
    "timeout_s", "seq", "delta", "output", "chunks", "code", "message", "reason", "reply_to",
    "failure", "new_instance",
]  # fmt: skip

# Objects that look like envelopes (right version, a real tag, real field names) with arbitrary
# values, so the fuzzing reaches field validation instead of stopping at the first byte.
# Plausible values are often valid for some field, so a document is often wrong in one place only.
_plausible = st.sampled_from(
    ["n1", "", " ", "a b", "x" * 129, "m", ["m"], [], [""], 0, 1, -1, 0.5, 3601, 1025, None, True]
)
near_envelopes = st.fixed_dictionaries(
    {"v": st.just(1) | json_scalars, "type": st.sampled_from(_TAGS) | json_scalars},
    optional={
        name: _plausible | json_scalars | st.lists(json_scalars, max_size=3) for name in _FIELDS
    },
)


# Strictly valid JSON (no NaN/Infinity), for places where the document itself must parse.
strict_json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


def dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)
