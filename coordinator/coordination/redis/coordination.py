"""The Redis/Valkey coordination backend, on coredis connections under trio.

``RedisCoordination`` is the bundle (``bundle.Coordination``): one ``RedisLink`` (the
connection layer: lanes of multiplexed connections, timeouts, error mapping, and why it works
below coredis's public client; ``connect/link.py``) and one object per role on it
(``key_value.py``, ``rate_limits.py``, ``presence.py``, ``leases.py``, ``telemetry.py``,
``monitor.py``, ``pubsub.py``, ``affinity.py``).

Failure model (see ``roles.py``):

* every operation is bounded by ``op_timeout_s`` as a whole; a timeout, a refused or broken
  connection, or any Redis error surfaces as ``CoordinationUnavailable``, never a raw coredis
  exception and never a hang;
* a timed-out connection is dropped, and the next operation opens a fresh one, so the same object
  works again as soon as Redis is back;
* a command cut off by a timeout may still have run on the server (at-most-once, like the bus).

Lifecycle: connections run in a nursery owned by this object, so use it as
``async with RedisCoordination(...) as coord:`` (or ``await nursery.start(coord.run)``),
entered and exited by the same task.
"""

from __future__ import annotations

import ssl
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Self

import trio

from coordinator.coordination.base import CoordinationUnavailable, OpObserver
from coordinator.coordination.bundle import Coordination
from coordinator.coordination.redis.affinity import RedisAffinity
from coordinator.coordination.redis.connect.errors import redact_url
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.key_value import RedisKeyValue
from coordinator.coordination.redis.leases import RedisLeases
from coordinator.coordination.redis.monitor import RedisMonitor
from coordinator.coordination.redis.presence import RedisPresence
from coordinator.coordination.redis.pubsub import RedisPubSub
from coordinator.coordination.redis.rate_limits import RedisRateLimits
from coordinator.coordination.redis.telemetry import RedisTelemetry
from coordinator.errors import SettingsError

__all__ = ["RedisCoordination", "read_password_file", "redact_url"]


def read_password_file(password_file: str | None) -> str | None:
    """The file's content minus surrounding whitespace, so secrets stay out of URLs and logs."""
    if not password_file:
        return None
    try:
        return Path(password_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SettingsError(
            f"GEMMANET_REDIS_PASSWORD_FILE={password_file!r}: cannot read the file: {exc.strerror}"
        ) from None


class RedisCoordination(Coordination):
    """Every role, shared by every instance that points at the same Redis and prefix."""

    kind = "redis"

    key_value: RedisKeyValue
    rate_limits: RedisRateLimits
    presence: RedisPresence
    leases: RedisLeases
    telemetry: RedisTelemetry
    monitor: RedisMonitor
    pubsub: RedisPubSub
    affinity: RedisAffinity

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "gn",
        password: str | None = None,
        op_timeout_s: float = 1.0,
        subscription_keepalive_s: float = 5.0,
        subscription_stall_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        #: the connections every role object of this bundle shares
        self.link = link = RedisLink(
            url,
            key_prefix=key_prefix,
            password=password,
            op_timeout_s=op_timeout_s,
            ssl_context=ssl_context,
        )
        self.pubsub = RedisPubSub(
            link, keepalive_s=subscription_keepalive_s, stall_s=subscription_stall_s
        )
        self.key_value = RedisKeyValue(link)
        self.rate_limits = RedisRateLimits(link)
        self.presence = RedisPresence(link)
        self.leases = RedisLeases(link)
        self.telemetry = RedisTelemetry(link)
        self.monitor = RedisMonitor(link)
        self.affinity = RedisAffinity(link)
        self._stack: AsyncExitStack | None = None
        self._run_scope: trio.CancelScope | None = None

    @classmethod
    def from_url_and_password_file(
        cls, url: str, password_file: str | None, key_prefix: str = "gn", **kwargs: Any
    ) -> RedisCoordination:
        """Build from settings, the password read from ``password_file``."""
        password = read_password_file(password_file)
        return cls(url, key_prefix=key_prefix, password=password, **kwargs)

    def __repr__(self) -> str:
        return f"RedisCoordination(url={self.link.url!r}, key_prefix={self.link.key_prefix!r})"

    @property
    def op_observer(self) -> OpObserver | None:
        """The link's: told (what, seconds, failed) after every guarded operation."""
        return self.link.op_observer

    @op_observer.setter
    def op_observer(self, observer: OpObserver | None) -> None:
        self.link.op_observer = observer

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None or self.link.closed:
            raise RuntimeError("a RedisCoordination can be entered only once")
        stack = AsyncExitStack()
        self.link.attach(await stack.enter_async_context(trio.open_nursery()))
        self._stack = stack
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
        stack, self._stack = self._stack, None
        self.link.detach()
        if stack is not None:
            await stack.aclose()

    async def run(self, *, task_status: trio.TaskStatus[Self] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled or ``aclose``d, for ``nursery.start(coordination.run)``."""
        async with self:
            with trio.CancelScope() as self._run_scope:
                task_status.started(self)
                await trio.sleep_forever()

    async def aclose(self) -> None:
        self.link.close()
        if self._run_scope is not None:
            self._run_scope.cancel()

    async def ping(self) -> None:
        reply = await self.link.execute("PING", b"PING")
        if reply not in (b"PONG", "PONG"):
            raise CoordinationUnavailable(f"unexpected PING reply from Redis: {reply!r}")
