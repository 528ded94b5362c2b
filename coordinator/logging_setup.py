"""How every long-running command logs: ``GEMMANET_LOG_FORMAT=text|json`` on stderr, through one
root handler that masks secrets (``log_redaction.RedactingFilter``).

``json`` writes one JSON object per line::

    {"ts": "2026-12-01T02:41:17.123Z", "level": "info", "logger": "gemmanet.instance",
     "msg": "...", "instance_id": "A", "task_id": "t-…", "node_id": "box-1",
     "request_id": "r-…", "exc": "Traceback (most recent call last): …"}

The ids come from ``runtime/log_context.py`` (set where a request, task or node connection is
handled) or from a call's ``extra=``; each appears only where it applies, ``exc`` only with a
traceback. Hypercorn's error and access loggers propagate to the same handler. In json mode
warnings and uncaught exceptions become log lines too, so every line of stderr is JSON.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TextIO

from coordinator.errors import SettingsError
from coordinator.log_redaction import RedactingFilter, register_secret
from coordinator.runtime.log_context import LOG_IDS, current_log_ids

LOG_FORMAT_VARIABLE = "GEMMANET_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_format_from_env(env: Mapping[str, str] | None = None) -> str:
    """``text`` (the default, also for an unset or blank variable) or ``json``; anything else
    is a SettingsError with one line saying what is accepted."""
    raw = (os.environ if env is None else env).get(LOG_FORMAT_VARIABLE, "").strip()
    if not raw:
        return "text"
    if raw not in LOG_FORMATS:
        raise SettingsError(f"{LOG_FORMAT_VARIABLE}={raw!r} must be 'text' or 'json'")
    return raw


def iso_utc(created: float) -> str:
    """A record's time as ISO-8601 UTC with milliseconds: 2026-12-01T02:41:17.123Z."""
    stamp = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a newline inside a value is escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": iso_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(current_log_ids())
        for name in LOG_IDS:  # an explicit extra={...} wins over the context
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = str(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, ensure_ascii=False, default=str)


class _GemmanetHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler this module installed, so configuring again replaces it."""


def json_logging_active() -> bool:
    """Whether ``configure_logging`` installed the json format (a refusal is then logged as
    JSON rather than printed)."""
    return any(
        isinstance(h, _GemmanetHandler) and isinstance(h.formatter, JsonFormatter)
        for h in logging.getLogger().handlers
    )


def configure_logging(
    *, verbose: bool = False, log_format: str = "text", stream: TextIO | None = None
) -> None:
    """Install the root handler on ``stream`` (default stderr): ``log_format`` (see ``log_format_from_env``),
    DEBUG with ``verbose`` else INFO, secrets masked. Calling it again replaces its handler
    (and leaves handlers others installed, such as pytest's, alone)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _GemmanetHandler):
            root.removeHandler(handler)
    handler = _GemmanetHandler(stream or sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    handler.addFilter(RedactingFilter())
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if log_format == "json":
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    logging.getLogger("gemmanet").critical("uncaught exception", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        _log_uncaught(args.exc_type, args.exc_value, args.exc_traceback)


def register_startup_secrets(
    *, database_url: str | None = None, redis_password_file: str | None = None
) -> None:
    """Register the secrets a coordinator starts with, so no log line can show them: the Redis
    password (the file's content) and the database URL's password."""
    if redis_password_file:
        try:
            register_secret(Path(redis_password_file).read_text(encoding="utf-8").strip())
        except (OSError, UnicodeDecodeError):
            pass  # the settings refuse an unreadable file with their own message
    if database_url:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            register_secret(make_url(database_url).password)
        except ArgumentError:
            pass  # the store refuses a malformed URL; the URL pattern masks its credentials
