"""Schemathesis checks of our own (loaded with SCHEMATHESIS_HOOKS by test_schemathesis.py).

Schemathesis' ``not_a_server_error`` fails every 5xx, but 502/503/504 are documented answers
here (a node failed, none serves the model, a task timed out); what must never happen is a 500
(``internal_error``: our bug)."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.check
def no_internal_error(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code == 500:
        raise AssertionError(f"500 internal error: {response.text[:300]}")
    return None
