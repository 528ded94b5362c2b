"""How every long-running command logs: ``GEMMANET_LOG_FORMAT=text|json`` on stderr, through one
root handler that masks secrets.

The shapes of a line (text, or one JSON object per line with the ids of
``runtime/log_context.py``), the handler and its redacting filter are in
``protocol/log_lines/``, shared with the node agent (``gemmanet node`` runs it under this
handler). This installs the handler on the root logger. Hypercorn's error and access loggers
propagate to it. In json mode warnings and uncaught exceptions become log lines too, so every
line of stderr is JSON.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TextIO

from coordinator.errors import SettingsError
from protocol.log_lines import (
    LOG_FORMAT_VARIABLE,
    LOG_FORMATS,
    TEXT_FORMAT,
    JsonFormatter,
    is_root_handler,
    iso_utc,
    json_logging_active,
    parse_log_format,
    quiet_chatty_loggers,
    register_secret,
    root_handler,
)

__all__ = [
    "LOG_FORMATS",
    "LOG_FORMAT_VARIABLE",
    "TEXT_FORMAT",
    "JsonFormatter",
    "configure_logging",
    "iso_utc",
    "json_logging_active",
    "log_format_from_env",
    "register_startup_secrets",
]


def log_format_from_env(env: Mapping[str, str] | None = None) -> str:
    """``text`` (the default, also for an unset or blank variable) or ``json``; anything else
    is a SettingsError with one line saying what is accepted."""
    try:
        return parse_log_format((os.environ if env is None else env).get(LOG_FORMAT_VARIABLE, ""))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def configure_logging(
    *, verbose: bool = False, log_format: str = "text", stream: TextIO | None = None
) -> None:
    """Install the root handler on ``stream`` (default stderr): ``log_format`` (see
    ``log_format_from_env``), DEBUG with ``verbose`` else INFO (httpx's per-request lines only
    with ``verbose``), secrets masked. Calling it again
    replaces its handler (and leaves handlers others installed, such as pytest's, alone)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if is_root_handler(handler):
            root.removeHandler(handler)
    root.addHandler(root_handler(stream or sys.stderr, log_format))
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    quiet_chatty_loggers(verbose=verbose)
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
