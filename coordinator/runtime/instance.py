"""One coordinator instance: its node connections, its pending tasks, and their supervision.

Local nodes are served directly from the NodeTable; every answer a node sends is checked by
the TaskTracker before it reaches the waiting request. The instance's nursery supervises the
silence watchdog and the ratings refresher.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.core.placement import NodeView, choose_node
from coordinator.core.tracker import TaskTracker, Verdict
from coordinator.errors import (
    CoordinationDown,
    GemmaNetError,
    NodeDisconnected,
    NodeFailed,
    RateLimited,
    TaskTimedOut,
    Unavailable,
)
from coordinator.runtime.node_link import NodeLink
from coordinator.runtime.task_handle import (
    ChunkEvent,
    DoneEvent,
    FailedEvent,
    TaskEvent,
    TaskHandle,
)
from coordinator.settings import Settings
from coordinator.store import Store, TaskRecord
from protocol import Assign, Cancel, Chunk, Error, Heartbeat, Hello, Result

log = logging.getLogger("gemmanet.instance")

# Close code for a node silent past its heartbeat deadline (an extension of INTERFACE.md's
# 4000-4002; the agent reconnects on it like on any other loss).
CLOSE_HEARTBEAT_TIMEOUT = 4003
CLOSE_REPLACED = 4000
# Node-reported errors that mean "not now" rather than "this task is broken".
_NODE_BUSY_CODES = {"node_busy", "node_draining"}
RATINGS_REFRESH_S = 15.0


class Instance:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        coordination: Coordination,
        *,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.instance_id = settings.instance_id
        self.store = store
        self.coordination = coordination
        self.nodes = NodeTable()
        self.tracker = TaskTracker()
        self.ratings: dict[str, tuple[float, int]] = {}
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng or random.Random()
        self._ids = random.Random(self._rng.getrandbits(64)) if rng else random.SystemRandom()
        self._links: dict[str, NodeLink] = {}
        self._waiting: dict[str, trio.MemorySendChannel[TaskEvent]] = {}
        self.started_at = wall_clock()

    # -- supervision ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._drop_silent_nodes)
            nursery.start_soon(self._refresh_ratings)
            nursery.start_soon(self._sweep_expired_tasks)
            task_status.started()

    async def _drop_silent_nodes(self) -> None:
        interval = self.settings.heartbeat_interval_s
        deadline = interval * self.settings.heartbeat_misses
        while True:
            await trio.sleep(interval)
            for conn in self.nodes.silent(self._clock(), deadline):
                log.warning("node %s silent for over %.1f s; dropping it", conn.node_id, deadline)
                self._close_link(conn.conn_id, CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout")
                # Fail its tasks now: the socket may take a while to notice it is dead.
                self.detach_node(conn)

    async def _refresh_ratings(self) -> None:
        while True:
            try:
                self.ratings = await self.store.node_ratings()
            except Exception:  # noqa: BLE001 - ratings only order placement; keep the old ones
                log.exception("could not refresh node ratings")
            await trio.sleep(RATINGS_REFRESH_S)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{self._ids.getrandbits(96):024x}"

    # -- node side --------------------------------------------------------------------------

    def attach_node(self, hello: Hello, link: NodeLink) -> NodeConnection:
        """Register an authenticated connection; an older one of the same identity gets 4000."""
        now = self._clock()
        conn = NodeConnection(
            conn_id=self.new_id("c-"),
            node_id=hello.node_id,
            models=frozenset(hello.models),
            max_parallel=hello.max_parallel,
            vram_gb=hello.vram_gb,
            agent_version=hello.agent_version,
            connected_at=self._wall_clock(),
            last_seen=now,
        )
        replaced = self.nodes.register(conn)
        self._links[conn.conn_id] = link
        if replaced is not None:
            log.info("node %s reconnected; closing its previous connection", hello.node_id)
            self._close_link(
                replaced.conn_id,
                CLOSE_REPLACED,
                f"replaced by a newer connection of node {hello.node_id}",
            )
            self._fail_tasks_of(replaced, "replaced by a newer connection")
        return conn

    def detach_node(self, conn: NodeConnection) -> None:
        """The connection is gone: forget it and fail its pending tasks at once (502)."""
        self.nodes.unregister(conn.conn_id)
        self._links.pop(conn.conn_id, None)
        self._fail_tasks_of(conn, "disconnected")

    def _fail_tasks_of(self, conn: NodeConnection, why: str) -> None:
        for task in self.tracker.fail_connection(conn.conn_id):
            self._deliver(
                task.task_id,
                FailedEvent(NodeDisconnected(f"node {conn.node_id} {why} during the task")),
            )
        conn.tasks.clear()

    def _close_link(self, conn_id: str, code: int, reason: str) -> None:
        link = self._links.get(conn_id)
        if link is not None:
            link.request_close(code, reason)

    def on_node_envelope(self, conn: NodeConnection, envelope: object) -> None:
        """An envelope arrived on ``conn``. Answers are checked against the tracker first."""
        self.nodes.touch(conn.conn_id, self._clock())
        if isinstance(envelope, Heartbeat):
            return
        if isinstance(envelope, Chunk):
            verdict, deltas = self.tracker.on_chunk(
                envelope.task_id, conn.conn_id, envelope.seq, envelope.delta
            )
            for delta in deltas:
                self._deliver(envelope.task_id, ChunkEvent(delta))
            if verdict is Verdict.OVERFLOW:
                self._finish(
                    conn,
                    envelope.task_id,
                    FailedEvent(NodeFailed(f"node {conn.node_id} sent chunks out of order")),
                )
            return
        if isinstance(envelope, Result):
            self._finish(conn, envelope.task_id, DoneEvent(envelope.output))
            return
        if isinstance(envelope, Error):
            if envelope.task_id is None:
                log.warning("node %s reports %s: %s", conn.node_id, envelope.code, envelope.message)
                return
            error: GemmaNetError
            if envelope.code in _NODE_BUSY_CODES:
                error = Unavailable(
                    f"node {conn.node_id} refused the task: {envelope.message}",
                    code="all_nodes_busy",
                )
            else:
                error = NodeFailed(
                    f"node {conn.node_id} failed the task ({envelope.code}): {envelope.message}"
                )
            self._finish(conn, envelope.task_id, FailedEvent(error))

    def _finish(self, conn: NodeConnection, task_id: str, event: TaskEvent) -> None:
        if self.tracker.on_finish(task_id, conn.conn_id) is Verdict.ACCEPTED:
            conn.tasks.discard(task_id)
            self._deliver(task_id, event)

    def _deliver(self, task_id: str, event: TaskEvent) -> None:
        channel = self._waiting.get(task_id)
        if channel is not None:
            channel.send_nowait(event)

    # -- request side -----------------------------------------------------------------------

    def node_views(self) -> list[NodeView]:
        return self.nodes.views(self.instance_id, self.ratings)

    async def check_rate_limit(self, key_id: str) -> None:
        limit, period = self.settings.rate_limit
        try:
            decision = await self.coordination.rate_limit(
                f"ratelimit:{key_id}", limit=limit, period_s=period
            )
        except CoordinationUnavailable as exc:
            raise CoordinationDown(f"coordination store unavailable: {exc}") from None
        if not decision.allowed:
            raise RateLimited(
                f"rate limit of {limit} requests per {period:g} s exceeded for this API key",
                retry_after_s=decision.retry_after_s,
            )

    def start_task(
        self, *, key_id: str, model: str, prompt: str, stream: bool, timeout_s: float | None
    ) -> TaskHandle:
        """Place a task on a node and send it there. The caller must ``end_task`` the handle
        (``open_task`` does it); a handle that is never ended is swept at its deadline."""
        timeout = min(timeout_s or self.settings.task_timeout_s, self.settings.task_timeout_s)
        view = choose_node(self.node_views(), model, rng=self._rng)
        conn = self.nodes.by_conn(view.conn_id)
        link = self._links.get(view.conn_id)
        if conn is None or link is None:  # cannot happen for local views; keep it honest
            raise NodeDisconnected(f"node {view.node_id} went away before the task was sent")
        task_id = self.new_id("t-")
        deadline = self._clock() + timeout
        send, receive = trio.open_memory_channel[TaskEvent](math.inf)
        self.tracker.open(
            task_id,
            node_id=conn.node_id,
            conn_id=conn.conn_id,
            owner_instance=self.instance_id,
            deadline=deadline,
        )
        self._waiting[task_id] = send
        conn.tasks.add(task_id)
        link.send_nowait(
            Assign(task_id=task_id, model=model, prompt=prompt, stream=stream, timeout_s=timeout)
        )
        return TaskHandle(
            task_id=task_id,
            node_id=conn.node_id,
            conn_id=conn.conn_id,
            events=receive,
            deadline=deadline,
            timeout_s=timeout,
            key_id=key_id,
            model=model,
            stream=stream,
            created_at=self._wall_clock(),
        )

    async def end_task(self, handle: TaskHandle, outcome: str) -> None:
        """The request is done with its task (``outcome``: "ok" or an error code). Cancels it
        on the node if it is still running, and records it. Idempotent."""
        if handle.outcome is not None:
            return
        handle.outcome = outcome
        self._waiting.pop(handle.task_id, None)
        if self.tracker.close(handle.task_id) is not None:
            # Nobody waits for the answer any more: free the node's slot and tell the node.
            self._cancel_on_node(handle.conn_id, handle.task_id, outcome)
        with trio.CancelScope(shield=True):
            await self._record(handle)

    def _cancel_on_node(self, conn_id: str, task_id: str, reason: str) -> None:
        conn = self.nodes.by_conn(conn_id)
        if conn is not None:
            conn.tasks.discard(task_id)
        link = self._links.get(conn_id)
        if link is not None:
            link.send_nowait(Cancel(task_id=task_id, reason=reason))

    @asynccontextmanager
    async def open_task(
        self, *, key_id: str, model: str, prompt: str, stream: bool, timeout_s: float | None
    ) -> AsyncIterator[TaskHandle]:
        """``start_task`` … ``end_task`` as a block; leaving it early cancels the task."""
        handle = self.start_task(
            key_id=key_id, model=model, prompt=prompt, stream=stream, timeout_s=timeout_s
        )
        outcome = "internal_error"
        try:
            yield handle
            outcome = "ok"
        except GemmaNetError as exc:
            outcome = exc.code
            raise
        except trio.Cancelled:
            outcome = "client_gone"
            raise
        finally:
            await self.end_task(handle, outcome)

    async def _sweep_expired_tasks(self) -> None:
        """Safety net for handles nobody ended (a client that vanished before its stream
        began): past its deadline a task fails, and the node is told to stop."""
        while True:
            await trio.sleep(1.0)
            for task in self.tracker.expired(self._clock()):
                self._deliver(task.task_id, FailedEvent(TaskTimedOut(f"task {task.task_id} timed out")))
                self._waiting.pop(task.task_id, None)
                self._cancel_on_node(task.conn_id, task.task_id, "task_timeout")

    async def _record(self, handle: TaskHandle) -> None:
        outcome = handle.outcome or "ok"
        record = TaskRecord(
            task_id=handle.task_id,
            key_id=handle.key_id,
            node_id=handle.node_id,
            model=handle.model,
            status="ok" if outcome == "ok" else "error",
            error_code=None if outcome == "ok" else outcome,
            created_at=handle.created_at,
            finished_at=self._wall_clock(),
            stream=handle.stream,
            instance_id=self.instance_id,
        )
        try:
            with trio.move_on_after(5):
                await self.store.record_task(record)
        except Exception:  # noqa: BLE001 - the client already has its answer; keep serving
            log.exception("could not record task %s", handle.task_id)

    # -- status ---------------------------------------------------------------------------

    async def cluster_status(self) -> dict[str, int]:
        return {
            "online_nodes": len(self.nodes),
            "instances": 1,
            "in_flight": len(self.tracker),
        }

    async def cluster_nodes(self) -> list[dict[str, object]]:
        infos: list[dict[str, object]] = []
        for conn in self.nodes.connections():
            mean, count = self.ratings.get(conn.node_id, (None, 0))
            infos.append(
                {
                    "node_id": conn.node_id,
                    "instance_id": self.instance_id,
                    "models": sorted(conn.models),
                    "max_parallel": conn.max_parallel,
                    "in_flight": conn.in_flight,
                    "vram_gb": conn.vram_gb,
                    "rating": mean,
                    "ratings": count,
                    "agent_version": conn.agent_version,
                    "connected_at": conn.connected_at,
                }
            )
        return infos
