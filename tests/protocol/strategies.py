"""Hypothesis strategies: valid envelopes (respecting every constraint) and hostile input."""

from __future__ import annotations

import json
import string
from typing import Any

import msgspec
from hypothesis import strategies as st

from protocol import (
    MAX_IDENTIFIER_LENGTH,
    MAX_MESSAGES,
    MAX_MODEL_NAME_LENGTH,
    MAX_MODELS,
    MAX_PARALLEL,
    MAX_STOP_LENGTH,
    MAX_STOP_STRINGS,
    MAX_TIMEOUT_S,
    MAX_TOKENS_LIMIT,
    ROLES,
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
    Message,
    Options,
    Result,
    TaskFailure,
    Timings,
    Usage,
    Welcome,
    stamped,
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
    protocols=st.just(msgspec.UNSET)
    | st.lists(st.integers(min_value=1, max_value=1000), min_size=1, max_size=8),
    backend_down=st.just(msgspec.UNSET) | st.text(min_size=1, max_size=60),
)

# --- v2: what a task carries and reports -------------------------------------------------------

messages = st.lists(
    st.builds(Message, role=st.sampled_from(ROLES), content=texts),
    min_size=1,
    max_size=min(MAX_MESSAGES, 6),
)


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


options = st.builds(
    Options,
    max_tokens=_maybe(st.integers(min_value=1, max_value=MAX_TOKENS_LIMIT)),
    temperature=_maybe(st.floats(min_value=0, max_value=2)),
    top_p=_maybe(st.floats(min_value=0, max_value=1)),
    top_k=_maybe(st.integers(min_value=1, max_value=1_000_000)),
    stop=_maybe(st.lists(st.text(min_size=1, max_size=MAX_STOP_LENGTH), max_size=MAX_STOP_STRINGS)),
    seed=_maybe(st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    presence_penalty=_maybe(st.floats(min_value=-2, max_value=2)),
    frequency_penalty=_maybe(st.floats(min_value=-2, max_value=2)),
    format=_maybe(st.sampled_from(["text", "json"])),
    json_schema=_maybe(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)),
)
usages = st.builds(Usage, prompt_tokens=counts, completion_tokens=counts)
timings = st.builds(
    Timings,
    total_s=st.floats(min_value=0, max_value=86_400),
    ttft_s=_maybe(st.floats(min_value=0, max_value=86_400)),
)
finish_reasons = st.sampled_from(["stop", "length", "content_filter"])
_unset = st.just(msgspec.UNSET)

welcomes = st.builds(
    Welcome,
    v=st.sampled_from([1, 2]),
    instance_id=identifiers,
    conn_id=identifiers,
    heartbeat_interval_s=st.floats(min_value=0, max_value=3600, exclude_min=True),
)
heartbeats = st.builds(
    Heartbeat,
    in_flight=counts,
    resident=st.none() | st.lists(model_names, max_size=4),
    backend_down=st.just(msgspec.UNSET) | st.text(min_size=1, max_size=60),
)
_v1_assigns = st.builds(
    Assign,
    task_id=identifiers,
    model=model_names,
    prompt=texts,
    stream=st.booleans(),
    timeout_s=timeouts,
)
# v2: a conversation or a prompt, with or without options; stamped with the version it needs.
_v2_assigns = st.builds(
    Assign,
    task_id=identifiers,
    model=model_names,
    stream=st.booleans(),
    timeout_s=timeouts,
    messages=messages,
    options=_unset | options,
) | st.builds(Assign, task_id=identifiers, model=model_names, prompt=texts, options=options)
assigns = (_v1_assigns | _v2_assigns).map(stamped)
chunks = st.builds(Chunk, task_id=identifiers, seq=counts, delta=texts)
results = st.builds(
    Result,
    task_id=identifiers,
    output=texts,
    chunks=counts,
    usage=_unset | usages,
    finish_reason=_unset | finish_reasons,
    timings=_unset | timings,
).map(stamped)
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
        options=_unset | options,
    ).map(stamped),
    st.builds(
        BusAssign,
        task_id=identifiers,
        node_id=identifiers,
        conn_id=identifiers,
        model=model_names,
        reply_to=identifiers,
        messages=messages,
        options=_unset | options,
    ).map(stamped),
    st.builds(BusChunk, task_id=identifiers, conn_id=identifiers, seq=counts, delta=texts),
    st.builds(
        BusResult,
        task_id=identifiers,
        node_id=identifiers,
        conn_id=identifiers,
        output=st.none() | texts,
        chunks=counts,
        failure=st.none() | st.builds(TaskFailure, code=codes, message=texts),
        usage=_unset | usages,
        finish_reason=_unset | finish_reasons,
        timings=_unset | timings,
    ).map(stamped),
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
    "failure", "new_instance", "messages", "options", "usage", "finish_reason", "timings",
    "protocols", "backend_down",
]  # fmt: skip

# Objects that look like envelopes (right version, a real tag, real field names) with arbitrary
# values, so the fuzzing reaches field validation instead of stopping at the first byte.
# Plausible values are often valid for some field, so a document is often wrong in one place only.
_plausible = st.sampled_from(
    ["n1", "", " ", "a b", "x" * 129, "m", ["m"], [], [""], 0, 1, -1, 0.5, 3601, 1025, None, True]
)
near_envelopes = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 2]) | json_scalars, "type": st.sampled_from(_TAGS) | json_scalars},
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
