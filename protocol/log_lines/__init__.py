"""What a log line of the coordinator and of the node agent carries, and what it must not.

These are pure and shared for one reason: ``gemmanet node`` runs the agent under the
coordinator's log handler, so both must bind the same id variables, register secrets into the
same redactor and recognise the same handler, while the agent must import nothing of the
coordinator (a model host runs it without the server's dependencies). Nothing here writes:
the callers install the handler (``coordinator/logging_setup.py``, ``tools/node_agent/logs.py``).

    ids.py        the ids of a log line (instance, task, node, request), in context variables
    redaction.py  the filter that masks secrets in every log line
    formats.py    text or one JSON object per line (GEMMANET_LOG_FORMAT), the root handler,
                  the HTTP client libraries kept to warnings
"""

from protocol.log_lines.formats import (
    CHATTY_LOGGERS,
    LOG_FORMAT_VARIABLE,
    LOG_FORMATS,
    TEXT_FORMAT,
    JsonFormatter,
    is_root_handler,
    iso_utc,
    json_logging_active,
    parse_log_format,
    quiet_chatty_loggers,
    root_handler,
)
from protocol.log_lines.ids import LOG_IDS, bind_log_ids, current_log_ids
from protocol.log_lines.redaction import (
    MASK,
    MIN_SECRET_LENGTH,
    REDACTOR,
    RedactingFilter,
    Redactor,
    register_secret,
)

__all__ = [
    "CHATTY_LOGGERS",
    "LOG_FORMATS",
    "LOG_FORMAT_VARIABLE",
    "LOG_IDS",
    "MASK",
    "MIN_SECRET_LENGTH",
    "REDACTOR",
    "TEXT_FORMAT",
    "JsonFormatter",
    "RedactingFilter",
    "Redactor",
    "bind_log_ids",
    "current_log_ids",
    "is_root_handler",
    "iso_utc",
    "json_logging_active",
    "parse_log_format",
    "quiet_chatty_loggers",
    "register_secret",
    "root_handler",
]
