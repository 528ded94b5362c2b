"""The help of the ``gemmanet`` command line that is not one command's own: the settings each
command lists under its ``--help`` (generated from coordinator/settings.py), ``-v`` on every
command, the listen address flags, one-line reasons. Standard library only at module level:
``gemmanet --help`` loads nothing else."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

# The GEMMANET_* settings (coordinator/settings.py fields) `monitor` and `audit` read, for their
# --help; `serve` reads them all.
MONITOR_SETTINGS = (
    "redis_url",
    "redis_password_file",
    "redis_ca_file",
    "redis_cert_file",
    "redis_key_file",
    "key_prefix",
    "capacity",
    "monitor_poll_s",
    "monitor_ttl_s",
    "monitor_retry_s",
    "monitor_poll_timeout_s",
    "residency_stale_s",
    "telemetry_interval_s",
    "monitor_unfenced",
    "allow_test_switches",
)
AUDIT_SETTINGS = (
    *MONITOR_SETTINGS[:12],  # Redis, the operator file, the monitor's timing, the stale window
    "alive_ttl_s",
    "host_placement",
)


def one_line(message: str) -> str:
    """A reason as one line: the lines of a library's message (psycopg adds a hint on a line of
    its own) joined with '; '."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


def listen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the HTTP and WebSocket server listens on; 0.0.0.0 for every interface "
        "(default 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        default=8000,
        help="TCP port of the HTTP API and /ws/node, 1-65535 (default 8000)",
    )


def settings_epilog(parser: argparse.ArgumentParser, field_names: Sequence[str] | None) -> None:
    """List under the command's --help the settings it reads, with their defaults, as
    coordinator/settings.py defines them (``field_names``; None: all of them)."""
    from coordinator.settings import variables_help
    from protocol.log_lines import LOG_FORMAT_VARIABLE, LOG_FORMATS

    rows = [*variables_help(field_names), (LOG_FORMAT_VARIABLE, LOG_FORMATS[0])]
    width = max(len(name) for name, _ in rows)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        'settings it reads (default after each; see docs/interface.md, "Settings"):\n'
        + "\n".join(f"  {name:<{width}}  {default}" for name, default in rows)
    )


def verbose_everywhere(parser: argparse.ArgumentParser) -> None:
    """``-v`` after the command too (``gemmanet serve -v``), on every command and action. Its
    default is SUPPRESS so that a command's absent flag leaves ``gemmanet -v``'s in place."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument(
                    "-v",
                    "--verbose",
                    action="store_true",
                    default=argparse.SUPPRESS,
                    help="debug logging, the same as `gemmanet -v …` (default: info)",
                )
                verbose_everywhere(sub)
