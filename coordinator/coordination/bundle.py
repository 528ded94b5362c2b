"""``Coordination``: one backend's role objects, handed out as attributes, and its lifecycle.

Each attribute is one role of ``roles.py`` (the names are ``roles.ROLES``); every role object
of a backend shares that backend's one link to the store. Whoever opens the backend holds the
bundle (the server, the monitor, the audit) and hands each part of the program the role it
uses. The bundle itself is the ``Lifecycle`` role: ``ping``, ``aclose``, and an async context
manager (enter and exit it in the task that owns the app's lifetime).
"""

from __future__ import annotations

import abc
from typing import Self

from coordinator.coordination.base import OpObserver
from coordinator.coordination.roles import (
    KeyValue,
    Leases,
    MonitorStore,
    PrefixAffinity,
    Presence,
    PubSub,
    RateLimits,
    TelemetryStore,
)

__all__ = ["Coordination"]


class Coordination(abc.ABC):
    """Shared, expiring, atomic coordination state plus a message bus, one role per attribute."""

    #: short name used in logs and /api/v1/status ("memory" or "redis")
    kind: str = "abstract"
    #: told (what, seconds, failed) after each store operation (Redis; see ``OpObserver``)
    op_observer: OpObserver | None = None

    key_value: KeyValue
    rate_limits: RateLimits
    presence: Presence
    leases: Leases
    telemetry: TelemetryStore
    monitor: MonitorStore
    pubsub: PubSub
    affinity: PrefixAffinity

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise CoordinationUnavailable unless the backend answers."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release connections. Idempotent."""
