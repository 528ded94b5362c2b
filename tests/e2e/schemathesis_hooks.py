"""Schemathesis checks of our own (loaded with SCHEMATHESIS_HOOKS by test_schemathesis.py).

Schemathesis' ``not_a_server_error`` fails every 5xx, but 502/503/504 are documented answers
here (a node failed, none serves the model, a task timed out); what must never happen is a 500
(``internal_error``: our bug)."""

from __future__ import annotations

import sys
from typing import Any

import schemathesis

# Request fields that take any JSON (an OpenAI ``tools`` list, a JSON schema in the options,
# ``logit_bias``) are documented as ``{}``, for which hypothesis builds deeply recursive
# strategies. Describing one of them near CPython's default recursion limit of 1,000 has made
# CPython 3.11's ``ast.parse`` (used by hypothesis to print a lambda) fail with
# "SystemError: AST constructor recursion depth mismatch", a crash of the tool and not an
# answer of ours. A higher limit in the schemathesis process keeps it away from that edge.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))


@schemathesis.check
def no_internal_error(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code == 500:
        raise AssertionError(f"500 internal error: {response.text[:300]}")
    return None
