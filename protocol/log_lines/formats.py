"""The two shapes of a log line (``GEMMANET_LOG_FORMAT=text|json``) and the root handler that
writes them, secrets masked (``redaction.RedactingFilter``).

``json`` writes one JSON object per line::

    {"ts": "2026-12-01T02:41:17.123Z", "level": "info", "logger": "gemmanet.instance",
     "msg": "...", "instance_id": "A", "task_id": "t-…", "node_id": "box-1",
     "request_id": "r-…", "exc": "Traceback (most recent call last): …"}

The ids come from ``ids`` (set where a request, task or node connection is handled) or from a
call's ``extra=``; each appears only where it applies, ``exc`` only with a traceback.

Only the shapes live here; installing the handler on the process's root logger (stderr, the
level, the hooks that turn warnings and uncaught exceptions into log lines) is the caller's:
``coordinator/logging_setup.py`` and, when it runs alone, the node agent's ``logs.py``. Both
build the handler with :func:`root_handler`, so each recognises (and replaces) the other's.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TextIO

from protocol.log_lines.ids import LOG_IDS, current_log_ids
from protocol.log_lines.redaction import RedactingFilter

__all__ = [
    "LOG_FORMATS",
    "LOG_FORMAT_VARIABLE",
    "TEXT_FORMAT",
    "JsonFormatter",
    "is_root_handler",
    "iso_utc",
    "json_logging_active",
    "parse_log_format",
    "root_handler",
]

LOG_FORMAT_VARIABLE = "GEMMANET_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_log_format(raw: str) -> str:
    """``text`` (also for a blank value) or ``json``; anything else is a ValueError whose text
    says, in one line, what is accepted."""
    raw = raw.strip()
    if not raw:
        return "text"
    if raw not in LOG_FORMATS:
        raise ValueError(f"{LOG_FORMAT_VARIABLE}={raw!r} must be 'text' or 'json'")
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
    """Marks the handler ``root_handler`` built, so configuring again replaces it."""


def root_handler(stream: TextIO, log_format: str) -> logging.Handler:
    """The handler of every log line: ``log_format`` (``text`` or ``json``) on ``stream``,
    secrets masked. Writing happens only when the caller installs it and logs."""
    handler = _GemmanetHandler(stream)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    handler.addFilter(RedactingFilter())
    return handler


def is_root_handler(handler: logging.Handler) -> bool:
    """Whether ``handler`` is one ``root_handler`` built (not pytest's, not a library's)."""
    return isinstance(handler, _GemmanetHandler)


def json_logging_active() -> bool:
    """Whether the root logger writes the json format (a refusal is then logged as JSON rather
    than printed)."""
    return any(
        is_root_handler(h) and isinstance(h.formatter, JsonFormatter)
        for h in logging.getLogger().handlers
    )


#: Libraries that log every HTTP request they make at INFO (httpx: ``HTTP Request: GET …``).
#: A monitor polls each host every 2 s and an agent checks its backend every 5 s, so at INFO
#: they would write a line per poll and bury the one line per outage our own loggers write.
CHATTY_LOGGERS = ("httpx", "httpcore", "hpack")


def quiet_chatty_loggers(*, verbose: bool) -> None:
    """Keep the CHATTY_LOGGERS to warnings, unless ``verbose`` (``-v``): then they follow the
    root logger again, requests included."""
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
