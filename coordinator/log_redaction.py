"""Masking secrets in log lines: the safety net under every log call.

The redactor and its filter live in ``protocol/log_lines/redaction.py`` (what is masked, and
why): the node agent registers its token into the same process-wide redactor and must not
import the coordinator. The filter sits on the root handler that ``logging_setup`` installs;
this module is the coordinator's name for them.
"""

from __future__ import annotations

from protocol.log_lines.redaction import (
    MASK,
    MIN_SECRET_LENGTH,
    REDACTOR,
    RedactingFilter,
    Redactor,
    register_secret,
)

__all__ = [
    "MASK",
    "MIN_SECRET_LENGTH",
    "REDACTOR",
    "RedactingFilter",
    "Redactor",
    "register_secret",
]
