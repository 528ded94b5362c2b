"""How the Redis backend recognises and reports failures.

Everything that means "Redis cannot be reached or did not answer" becomes
``CoordinationUnavailable``; the helpers here classify exceptions coming out of coredis and keep
its per-connection tracebacks out of the log (this backend reports those failures itself).
"""

from __future__ import annotations

import logging

import anyio
import trio
from coredis.exceptions import (
    AuthenticationFailureError,
    AuthorizationError,
    RedisError,
    ResponseError,
    WrongTypeError,
)

from coordinator.url_credentials import hide_credentials

__all__ = [
    "FAILURES",
    "KEEPALIVE_FAILURES",
    "acl_hint",
    "caused_by_cancellation",
    "caused_by_timeout",
    "describe",
    "is_failure",
    "misuse",
    "redact_url",
]

#: what "Redis cannot be reached" looks like from below (ssl.SSLError and TimeoutError are OSError)
FAILURES: tuple[type[BaseException], ...] = (
    RedisError,
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)

KEEPALIVE_FAILURES: tuple[type[BaseException], ...] = (trio.TooSlowError, *FAILURES)


def redact_url(url: str) -> str:
    """``url`` without its password or secret query values, for logs and error messages."""
    return hide_credentials(url)


def describe(exc: BaseException) -> str:
    """The message plus its root cause, which coredis wraps ("Unable to establish a connection"
    hides "certificate verify failed" or "Connection refused")."""
    text = str(exc) or type(exc).__name__
    root: BaseException = exc
    seen = {id(exc)}
    while True:
        if isinstance(root, BaseExceptionGroup) and root.exceptions:
            nxt: BaseException | None = root.exceptions[0]
        else:
            nxt = root.__cause__ or root.__context__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        root = nxt
    if root is not exc and str(root) and str(root) not in text:
        text += f" ({type(root).__name__}: {root})"
    return text


def acl_hint(exc: BaseException) -> str:
    """What to check when Redis refused this identity (WRONGPASS) or one of its commands, keys
    or channels (NOPERM), appended to the one-line report."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, AuthenticationFailureError):
            return (
                " (WRONGPASS: check the user name in GEMMANET_REDIS_URL and "
                "GEMMANET_REDIS_PASSWORD_FILE; the ACL user may be disabled or deleted)"
            )
        if isinstance(current, AuthorizationError) or "user executing the script can't" in str(
            current
        ):
            return " (NOPERM: the ACL user lacks this right; see `gemmanet redis-acl`)"
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return ""


def misuse(exc: ResponseError, what: str) -> Exception | None:
    """Errors that are the caller's fault, raised like the memory backend raises them."""
    if isinstance(exc, WrongTypeError):
        return TypeError(f"{what}: the key holds another kind of value ({exc})")
    if "not an integer" in str(exc):
        return ValueError(f"{what}: the value is not an integer ({exc})")
    return None


def caused_by_cancellation(exc: BaseException) -> bool:
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, trio.Cancelled):
            return True
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def caused_by_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` comes of a deadline (a connect or a read that took too long: the server
    may be slow, not down), as opposed to a refused connection, a closed socket or an error
    reply."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, TimeoutError | trio.TooSlowError):
            return True
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


class _QuietConnectionFailures(logging.Filter):
    """coredis logs every failed or lost connection with a traceback, at ERROR for failures in
    its handshake; this backend reports those as CoordinationUnavailable instead, so an outage
    does not flood the log with one traceback per operation."""

    _MESSAGES = frozenset(
        {"Connection attempt failed unexpectedly!", "Connection closed unexpectedly!"}
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self._MESSAGES


logging.getLogger("coredis").addFilter(_QuietConnectionFailures())


def is_failure(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(is_failure(inner) for inner in exc.exceptions)
    return isinstance(exc, FAILURES)
