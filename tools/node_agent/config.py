"""What a node agent is told (``AgentConfig``), when and how it stops for good
(``final_exit``, ``AgentExit`` and its exit codes), and how long it waits between connection
attempts (``backoff_delay``)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Final

from protocol import CloseCode

__all__ = [
    "AGENT_VERSION",
    "EXIT_AUTH_FAILED",
    "EXIT_REPLACED",
    "AgentConfig",
    "AgentExit",
    "backoff_delay",
    "final_exit",
]

#: closed with 4000 (a newer connection of the same identity) or 4001 (bad token): the agent
#: exits with these codes instead of reconnecting
EXIT_REPLACED: Final = 3
EXIT_AUTH_FAILED: Final = 4


def _agent_version() -> str:
    try:
        return f"gemmanet-node/{version('gemmanet')}"
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "gemmanet-node/0+unknown"


AGENT_VERSION: Final = _agent_version()


class AgentExit(Exception):
    """The agent must stop and not reconnect; ``exit_code`` and a one-line ``message``."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message


@dataclass(frozen=True)
class AgentConfig:
    ws_url: str
    node_id: str
    token: str
    models: tuple[str, ...]
    max_parallel: int = 4
    vram_gb: float | None = None
    drain_s: float = 10.0
    backoff_initial_s: float = 0.5
    # --reconnect-max-s: the cap of the reconnect backoff
    backoff_max_s: float = 5.0
    connect_timeout_s: float = 10.0
    # Every coordinator it may dial, in turn (``--coordinator`` several times); empty: ws_url
    # alone. ws_url is the one being dialled.
    ws_urls: tuple[str, ...] = ()
    # Bounds the wait for Welcome after Hello, and for the peer's reply to our close frame.
    handshake_timeout_s: float = 10.0
    close_timeout_s: float = 2.0
    agent_version: str = AGENT_VERSION
    # The backend's checks (health.py): every backend_check_s while it answers, at most that
    # far apart while it does not; each bounded by backend_check_timeout_s.
    backend_check_s: float = 5.0
    backend_check_timeout_s: float = 5.0


def final_exit(close_code: int | None, node_id: str) -> AgentExit | None:
    """The exit a close code calls for (4000, 4001: never reconnect), or None to reconnect."""
    if close_code == CloseCode.REPLACED:
        return AgentExit(EXIT_REPLACED, f"replaced by a newer connection of node {node_id}")
    if close_code == CloseCode.AUTH_FAILED:
        return AgentExit(
            EXIT_AUTH_FAILED,
            f"authentication failed for node {node_id}: wrong --token, or the node was revoked"
            " (gemmanet nodes enroll gives it a new token)",
        )
    return None


def backoff_delay(attempt: int, rng: random.Random, *, initial_s: float, max_s: float) -> float:
    """Full jitter: uniform in [0, min(max_s, initial_s * 2**attempt)]."""
    ceiling = min(max_s, initial_s * math.pow(2.0, min(attempt, 64)))
    return rng.uniform(0.0, ceiling)
