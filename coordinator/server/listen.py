"""The listen address of a command (``--host``, ``--port``), checked before anything starts.

Standard library only: ``gemmanet serve``, ``demo`` and ``telemetry-agent`` check their
address here, in one line, before they load (and log) anything of the server."""

from __future__ import annotations

import socket

from coordinator.errors import SettingsError, StartupRefused

__all__ = ["check_port", "check_port_free"]


def check_port(flag: str, raw: object, *, any_free: bool = False) -> int:
    """``raw`` as a TCP port number 1-65535 (0 too with ``any_free``: the system picks a free
    port, as for ``serve --port 0``); a SettingsError naming ``flag`` otherwise."""
    text = str(raw).strip()
    lowest = 0 if any_free else 1
    if not text.isdigit() or not lowest <= int(text) <= 65535:
        what = "0 (any free port)" if any_free else "1"
        raise SettingsError(f"{flag} {text!r} must be a TCP port number from {what} to 65535")
    return int(text)


def check_port_free(host: str, port: int) -> None:
    """Refuse in one line, before anything starts (and logs), a host that does not resolve or a
    port another process holds. Bound the way Hypercorn binds (SO_REUSEADDR), then released at
    once; losing the port in between is still reported in one line by ``serve``."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except (OSError, OverflowError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise StartupRefused(f"cannot listen on {host}:{port}: {reason}") from None
