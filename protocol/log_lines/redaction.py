"""Masking secrets in log lines: the safety net under every log call.

``RedactingFilter`` sits on the root handler (``formats.root_handler``), so it sees every
record of every logger (ours, Hypercorn's, coredis's, httpx's...) before it is formatted, at
every level. It masks, in the message, the traceback and the stack:

* the secret values registered at start-up (``register_secret``: the Redis password from
  GEMMANET_REDIS_PASSWORD_FILE, the database password, a node's token, a backend API key);
* anything shaped like one of our API keys (``gn_…``) or node tokens (``gnn_…``): keys are
  created while the service runs, so they cannot all be registered;
* the credentials of any URL (``scheme://user:password@host`` -> ``scheme://user:***@host``);
* ``Bearer``/``Basic`` credentials (an Authorization header in a repr) and ``password=…``-like
  pairs.

Code must still not log secrets; this catches what slips through. One redactor per process,
shared by the coordinator and the node agent: ``gemmanet node`` runs the agent under the
coordinator's handler, whose filter must mask the token the agent registers.
"""

from __future__ import annotations

import logging
import re
import threading

__all__ = [
    "MASK",
    "MIN_SECRET_LENGTH",
    "REDACTOR",
    "RedactingFilter",
    "Redactor",
    "register_secret",
]

MASK = "***"
# Shorter registered values are not masked: masking every "abc" in every line would garble the
# logs while protecting nothing worth the name.
MIN_SECRET_LENGTH = 4

_SECRET_NAMES = r"password|passwd|pwd|secret|token|api_key|apikey"
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # Our API keys and node tokens (coordinator/store/keys/tokens.py): prefix + token_urlsafe(32).
    (re.compile(r"\b(gnn?_)[A-Za-z0-9_-]{16,}"), r"\g<1>" + MASK),
    # URL credentials; a user name alone (a token as the user) is masked whole.
    (re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@\s:]*):[^/?#@\s]*@"), r"\1\2:" + MASK + "@"),
    (re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s:]+@"), r"\1" + MASK + "@"),
    # Authorization header values, whatever shape the header is printed in.
    (re.compile(r"(?i)\b(bearer)(\s+|%20)[^\s'\",;)\]}]+"), r"\1\2" + MASK),
    (re.compile(r"(?i)\b(basic)(\s+|%20)[A-Za-z0-9+/]{8,}=*"), r"\1\2" + MASK),
    # password=…, "token": "…", api_key: … (a name ending in one: redis_password=…)
    (
        re.compile(
            rf"(?i)(?<![a-z])({_SECRET_NAMES})(['\"]?\s*[:=]\s*b?['\"]?)(?!\*\*\*)[^\s'\",;&)\]}}]+"
        ),
        r"\1\2" + MASK,
    ),
]


class Redactor:
    """Masks registered secret values and secret-shaped text. Thread-safe to register into."""

    def __init__(self) -> None:
        self._secrets: tuple[str, ...] = ()
        self._lock = threading.Lock()

    def register(self, secret: str | None) -> None:
        if not secret or len(secret) < MIN_SECRET_LENGTH:
            return
        with self._lock:
            if secret not in self._secrets:
                # Longest first, so a secret containing another is masked whole.
                self._secrets = tuple(sorted({*self._secrets, secret}, key=len, reverse=True))

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text


#: The process's redactor: what ``register_secret`` feeds and the root handler's filter uses.
REDACTOR = Redactor()


def register_secret(secret: str | None) -> None:
    """Mask ``secret`` in every log line from now on (values under 4 characters are ignored)."""
    REDACTOR.register(secret)


_TRACEBACKS = logging.Formatter()


class RedactingFilter(logging.Filter):
    """Rewrites a record so that its message, traceback and stack carry no secret. Never drops a
    record; never raises (a log call must not fail because of its arguments)."""

    def __init__(self, redactor: Redactor = REDACTOR) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        redact = self.redactor.redact
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: keep what can be shown
            message = f"unformattable log message {record.msg!r} with arguments {record.args!r}"
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            # Formatted here so that the formatter uses this masked text (it caches exc_text).
            record.exc_text = _TRACEBACKS.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True
