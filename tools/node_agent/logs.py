"""The agent's log set-up when it runs alone (``python -m tools.node_agent``).

Under ``gemmanet node`` the coordinator's CLI has installed the root handler already
(GEMMANET_LOG_FORMAT, ``-v``) and this does nothing. Alone, the agent installs the same handler
itself: the line shapes, the handler and the redactor are shared in ``protocol/log_lines/``, and
only these few lines of installing it are a copy of ``coordinator/logging_setup.py``'s, since
the agent must not import the coordinator (a model host runs it without the server's
dependencies). In json mode warnings and uncaught exceptions become log lines too, so every
line of stderr is JSON.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from types import TracebackType

from protocol.log_lines import (
    LOG_FORMAT_VARIABLE,
    parse_log_format,
    quiet_chatty_loggers,
    root_handler,
)
from tools.node_agent.settings import UsageError

__all__ = ["configure_logging_once"]


def configure_logging_once() -> None:
    """Install the root handler (GEMMANET_LOG_FORMAT, INFO, on stderr) unless a handler is
    there; a bad GEMMANET_LOG_FORMAT is a UsageError."""
    root = logging.getLogger()
    if root.handlers:
        return
    try:
        log_format = parse_log_format(os.environ.get(LOG_FORMAT_VARIABLE, ""))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    root.addHandler(root_handler(sys.stderr, log_format))
    root.setLevel(logging.INFO)
    quiet_chatty_loggers(verbose=False)
    if log_format == "json":
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    logging.getLogger("gemmanet").critical("uncaught exception", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        _log_uncaught(args.exc_type, args.exc_value, args.exc_traceback)
