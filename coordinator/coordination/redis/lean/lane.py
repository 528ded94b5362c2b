"""The link's lean lane: one pipelined ``LeanPipeline`` (``publisher.py``: one writer, replies
handed back in order), opened on demand at the link's master of the moment and reopened on the
next call after a loss. The bus's PUBLISH and the hot-path scripts (the admission and the
release: ``RedisLink.run_script(..., lane="lean")``) share it, so both cost the lean client's
third of coredis's CPU per command.

A script goes as EVALSHA, and as EVAL when the server answers NOSCRIPT (a restarted or flushed
script cache), as on the coredis lanes. What the guard needs is kept: ``op.waiting_on`` names
the pipeline, so a timeout drops it unless replies still arrive (``statistics``), a cancelled
caller leaves its place in line (the command may still run: at-most-once), and a lost
connection fails every caller waiting on it (``ConnectionError``: Redis is down, not slow).
On a cluster, a MOVED reply re-points the link (``rehome``) and the call is tried once more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import trio
from coredis.connection import TCPLocation
from coredis.exceptions import MovedError, NoScriptError

from coordinator.coordination.redis.connect.operation import Droppable, Operation
from coordinator.coordination.redis.lean.connection import (
    LeanConnection,
    LeanTarget,
    encode_command,
    open_lean_connection,
)
from coordinator.coordination.redis.lean.pipeline import LeanPipeline
from coordinator.coordination.redis.scripts import LuaScript

__all__ = ["LaneHost", "LeanLane"]

T = TypeVar("T")


class LaneHost(Protocol):
    """What the lane needs of the link that holds it (``connect/link.py``)."""

    @property
    def closed(self) -> bool: ...
    @property
    def cluster(self) -> bool: ...
    async def master(self) -> TCPLocation | None: ...
    def rehome(self, home: TCPLocation | None, why: str) -> None: ...
    def require_nursery(self) -> trio.Nursery: ...
    def track(self, connection: Droppable) -> None: ...
    def untrack(self, connection: Droppable) -> None: ...


def _arg(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class LeanLane:
    """Lean connections of one link: the shared pipeline, and subscriptions' own."""

    def __init__(self, host: LaneHost, target: LeanTarget) -> None:
        self._host = host
        # As whom and with which TLS: the URL's, as the link's coredis connections.
        self._target = target
        self._pipeline: LeanPipeline | None = None
        # Where the pipeline is connected: one left on a demoted master would publish to a
        # replica's subscribers only (a replica takes PUBLISH), so it follows the link.
        self._pipeline_at: TCPLocation | None = None
        self._lock = trio.Lock()

    async def following_moved(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt``, once more after a MOVED reply (a cluster's slot moved: resharding or
        a failover), at the master the reply names."""
        try:
            return await attempt()
        except MovedError as exc:
            if not self._host.cluster:
                raise
            self._host.rehome(TCPLocation(exc.host, exc.port), "MOVED")
        return await attempt()

    async def request(self, op: Operation, command: bytes) -> Any:
        """One encoded command on the pipeline; for the link's guard to bound."""

        async def attempt() -> Any:
            pipeline = await self.pipeline()
            op.waiting_on = pipeline
            return await pipeline.request(command)

        return await self.following_moved(attempt)

    async def script(
        self, op: Operation, script: LuaScript, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """EVALSHA ``script`` on the pipeline (EVAL when the server forgot it)."""
        tail = [b"%d" % len(keys), *(key.encode() for key in keys), *map(_arg, args)]

        async def attempt() -> Any:
            pipeline = await self.pipeline()
            op.waiting_on = pipeline
            try:
                return await pipeline.request(encode_command(b"EVALSHA", script.sha, *tail))
            except NoScriptError:
                return await pipeline.request(encode_command(b"EVAL", script.source, *tail))

        return await self.following_moved(attempt)

    async def pipeline(self) -> LeanPipeline:
        """The shared pipeline, (re)opened on demand at the link's master of the moment."""
        where = await self._host.master()
        pipeline = self._pipeline
        if pipeline is not None and pipeline.usable and self._pipeline_at == where:
            return pipeline
        async with self._lock:
            where = await self._host.master()
            pipeline = self._pipeline
            if pipeline is None or not pipeline.usable or self._pipeline_at != where:
                if pipeline is not None:
                    pipeline.invalidate("the master moved")
                pipeline = LeanPipeline(await self.open_connection(where))
                await self._host.require_nursery().start(self._run, pipeline)
                self._pipeline, self._pipeline_at = pipeline, where
            return pipeline

    async def _run(self, pipeline: LeanPipeline, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            await pipeline.run(task_status=task_status)
        finally:
            self._host.untrack(pipeline.connection)

    async def open_connection(self, where: TCPLocation | None) -> LeanConnection:
        """A new lean connection at ``where`` (None: the URL's server), tracked by the link
        (closing it drops the connection); the caller bounds the time."""
        self._host.require_nursery()
        connection = await open_lean_connection(self._target.at(where))
        if self._host.closed:
            connection.invalidate("coordination closed")
        self._host.track(connection)
        return connection
