"""Schemathesis checks of our own (loaded with SCHEMATHESIS_HOOKS by test_schemathesis.py).

Schemathesis' ``not_a_server_error`` fails every 5xx, but 502/503/504 are documented answers
here (a node failed, none serves the model, a task timed out); what must never happen is a 500
(``internal_error``: our bug)."""

from __future__ import annotations

import sys
from typing import Any

import schemathesis
from hypothesis.internal import lambda_sources

# Request fields that take any JSON (an OpenAI ``tools`` list, a JSON schema in the options,
# ``logit_bias``) are documented as ``{}``, for which hypothesis builds deeply recursive
# strategies, and it describes them eagerly: every description of a ``.map(lambda …)`` parses
# the lambda's source with ``ast.parse``. Deep in that recursion CPython 3.11's ``ast.parse``
# fails with "SystemError: AST constructor recursion depth mismatch", a crash of the tool and
# not an answer of ours. A higher recursion limit alone did not keep it away (it recurred in a
# clean-clone run at 10,000), so lambdas are described by name here, without parsing: the
# descriptions only label strategies, nothing is generated from them.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))


def _lambda_by_name(f: Any) -> str:
    return f"lambda ...: ... ({getattr(f, '__qualname__', '?')})"


lambda_sources.lambda_description = _lambda_by_name


@schemathesis.check
def no_internal_error(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code == 500:
        raise AssertionError(f"500 internal error: {response.text[:300]}")
    return None
